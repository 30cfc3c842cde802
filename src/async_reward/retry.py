"""Retries of transient failures on tenacity, honouring a server's Retry-After up to a cap.

Only failures that may go away by themselves are retried: connection errors, timeouts, and HTTP 408,
409, 429 and 5xx. Anything else (a 400, a malformed reply, a bug) is raised at once, since trying
again would only spend budget. Cancellation is never retried nor swallowed.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import NoReturn, TypeVar

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_exponential, wait_random

from .config import RetryConfig

__all__ = [
    "RETRY_AFTER_HEADERS",
    "AttemptsExhausted",
    "TransientError",
    "default_is_transient",
    "parse_retry_after",
    "retry_async",
]

T = TypeVar("T")


class TransientError(Exception):
    """A failure worth retrying: the same call may succeed later.

    ``retry_after_s`` is the server's hint of when to try again (None: no hint).
    """

    def __init__(self, *args: object, retry_after_s: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after_s = retry_after_s


class AttemptsExhausted(Exception):
    """Every attempt failed with a transient error, or the next wait would pass ``max_total_s``."""

    def __init__(self, last_error: BaseException, attempts: int, stopped_by: str | None = None) -> None:
        # All in args so the exception pickles (Ray ships exceptions between processes).
        super().__init__(last_error, attempts, stopped_by)
        self.last_error = last_error
        self.attempts = attempts
        self.stopped_by = stopped_by
        """Why retrying stopped before ``max_attempts`` (the total time limit), or None."""

    def __str__(self) -> str:
        error = self.last_error
        why = f" ({self.stopped_by})" if self.stopped_by else ""
        return f"gave up after {self.attempts} attempt(s){why}; last error: {type(error).__name__}: {error}"


def default_is_transient(exc: BaseException) -> bool:
    """True for failures that may go away by themselves (see the module docstring)."""
    if isinstance(exc, asyncio.CancelledError):
        return False
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return False  # a certificate that fails verification will fail the same way next time
    if isinstance(exc, (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return True  # asyncio.TimeoutError is TimeoutError since 3.11
    # Imported here, not at the top: http.py imports this module for parse_retry_after.
    from .http import HTTPStatusError

    return isinstance(exc, HTTPStatusError) and exc.transient


class _WaitBackoffOrRetryAfter(wait_base):
    """Exponential backoff with jitter; a server's Retry-After, capped, when it asks for longer."""

    def __init__(self, config: RetryConfig) -> None:
        self._backoff = wait_exponential(
            multiplier=config.initial_backoff_s, exp_base=2, max=config.max_backoff_s
        ) + wait_random(0, config.jitter_s)
        self._max_retry_after_s = config.max_retry_after_s

    def __call__(self, retry_state: RetryCallState) -> float:
        backoff = self._backoff(retry_state)
        error = retry_state.outcome.exception() if retry_state.outcome is not None else None
        hint = getattr(error, "retry_after_s", None)
        if hint is None:
            return backoff
        # The hint is capped, so a server cannot park a worker for an hour; and it never shortens our
        # own backoff (the cap only bounds what the server asks for).
        return max(backoff, min(float(hint), self._max_retry_after_s))


class _StopPastDeadline(stop_base):
    """Stop when the next wait would end after the deadline (tenacity's own clock cannot be injected)."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self._deadline = deadline
        self._clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._clock() + retry_state.upcoming_sleep > self._deadline


async def retry_async(
    attempt: Callable[[], Awaitable[T]],
    config: RetryConfig,
    *,
    is_transient: Callable[[BaseException], bool] = default_is_transient,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[T, int]:
    """Run ``attempt`` until it succeeds; return ``(result, attempts used)``.

    Transient failures (``is_transient``) are retried after an exponential backoff
    ``initial_backoff_s * 2**(n-1)`` capped at ``max_backoff_s``, plus jitter in ``[0, jitter_s]``, or
    after the error's ``retry_after_s`` (capped at ``max_retry_after_s``) when that is longer.

    Raises:
        AttemptsExhausted: ``max_attempts`` transient failures, or the next wait would end more than
            ``max_total_s`` after the first attempt started.
        Exception: a non-transient error, unwrapped, with ``exc.attempts`` set to the attempts used.
        asyncio.CancelledError: at once, never retried.
    """
    attempts = 0
    started = clock()
    # A call that fails is replayed into tenacity instead of being made again, see below.
    replayed: list[BaseException] = []

    async def counted() -> T:
        nonlocal attempts
        if replayed:
            raise replayed.pop()
        attempts += 1
        return await attempt()

    def give_up(retry_state: RetryCallState) -> NoReturn:
        assert retry_state.outcome is not None
        error = retry_state.outcome.exception()
        assert error is not None
        stopped_by = None
        if attempts < config.max_attempts:
            stopped_by = (
                f"the next attempt would start more than retry.max_total_s={config.max_total_s:g} s after "
                "the first"
            )
        raise AttemptsExhausted(error, attempts, stopped_by) from error

    def should_retry(exc: BaseException) -> bool:
        # Guarded here too, so a caller's predicate cannot make us retry a cancellation.
        return not isinstance(exc, asyncio.CancelledError) and is_transient(exc)

    # Fast path: most calls succeed at once, and tenacity's per-call machinery costs about 0.3 ms,
    # as much as the rest of a manager's overhead. Only a failure enters tenacity: its first
    # outcome is replayed there, so waits, stops and counts follow one policy.
    try:
        return await counted(), attempts
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if not should_retry(exc):
            exc.attempts = attempts  # type: ignore[attr-defined]
            raise
        replayed.append(exc)

    retrying = AsyncRetrying(
        sleep=sleep,
        stop=stop_after_attempt(config.max_attempts) | _StopPastDeadline(started + config.max_total_s, clock),
        wait=_WaitBackoffOrRetryAfter(config),
        retry=retry_if_exception(should_retry),
        retry_error_callback=give_up,
    )
    try:
        result: T = await retrying(counted)
    except AttemptsExhausted:
        raise  # ours, or a nested retry's; either way it carries its own count
    except Exception as exc:
        exc.attempts = attempts  # type: ignore[attr-defined]
        raise
    return result, attempts


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
