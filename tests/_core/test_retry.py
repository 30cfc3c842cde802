"""retry_async on tenacity: what is retried, how long it waits, when it gives up. Nothing sleeps for real."""

from __future__ import annotations

import asyncio
import pickle
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import pytest

from async_reward._core.http import HTTPStatusError, MalformedResponseError, parse_retry_after
from async_reward._core.retry import (
    AttemptsExhausted,
    TransientError,
    default_is_transient,
    retry_async,
)
from async_reward.config import RetryConfig


class FakeTime:
    """A clock and a sleep that advances it and records each wait."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def failing(*errors: BaseException, result: str = "ok") -> tuple[Callable[[], Awaitable[str]], list[int]]:
    """An attempt that raises ``errors`` in turn, then returns ``result``; and its call counter."""
    calls = [0]

    async def attempt() -> str:
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return result

    return attempt, calls


def config(**overrides: float) -> RetryConfig:
    values: dict = {"max_attempts": 4, "initial_backoff_s": 1.0, "max_backoff_s": 8.0, "jitter_s": 0.0}
    values.update(overrides)
    return RetryConfig(**values)


async def test_transient_then_success_returns_attempts() -> None:
    fake = FakeTime()
    attempt, calls = failing(TransientError("flaky"), HTTPStatusError(503))
    assert await retry_async(attempt, config(), sleep=fake.sleep, clock=fake.clock) == ("ok", 3)
    assert calls[0] == 3 and fake.waits == [1.0, 2.0]


async def test_first_try_success_uses_one_attempt() -> None:
    attempt, _ = failing()
    assert await retry_async(attempt, config(), sleep=FakeTime().sleep) == ("ok", 1)


@pytest.mark.parametrize(
    "error", [HTTPStatusError(400), HTTPStatusError(404), ValueError("bad"), KeyError("x")]
)
async def test_non_transient_raises_at_once_unwrapped(error: Exception) -> None:
    fake = FakeTime()
    attempt, calls = failing(error)
    with pytest.raises(type(error)) as info:
        await retry_async(attempt, config(), sleep=fake.sleep, clock=fake.clock)
    assert info.value is error and info.value.attempts == 1  # type: ignore[attr-defined]
    assert calls[0] == 1 and fake.waits == []


async def test_non_transient_after_retries_reports_all_attempts() -> None:
    attempt, _ = failing(HTTPStatusError(503), HTTPStatusError(401))
    with pytest.raises(HTTPStatusError) as info:
        await retry_async(attempt, config(), sleep=FakeTime().sleep)
    assert info.value.status == 401 and info.value.attempts == 2  # type: ignore[attr-defined]


async def test_retry_after_is_honoured_and_capped() -> None:
    fake = FakeTime()
    attempt, _ = failing(
        HTTPStatusError(429, retry_after_s=7.0),  # longer than the 1 s backoff: wait 7
        TransientError(retry_after_s=0.5),  # shorter than the 2 s backoff: the backoff stands
        HTTPStatusError(503, retry_after_s=3600.0),  # capped at max_retry_after_s
    )
    cfg = config(max_retry_after_s=30.0, max_total_s=10_000.0)
    assert await retry_async(attempt, cfg, sleep=fake.sleep, clock=fake.clock) == ("ok", 4)
    assert fake.waits == [7.0, 2.0, 30.0]


async def test_backoff_doubles_then_caps() -> None:
    fake = FakeTime()
    errors = [TransientError(str(i)) for i in range(5)]
    attempt, _ = failing(*errors)
    cfg = config(max_attempts=6, initial_backoff_s=1.0, max_backoff_s=5.0, max_total_s=10_000.0)
    assert await retry_async(attempt, cfg, sleep=fake.sleep, clock=fake.clock) == ("ok", 6)
    assert fake.waits == [1.0, 2.0, 4.0, 5.0, 5.0]


async def test_jitter_stays_in_bounds() -> None:
    random.seed(1234)
    fake = FakeTime()
    attempt, _ = failing(*[TransientError() for _ in range(39)])
    cfg = config(max_attempts=40, initial_backoff_s=0.25, max_backoff_s=1.0, jitter_s=0.5, max_total_s=1e6)
    await retry_async(attempt, cfg, sleep=fake.sleep, clock=fake.clock)
    for n, wait in enumerate(fake.waits, start=1):
        base = min(0.25 * 2 ** (n - 1), 1.0)
        assert base <= wait <= base + 0.5
    extras = [w - 1.0 for w in fake.waits[3:]]
    assert max(extras) - min(extras) > 0.25  # the jitter is really spread over its range


async def test_exhausted_attempts_raise_attempts_exhausted() -> None:
    fake = FakeTime()
    errors = [HTTPStatusError(500 + i) for i in range(3)]
    attempt, calls = failing(*errors)
    with pytest.raises(AttemptsExhausted) as info:
        await retry_async(attempt, config(max_attempts=3), sleep=fake.sleep, clock=fake.clock)
    assert info.value.attempts == 3 == calls[0]
    assert info.value.last_error is errors[-1] and info.value.__cause__ is errors[-1]
    assert fake.waits == [1.0, 2.0]  # no wait after the last attempt
    assert "3 attempt(s)" in str(info.value) and "HTTP 502" in str(info.value)


async def test_max_total_s_stops_before_a_wait_that_would_pass_it() -> None:
    fake = FakeTime()
    calls = 0

    async def slow_failure() -> None:
        nonlocal calls
        calls += 1
        fake.now += 1.0  # each attempt takes a second
        raise TimeoutError

    # t=1 fails, wait 4 -> t=5 (<= 10) ok; t=6 fails, wait 8 -> t=14 > 10: give up after 2 attempts.
    cfg = config(max_attempts=10, initial_backoff_s=4.0, max_backoff_s=100.0, max_total_s=10.0)
    with pytest.raises(AttemptsExhausted) as info:
        await retry_async(slow_failure, cfg, sleep=fake.sleep, clock=fake.clock)
    assert info.value.attempts == 2 == calls and fake.waits == [4.0]


async def test_cancelled_error_propagates_and_is_not_retried() -> None:
    fake = FakeTime()
    attempt, calls = failing(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await retry_async(attempt, config(), is_transient=lambda e: True, sleep=fake.sleep)
    assert calls[0] == 1 and fake.waits == []


async def test_cancelling_the_caller_stops_at_once() -> None:
    started = asyncio.Event()
    calls = 0

    async def hangs() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(retry_async(hangs, config(), sleep=FakeTime().sleep))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


async def test_cancel_during_backoff_propagates() -> None:
    async def cancelled_sleep(seconds: float) -> None:
        raise asyncio.CancelledError

    attempt, calls = failing(TransientError())
    with pytest.raises(asyncio.CancelledError):
        await retry_async(attempt, config(), sleep=cancelled_sleep)
    assert calls[0] == 1


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (TransientError(), True),
        (TimeoutError(), True),
        (aiohttp.ServerTimeoutError(), True),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), True),
        (aiohttp.ClientPayloadError("truncated"), True),
        (HTTPStatusError(408), True),
        (HTTPStatusError(409), True),
        (HTTPStatusError(429), True),
        (HTTPStatusError(500), True),
        (HTTPStatusError(503), True),
        (HTTPStatusError(400), False),
        (HTTPStatusError(401), False),
        (HTTPStatusError(404), False),
        (MalformedResponseError("not json"), False),
        (ValueError(), False),
        (asyncio.CancelledError(), False),
    ],
)
def test_default_is_transient(error: BaseException, transient: bool) -> None:
    assert default_is_transient(error) is transient


def test_errors_survive_pickling() -> None:
    exhausted = pickle.loads(
        pickle.dumps(AttemptsExhausted(HTTPStatusError(503, "http://x/y", 2.0, "busy"), 4))
    )
    assert exhausted.attempts == 4 and exhausted.last_error.retry_after_s == 2.0
    transient = pickle.loads(pickle.dumps(TransientError("later", retry_after_s=1.5)))
    assert (str(transient), transient.retry_after_s) == ("later", 1.5)


def _http_date(delta_s: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=delta_s), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"RETRY-AFTER": " 0 "}, 0.0),
        ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
        ({"Retry-After-Ms": "1500"}, 1.5),
        ({"retry-after-ms": "junk", "Retry-After": "3"}, 3.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": ""}, None),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"retry-after-ms": "-1"}, None),
        ({"Retry-After": "Wed, 99 Foo 2015 07:28:00 GMT"}, None),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # in the past: retry now
        ({"Retry-After": _http_date(-30)}, 0.0),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date_in_the_future() -> None:
    seconds = parse_retry_after({"Retry-After": _http_date(120)})
    assert seconds is not None and 110 <= seconds <= 120
