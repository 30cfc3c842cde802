"""HTTP for reward calls: one aiohttp session per event loop, typed errors, and the server's
"try again in ..." headers read (:func:`parse_retry_after`; ``async_reward._core.retry`` honours them).

Request headers may carry an API key, so no exception raised here quotes them: messages name the
URL without its query string or user info, and a reply that echoes a header value back has that
value redacted from the excerpt we keep.
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
from urllib.parse import urlsplit, urlunsplit

import aiohttp

__all__ = [
    "RETRY_AFTER_HEADERS",
    "HTTPStatusError",
    "MalformedResponseError",
    "close_sessions",
    "get_session",
    "parse_retry_after",
    "post_json",
]

_EXCERPT_CHARS = 200
_HEAD_CHARS = 2000
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_PLAIN_HEADERS = frozenset({"accept", "accept-encoding", "content-type", "user-agent"})
"""Request headers that never hold a secret; every other header's value is redacted from excerpts."""

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
    """A 2xx reply whose body is not JSON. Not retried: upstream reports it as status ``invalid``."""


async def post_json(
    url: str,
    payload: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> tuple[Any, Mapping[str, str]]:
    """POST ``payload`` as JSON; return the parsed JSON body and the response headers.

    ``timeout_s`` bounds the whole exchange (None: the session default, aiohttp's 5 minutes).

    Raises:
        HTTPStatusError: a non-2xx status, with ``retry_after_s`` read from the reply's headers.
        MalformedResponseError: a 2xx reply whose body is not JSON.
        TimeoutError: ``timeout_s`` passed (asyncio.TimeoutError is the same class on 3.11+).
        aiohttp.ClientConnectionError: the connection failed or dropped.
    """
    safe_url = _redact_url(url)
    secrets = [value for name, value in (headers or {}).items() if name.lower() not in _PLAIN_HEADERS]
    extra: dict[str, Any] = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
    try:
        async with get_session().post(url, json=payload, headers=headers, **extra) as response:
            body = await response.read()
            status, response_headers = response.status, response.headers
    except TimeoutError as exc:
        # aiohttp's total timeout carries an empty message; say what timed out, without the query.
        after = "" if timeout_s is None else f" after {timeout_s:g} s"
        raise TimeoutError(f"POST {safe_url} timed out{after} ({type(exc).__name__})") from None
    except aiohttp.ClientResponseError as exc:
        # Raised by aiohttp itself (a redirect loop, an unparsable reply). Its request_info holds our
        # request headers and shows in repr(), so replace it with our own error.
        excerpt = _redact(f"{type(exc).__name__}: {exc.message}", secrets)
        raise HTTPStatusError(exc.status, safe_url, None, excerpt) from None
    if not 200 <= status < 300:
        raise HTTPStatusError(
            status,
            safe_url,
            parse_retry_after(response_headers, status),
            _excerpt(body, secrets),
            _excerpt(body, secrets, _HEAD_CHARS),
        )
    try:
        parsed = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
        raise MalformedResponseError(
            f"HTTP {status} from {safe_url} is not JSON: {_excerpt(body, secrets)!r}"
        ) from None
    return parsed, response_headers


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # drop user:password@
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _excerpt(body: bytes, secrets: Iterable[str], chars: int = _EXCERPT_CHARS) -> str:
    # Decode more than we keep, so a secret straddling the cut is still found and redacted.
    text = body[: chars * 8].decode("utf-8", errors="replace")
    return _redact(text, secrets)[:chars]


def _redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        # The whole header value, and its last word (the token of "Bearer <token>").
        for secret in {value, value.rsplit(" ", 1)[-1]}:
            if len(secret) >= 8:
                text = text.replace(secret, "[redacted]")
    return text


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
