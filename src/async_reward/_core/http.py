"""HTTP for reward calls: one aiohttp session per event loop, typed errors, and the server's
"try again in ..." headers read (:func:`parse_retry_after`; ``async_reward._core.retry`` honours them).

Request headers may carry an API key, so no exception raised here quotes them: messages name the
URL without its query string or user info, and a reply that echoes a secret back (a header value,
the URL's password or a query value), in any spelling, has it redacted, from the excerpt of a failed
reply and from every string of a parsed one, so that it reaches no reason, extras or metric
(``async_reward._core.http_secrets``).

A JSON object that repeats a key is malformed: which value counts would be the parser's choice, and
a reply built by pasting text into JSON could carry a second ``score``.

Redirects are not followed: aiohttp would send our headers (the key included) to wherever the
``Location`` points, and a 307 / 308 would send the sample with its ground truth there too, and the
other host's score would count. A 3xx is an error that names the (redacted) location.

A reply body is read up to :data:`MAX_REPLY_BYTES` after decompression, so that a small gzip bomb
cannot inflate to gigabytes in a reward worker.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import re
import weakref
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp

from async_reward._core.http_secrets import excerpt, redact, redact_tree, redact_url, secrets_of

__all__ = [
    "MAX_REPLY_BYTES",
    "RETRY_AFTER_HEADERS",
    "HTTPStatusError",
    "MalformedResponseError",
    "ReplyTooLargeError",
    "close_sessions",
    "get_session",
    "parse_retry_after",
    "post_json",
]

_EXCERPT_CHARS = 200
_HEAD_CHARS = 2000
_TRANSIENT_STATUSES = frozenset({408, 409, 429})

#: The most bytes of one 2xx reply body read, counted after decompression; a larger reply is
#: :class:`ReplyTooLargeError` (status ``invalid``). A constant, not a setting: it is a bound on what
#: a broken or hostile server can make a worker hold (each call in flight may hold this much), far
#: above any reply a reward takes. The largest are a judge's with ``logprobs``: about 1.9 KB per
#: generated token at 20 alternatives, so 64 MiB holds some 35,000 tokens (``judge.max_tokens`` is
#: 512 by default); a reward service's ``score`` and extras are far smaller.
MAX_REPLY_BYTES = 64 * 1024 * 1024
_ERROR_READ_BYTES = _HEAD_CHARS * 8
"""Bytes of a non-2xx body read: enough for its redacted excerpt and head, and no more."""
_READ_CHUNK_BYTES = 64 * 1024

# Keyed by loop: an aiohttp session and its pooled connections belong to the loop that made them and
# fail (or hang) on any other. verl runs each reward worker's manager on one loop, so in production
# this holds one session per worker process; tests run a loop per test. The session refers to its
# loop, so a weak key alone would never let go: close_sessions() drops the entry, and get_session()
# drops entries whose loop has closed.
_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)


def get_session() -> aiohttp.ClientSession:
    """The running loop's shared session, created on first use. Call it from a coroutine."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        for stale in [other for other in list(_sessions) if other.is_closed()]:
            _sessions.pop(stale, None)
        # limit=0: Admission already caps calls in flight. A second, smaller cap here would queue
        # calls where admission metrics cannot see them and inside the per-call timeout, which must
        # measure the service. raise_for_status off: post_json turns statuses into typed errors.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), raise_for_status=False)
        _sessions[loop] = session
    return session


