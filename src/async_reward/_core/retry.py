"""Retries of transient failures on tenacity, honouring a server's Retry-After up to a cap.

Only failures that may go away by themselves are retried: connection errors, timeouts, and HTTP 408,
409, 429 and 5xx. Anything else (a 400, a malformed reply, a bug, a scorer that killed its process)
is raised at once, since trying again would only spend budget. Cancellation is never retried nor
swallowed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import BrokenExecutor
from typing import NoReturn, Protocol, TypeVar

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_exponential, wait_random

from async_reward._core.http import HTTPStatusError

__all__ = [
    "AttemptsExhausted",
    "TransientError",
    "default_is_transient",
    "retry_async",
]


class RetrySettings(Protocol):
    """What the retry loop reads of a ``retry`` section (:class:`async_reward.config.RetryConfig` is
    one); a protocol so that this primitive knows nothing of configuration."""

    max_attempts: int
    initial_backoff_s: float
    max_backoff_s: float
    jitter_s: float
    max_retry_after_s: float
    max_total_s: float


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
    if isinstance(exc, BrokenExecutor):
        # A scorer process that died (the function pool already reran the call alone once): another
        # attempt would kill a process again, and in a shared pool fail every call in flight with it.
        return False
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return False  # a certificate that fails verification will fail the same way next time
    if isinstance(exc, (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return True  # asyncio.TimeoutError is TimeoutError since 3.11
    return isinstance(exc, HTTPStatusError) and exc.transient


class _WaitBackoffOrRetryAfter(wait_base):
    """Exponential backoff with jitter; a server's Retry-After, capped, when it asks for longer."""

    def __init__(self, config: RetrySettings) -> None:
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
    config: RetrySettings,
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
