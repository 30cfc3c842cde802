"""The rate-limit headers common servers send, read over real HTTP, and timeout reasons that say what
timed out (issue 17, item 4a and 4c).

A real aiohttp server on loopback answers the first call with a refusal carrying the headers of a
given server (LiteLLM's proxy, an OpenAI-style API) and the second with a score; the retry's wait is
taken from a recording ``sleep`` (a virtual clock: no wall-clock bound).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from async_reward._core.http import post_json
from async_reward._core.retry import retry_async
from async_reward.config import RetryConfig
from tests.conftest import compose_verl_config


@pytest.fixture
async def refusing_server() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``POST /score``: the first call refused with ``state["status"]`` and ``state["headers"]``."""
    state: dict[str, Any] = {"calls": 0, "status": 429, "headers": {}}

    async def score(request: web.Request) -> web.Response:
        state["calls"] += 1
        if state["calls"] == 1:
            return web.json_response(
                {"error": "rate limited"}, status=state["status"], headers=state["headers"]
            )
        return web.json_response({"score": 1.0})

    app = web.Application()
    app.router.add_post("/score", score)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/score", state
    await runner.cleanup()


async def waited_before_retry(url: str, max_retry_after_s: float = 600.0) -> float:
    """Seconds the retry waited after the refusal (backoff and jitter 0, so only the server's ask)."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    config = RetryConfig(
        max_attempts=2,
        initial_backoff_s=0,
        max_backoff_s=0,
        jitter_s=0,
        max_retry_after_s=max_retry_after_s,
        max_total_s=100_000,
    )
    reply, attempts = await retry_async(lambda: post_json(url, {"x": 1}, timeout_s=10), config, sleep=sleep)
    assert reply[0] == {"score": 1.0} and attempts == 2  # (body, headers)
    return waits[0]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # LiteLLM 1.106's own 429: no Retry-After, only the provider's, forwarded under its prefix.
        ({"llm_provider-retry-after": "60"}, 60.0),
        ({"llm_provider-retry-after-ms": "2500"}, 2.5),
        # OpenAI-style: the limit that ran out resets in 6 minutes; the other one is not the cause.
        (
            {
                "x-ratelimit-limit-requests": "60",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-remaining-tokens": "149000",
                "x-ratelimit-reset-tokens": "20ms",
            },
            360.0,
        ),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}, 0.02),
        ({"x-ratelimit-reset-requests": "1m30.5s", "x-ratelimit-reset-tokens": "1s"}, 90.5),
        ({"x-ratelimit-reset-requests": "2h0m0s"}, 7200.0),
    ],
)
async def test_retry_waits_as_long_as_the_server_asks(refusing_server, headers, expected):
    url, state = refusing_server
    state["headers"] = headers
    assert await waited_before_retry(url, max_retry_after_s=10_000) == pytest.approx(expected)


async def test_what_the_server_asks_is_capped_by_max_retry_after_s(refusing_server):
    url, state = refusing_server
    state["headers"] = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
    assert await waited_before_retry(url, max_retry_after_s=30) == 30.0


async def test_reset_headers_on_a_server_error_are_not_a_wait(refusing_server):
    """OpenAI sends its reset headers on every reply: a 503 is not about them (Retry-After still is)."""
    url, state = refusing_server
    state["status"] = 503
    state["headers"] = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
    assert await waited_before_retry(url) == 0.0
    state["calls"] = 0
    state["headers"] = {"llm_provider-retry-after": "4"}
    assert await waited_before_retry(url) == 4.0


# ------------------------------------------------------------------ timeout reasons (item 4c)
SLOW = """
import asyncio, time

async def slow_async(data_source, solution_str, ground_truth, extra_info, **kwargs):
    await asyncio.sleep(5)
    return 1.0

def slow_sync(data_source, solution_str, ground_truth, extra_info, **kwargs):
    time.sleep(0.6)
    return 1.0

async def own_timeout(data_source, solution_str, ground_truth, extra_info, **kwargs):
    raise TimeoutError
"""


def _manager(tmp_path: Any, tokenizer: Any, name: str, *extra: str) -> Any:
    from verl.trainer.ppo.reward import load_reward_manager

    path = tmp_path / "slow.py"
    path.write_text(SLOW)
    config = compose_verl_config(
        [
            "reward.reward_manager.name=async_rate_limited",
            "reward.num_workers=1",
            f"reward.custom_reward_function.path={path}",
            f"reward.custom_reward_function.name={name}",
            *extra,
        ]
    )
    return load_reward_manager(config, tokenizer)


@pytest.mark.parametrize(
    ("name", "extra", "reason"),
    [
        (
            "slow_async",
            ["+reward.async_reward.timeout_s=0.2", "+reward.async_reward.retry.max_attempts=1"],
            "the attempt against the service (AsyncRateLimitedRewardManager) took longer than its "
            "deadline of 0.2 s (timeout_s)",
        ),
        (
            "slow_sync",
            ["+reward.async_reward.timeout_s=0.2"],
            "the reward function took longer than its deadline of 0.2 s (timeout_s)",
        ),
        (
            "slow_async",
            [
                "+reward.async_reward.timeout_s=0.1",
                "+reward.async_reward.retry.max_total_s=0.05",
                "+reward.async_reward.retry.initial_backoff_s=0.1",
                "+reward.async_reward.retry.jitter_s=0",
            ],
            "took longer than its deadline of 0.1 s (timeout_s); retrying stopped after 1 attempt(s): "
            "the next attempt would start more than retry.max_total_s=0.05 s after the first",
        ),
        (
            "own_timeout",
            ["+reward.async_reward.retry.max_attempts=1"],
            "TimeoutError raised by the scoring code (no message)",
        ),
    ],
)
async def test_timeout_reason_names_what_timed_out_and_the_limit(
    tmp_path, tokenizer, batch_factory, name, extra, reason
):
    manager = _manager(tmp_path, tokenizer, name, *extra)
    info = (await manager.run_single(batch_factory([{"response": "x"}])))["reward_extra_info"]
    assert info["status"] == "timeout"
    assert reason in info["failure_reason"], info["failure_reason"]


async def test_admission_queueing_reason_names_admission_timeout_s(tmp_path, tokenizer, batch_factory):
    manager = _manager(
        tmp_path,
        tokenizer,
        "slow_async",
        "+reward.async_reward.limits.max_concurrency=1",
        "+reward.async_reward.timeout_s=1",
        "+reward.async_reward.admission_timeout_s=0.1",
        "+reward.async_reward.retry.max_attempts=1",
    )
    batch = batch_factory([{"response": "x"}])
    first, second = await asyncio.gather(manager.run_single(batch), manager.run_single(batch))
    reasons = sorted(r["reward_extra_info"]["failure_reason"] for r in (first, second))
    assert any("longer than admission_timeout_s=0.1 s" in r and "queued for admission" in r for r in reasons)