async def close_sessions() -> None:
    """Close the running loop's session, if any (for shutdown and tests)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None and not session.closed:
        await session.close()


class HTTPStatusError(Exception):
    """A reply with a non-2xx status. ``transient``: the same request may succeed later."""

    def __init__(
        self,
        status: int,
        url: str = "",
        retry_after_s: float | None = None,
        body_excerpt: str = "",
        body_head: str = "",
    ) -> None:
        # All fields in args so the exception pickles (Ray ships exceptions between processes).
        super().__init__(status, url, retry_after_s, body_excerpt, body_head)
        self.status = status
        self.url = url
        self.retry_after_s = retry_after_s
        self.body_excerpt = body_excerpt[:_EXCERPT_CHARS]
        """The start of the reply's body, short enough for a sample's reason."""
        self.body_head = (body_head or body_excerpt)[:_HEAD_CHARS]
        """More of the body (redacted as the excerpt is), for telling kinds of refusals apart: a
        server may name the field it refuses after a long preamble."""

    @property
    def transient(self) -> bool:
        """408 timeout, 409 conflict, 429 rate limited, or any 5xx."""
        return self.status in _TRANSIENT_STATUSES or self.status >= 500

    def __str__(self) -> str:
        hint = "" if self.retry_after_s is None else f" (retry after {self.retry_after_s:g} s)"
        return f"HTTP {self.status} from {self.url}{hint}: {self.body_excerpt!r}"


class MalformedResponseError(ValueError):
    """A 2xx reply whose body is not JSON, or not JSON that reads one way (a key repeated in an
    object). Not retried: upstream reports it as status ``invalid``."""


class ReplyTooLargeError(MalformedResponseError):
    """A 2xx reply whose body passes :data:`MAX_REPLY_BYTES` (status ``invalid``, not retried: the
    same server would send the same again)."""


async def post_json(
    url: str,
    payload: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    url_key: str = "the URL",
) -> tuple[Any, Mapping[str, str]]:
    """POST ``payload`` as JSON; return the parsed JSON body, secrets redacted, and the response headers.

    ``timeout_s`` bounds the whole exchange (None: the session default, aiohttp's 5 minutes).
    ``url_key`` names the setting that holds ``url``, for the fix a refused redirect states.

    Raises:
        HTTPStatusError: a non-2xx status, with ``retry_after_s`` read from the reply's headers; a
            3xx (never followed) says where it pointed and that ``url_key`` should name that place.
        MalformedResponseError: a 2xx reply whose body is not JSON, repeats a key in one of its
            objects, or (:class:`ReplyTooLargeError`) is larger than :data:`MAX_REPLY_BYTES`.
        TimeoutError: ``timeout_s`` passed (asyncio.TimeoutError is the same class on 3.11+).
        aiohttp.ClientConnectionError: the connection failed or dropped.
    """
    safe_url = redact_url(url)
    secrets = secrets_of(url, headers)
    extra: dict[str, Any] = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
    try:
        async with get_session().post(
            url, json=payload, headers=headers, allow_redirects=False, **extra
        ) as response:
            status, response_headers = response.status, response.headers
            limit = MAX_REPLY_BYTES if 200 <= status < 300 else _ERROR_READ_BYTES
            body, complete = await _read_at_most(response, 0 if 300 <= status < 400 else limit)
    except TimeoutError as exc:
        # aiohttp's total timeout carries an empty message; say what timed out, without the query.
        after = "" if timeout_s is None else f" after {timeout_s:g} s"
        raise TimeoutError(f"POST {safe_url} timed out{after} ({type(exc).__name__})") from None
    except aiohttp.ClientResponseError as exc:
        # Raised by aiohttp itself (an unparsable reply). Its request_info holds our request headers
        # and shows in repr(), so replace it with our own error.
        message = redact(f"{type(exc).__name__}: {exc.message}", secrets)
        raise HTTPStatusError(exc.status, safe_url, None, message) from None
    if 300 <= status < 400:
        raise HTTPStatusError(status, safe_url, None, _redirect_refused(response_headers, secrets, url_key))
    if not 200 <= status < 300:
        raise HTTPStatusError(
            status,
            safe_url,
            parse_retry_after(response_headers, status),
            excerpt(body, secrets, _EXCERPT_CHARS),
            excerpt(body, secrets, _HEAD_CHARS),
        )
    if not complete:
        raise ReplyTooLargeError(
            f"HTTP {status} from {safe_url}: the reply is larger than {MAX_REPLY_BYTES / (1 << 20):g} MiB, "
            "the cap on a reply body (async_reward._core.http.MAX_REPLY_BYTES); not read further"
        )
    try:
        # NaN and Infinity are read as Python reads them: each reader refuses a non-finite number
        # where it needs a finite one (a score, a logprob).
        parsed = json.loads(body, object_pairs_hook=_unique_keys)
    except _RepeatedKeyError as exc:
        key = redact(exc.key, secrets)[:60]
        raise MalformedResponseError(
            f"HTTP {status} from {safe_url}: the JSON reply repeats the key {key!r} in one object "
            "(which of its values counts is ambiguous)"
        ) from None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
        raise MalformedResponseError(
            f"HTTP {status} from {safe_url} is not JSON: {excerpt(body, secrets, _EXCERPT_CHARS)!r}"
        ) from None
    return redact_tree(parsed, secrets), response_headers


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body (decompressed, as aiohttp streams it) up to ``limit`` bytes, and whether that was all
    of it. A body cut short closes the connection: the rest is never read, nor kept in the pool."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_READ_CHUNK_BYTES):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            response.close()
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


def _redirect_refused(headers: Mapping[str, str], secrets: Iterable[str], url_key: str) -> str:
    """The reason of a refused redirect: where it pointed, without user info, query or any secret."""
    location = headers.get("Location")
    try:
        where = f"to {redact(redact_url(location), secrets)[:120]}" if location else "without a Location"
    except ValueError:  # a Location urlsplit cannot read (a broken IPv6 host)
        where = "to an unreadable Location"
    return f"redirect {where} not followed (set {url_key} to the final URL)"


class _RepeatedKeyError(ValueError):
    """A JSON object of a reply names a key twice (raised while parsing; ``key`` is that key)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if it repeats a key: ``json.loads`` would keep the last value, so a
    service that splices a response's text into its JSON (``"feedback": "<text>"``) could be made
    to send ``{"score": 0.0, "feedback": "", "score": 1.0}`` and have the injected score count."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _RepeatedKeyError(key)
            seen.add(key)
    return obj


#: Headers read for a server's "try again in ...", first found wins (names are case-insensitive):
#: milliseconds, then seconds or an HTTP-date, LiteLLM's forwarded provider headers, and, on a 429 only,
#: OpenAI-style reset durations of the limit that ran out (see :func:`parse_retry_after`).
RETRY_AFTER_HEADERS = (
    "retry-after-ms",
    "retry-after",
    "llm_provider-retry-after-ms",
    "llm_provider-retry-after",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_retry_after(headers: Mapping[str, str], status: int | None = None) -> float | None:
    """Seconds a server asks us to wait, or None if it did not say (or said something unreadable).

    Read in this order, the first readable one wins:

    * ``retry-after-ms``: milliseconds (OpenAI, Azure);
    * ``Retry-After``: seconds, or an HTTP-date (read relative to now, never negative);
    * ``llm_provider-retry-after-ms`` / ``llm_provider-retry-after``: the same, as a LiteLLM proxy
      forwards them from the provider behind it (its own 429 carries no ``Retry-After``);
    * on a 429 only (``status``; None reads them too): ``x-ratelimit-reset-requests`` /
      ``x-ratelimit-reset-tokens``, OpenAI-style durations (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``,
      or plain seconds) until that limit resets. A limit whose ``x-ratelimit-remaining-*`` is above
      zero is not what refused the call and is skipped; of the rest, the longest wait is taken.

    Callers cap the result (``retry.max_retry_after_s``).
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    for prefix in ("", "llm_provider-"):
        millis = _non_negative_number(lowered.get(f"{prefix}retry-after-ms"))
        if millis is not None:
            return millis / 1000.0
        seconds = _seconds_or_date(lowered.get(f"{prefix}retry-after"))
        if seconds is not None:
            return seconds
    if status is not None and status != 429:
        return None  # OpenAI sends the reset headers on every reply; only a 429 is about them
    resets = []
    for limit in ("requests", "tokens"):
        remaining = _non_negative_number(lowered.get(f"x-ratelimit-remaining-{limit}"))
        if remaining is not None and remaining > 0:
            continue
        reset = _duration_s(lowered.get(f"x-ratelimit-reset-{limit}"))
        if reset is not None:
            resets.append(reset)
    return max(resets) if resets else None


def _seconds_or_date(value: str | None) -> float | None:
    if value is None:
        return None
    seconds = _non_negative_number(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" means UTC with no further information (RFC 5322)
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _duration_s(value: str | None) -> float | None:
    """A Go-style duration (``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds; None if unreadable."""
    if value is None:
        return None
    text = value.strip()
    seconds = _non_negative_number(text)
    if seconds is not None:
        return seconds
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    total = sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    return total if math.isfinite(total) else None


def _non_negative_number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None
