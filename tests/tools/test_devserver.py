"""The dev server over real loopback HTTP: judge, reward service, capacity, faults, admin, CLI.

Everything here talks to a listening socket (no mocks), because the server's job is to be a faithful
peer for our HTTP clients. Timings are generous and only ever bound from above.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest

from async_reward.tools.cli import build_parser, main
from async_reward.tools.devserver import (
    RUNTIME_CONFIG_KEYS,
    DevServer,
    DevServerConfig,
    ThreadedDevServer,
    answers_match,
    extract_final_answer,
)

CHAT = "/v1/chat/completions"


def judge_prompt(response: str, reference: str | None = "42", extra: str = "") -> str:
    """A user message as our judge client builds it: blocks html-escaped (<, >, & only)."""
    parts = ["Is the response correct?"]
    if reference is not None:
        parts.append(f"<reference>{html.escape(reference, quote=False)}</reference>")
    parts.append(f"<response>{html.escape(response, quote=False)}</response>{extra}")
    return "\n".join(parts)


def chat_body(response: str, reference: str | None = "42", extra: str = "") -> dict[str, Any]:
    return {
        "model": "judge-test",
        "messages": [
            {"role": "system", "content": "You are a strict grader."},
            {"role": "user", "content": judge_prompt(response, reference, extra)},
        ],
        "temperature": 0.0,
        "max_tokens": 64,
    }


async def chat_content(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> str:
    async with session.post(url + CHAT, json=body) as resp:
        assert resp.status == 200, await resp.text()
        payload = await resp.json()
    return payload["choices"][0]["message"]["content"]


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(DevServerConfig(retry_after_s=0.5)) as srv:
        yield srv


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


# -- pure judging rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("we get 3 apples and 1,234 pears", "1234"),
        ("the temperature fell to -7.5 degrees", "-7.5"),
        ("\\boxed{x} and later 99", "x"),  # a box wins over a later number
        ("no answer here", None),
    ],
)
def test_extract_final_answer(text: str, expected: str | None) -> None:
    assert extract_final_answer(text) == expected


def test_answers_match_compares_numbers_numerically_and_text_stripped() -> None:
    assert answers_match("3.0", "3")
    assert answers_match("1234", "1,234")
    assert answers_match(" Paris ", "Paris")
    assert not answers_match("3", "4")
    assert not answers_match("paris", "Paris")
    assert not answers_match(None, "3")


def test_config_repr_hides_api_key() -> None:
    config = DevServerConfig(api_key="sk-very-secret")
    assert "sk-very-secret" not in repr(config)
    with pytest.raises(ValueError, match="fault kinds"):
        DevServer(DevServerConfig(fault_rates={"418": 0.1}))


# -- the judge endpoint ---------------------------------------------------------------------------


async def test_official_openai_client_parses_completion(server: DevServer) -> None:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        body = chat_body("I think it is \\boxed{42}")
        completion = await client.chat.completions.create(
            model="judge-test", messages=body["messages"], temperature=0.0, max_tokens=64
        )
    content = completion.choices[0].message.content
    assert content is not None and content.endswith("Rating: [[10]]")
    assert completion.model == "judge-test"
    assert completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "stop"
    prompt_words = sum(len(m["content"].split()) for m in body["messages"])
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == prompt_words
    assert completion.usage.completion_tokens == len(content.split())
    assert completion.usage.total_tokens == prompt_words + len(content.split())
    assert server.stats["tokens_total"] == completion.usage.total_tokens


@pytest.mark.parametrize(
    ("response", "reference", "verdict"),
    [
        ("The answer is \\boxed{42}.", "42", 10),
        ("The answer is \\boxed{41}.", "42", 0),
        ("First 7, then 1,000 in total", "1000", 10),
        ("It is 42.0", "42", 10),
        ("x < 3 && y > 2 so \\boxed{x<3}", "x<3", 10),  # survives the client's html escaping
        ("I cannot tell", "42", 0),
    ],
)
async def test_judge_verdict_follows_final_answer(
    server: DevServer, session: aiohttp.ClientSession, response: str, reference: str, verdict: int
) -> None:
    content = await chat_content(session, server.url, chat_body(response, reference))
    assert content.endswith(f"Rating: [[{verdict}]]")


async def test_rubric_and_missing_blocks(server: DevServer, session: aiohttp.ClientSession) -> None:
    words = " ".join(["word"] * 23)
    assert (await chat_content(session, server.url, chat_body(words, reference=None))).endswith("[[4]]")
    long = " ".join(["word"] * 200)
    assert (await chat_content(session, server.url, chat_body(long, reference=None))).endswith("[[10]]")
    bare = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    content = await chat_content(session, server.url, bare)
    assert content.endswith("[[0]]") and "nothing to judge" in content


@pytest.mark.parametrize(
    ("verdict_format", "correct_tail", "wrong_tail"),
    [
        ("brackets", "Rating: [[10]]", "Rating: [[0]]"),
        ("boxed", "\\boxed{10}", "\\boxed{0}"),
        ("score", "Score: 10", "Score: 0"),
    ],
)
async def test_verdict_formats(
    server: DevServer, session: aiohttp.ClientSession, verdict_format: str, correct_tail: str, wrong_tail: str
) -> None:
    server.update_config(verdict_format=verdict_format)
    assert (await chat_content(session, server.url, chat_body("\\boxed{42}"))).endswith(correct_tail)
    assert (await chat_content(session, server.url, chat_body("\\boxed{5}"))).endswith(wrong_tail)


async def test_json_verdict_format(server: DevServer, session: aiohttp.ClientSession) -> None:
    server.update_config(verdict_format="json")
    verdict = json.loads(await chat_content(session, server.url, chat_body("\\boxed{42}")))
    assert verdict["score"] == 10 and verdict["reason"]
    assert json.loads(await chat_content(session, server.url, chat_body("13")))["score"] == 0


async def test_think_decoy_and_echo_put_the_real_verdict_last(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    server.update_config(think=True, echo_response=True)
    response = "Some say [[10]] and Score: 10, but I answer \\boxed{7}"
    content = await chat_content(session, server.url, chat_body(response, "42"))
    assert content.startswith("<think>")
    think, _, rest = content.partition("</think>")
    assert "Score: 10 [[10]]" in think  # the decoy differs from the real verdict
    assert response in rest  # quoted verbatim, html-unescaped
    assert rest.index(response) < rest.index("Rating: [[0]]")
    assert content.endswith("Rating: [[0]]")


async def test_bad_chat_request_is_400(server: DevServer, session: aiohttp.ClientSession) -> None:
    async with session.post(server.url + CHAT, json={"model": "m"}) as resp:
        assert resp.status == 400
        assert "messages" in (await resp.json())["error"]["message"]


# -- the reward service ---------------------------------------------------------------------------


async def test_score_endpoint(server: DevServer, session: aiohttp.ClientSession) -> None:
    sample = {"index": 0, "uid": "u", "data_source": "gsm8k", "prompt": "2*21?", "extra_info": {}}
    async with session.post(
        server.url + "/score", json={**sample, "response": "#### 42", "ground_truth": "42"}
    ) as r:
        assert r.status == 200
        assert await r.json() == {"score": 1.0, "acc": 1.0, "pred": "42"}
    async with session.post(
        server.url + "/score", json={**sample, "response": "\\boxed{8}", "ground_truth": "42"}
    ) as r:
        assert await r.json() == {"score": 0.0, "acc": 0.0, "pred": "8"}
    async with session.post(
        server.url + "/score", json={**sample, "response": "none", "ground_truth": "42"}
    ) as r:
        assert await r.json() == {"score": 0.0, "acc": 0.0, "pred": ""}
    async with session.post(server.url + "/score", json={**sample, "ground_truth": "42"}) as r:
        assert r.status == 400
        assert "response" in (await r.json())["error"]["message"]


# -- auth -----------------------------------------------------------------------------------------


async def test_api_key_required(session: aiohttp.ClientSession) -> None:
    async with DevServer(DevServerConfig(api_key="sk-test-123")) as srv:
        body = chat_body("\\boxed{42}")
        async with session.post(srv.url + CHAT, json=body) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        wrong = {"Authorization": "Bearer sk-test-124"}
        async with session.post(srv.url + CHAT, json=body, headers=wrong) as resp:
            assert resp.status == 401
        async with session.get(srv.url + "/admin/stats") as resp:
            assert resp.status == 401
        right = {"Authorization": "Bearer sk-test-123"}
        async with session.post(srv.url + CHAT, json=body, headers=right) as resp:
            assert resp.status == 200
        async with session.get(srv.url + "/health") as resp:
            assert resp.status == 200  # probes need no key
        assert srv.stats["responses_by_status"] == {"401": 2, "200": 1}


async def test_api_key_can_be_set_at_runtime_and_is_never_echoed(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    async with session.post(server.url + "/admin/config", json={"api_key": "sk-runtime-9"}) as resp:
        assert resp.status == 200
        text = await resp.text()
    assert "sk-runtime-9" not in text and json.loads(text)["api_key_set"] is True
    async with session.post(server.url + "/score", json={"response": "1", "ground_truth": "1"}) as resp:
        assert resp.status == 401
    headers = {"Authorization": "Bearer sk-runtime-9"}
    async with session.post(server.url + "/admin/config", json={"api_key": None}, headers=headers) as resp:
        assert resp.status == 200
    async with session.post(server.url + "/score", json={"response": "1", "ground_truth": "1"}) as resp:
        assert resp.status == 200


# -- capacity -------------------------------------------------------------------------------------


async def _wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _concurrent_statuses(
    session: aiohttp.ClientSession, url: str, n: int
) -> list[tuple[int, dict[str, str]]]:
    async def one(i: int) -> tuple[int, dict[str, str]]:
        async with session.post(url + CHAT, json=chat_body(f"answer {i}")) as resp:
            await resp.read()
            return resp.status, dict(resp.headers)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_capacity_queue_never_exceeds_capacity(session: aiohttp.ClientSession) -> None:
    # ``hold`` keeps every request inside until all 9 have arrived: the counts are then fixed by the
    # capacity code, not by whether the 9th request arrived before the 1st one's latency ran out.
    async with DevServer(DevServerConfig(capacity=3, hold=True)) as srv:
        requests = asyncio.ensure_future(_concurrent_statuses(session, srv.url, 9))
        await _wait_until(lambda: srv.stats["in_flight_total"] == 9)
        assert (srv.stats["in_flight"], srv.stats["held"]) == (3, 3)  # the other 6 queue for a slot
        srv.update_config(hold=False)
        results = await requests
        assert [status for status, _ in results] == [200] * 9
        stats = srv.stats
        assert stats["max_in_flight"] == 3
        assert stats["max_in_flight_total"] == 9  # the others really queued
        assert stats["in_flight"] == 0 and stats["in_flight_total"] == 0

        # Control: the same load without a cap goes over 3, so the assertion above can fail.
        srv.update_config(capacity=None, hold=True)
        srv.reset()
        requests = asyncio.ensure_future(_concurrent_statuses(session, srv.url, 9))
        await _wait_until(lambda: srv.stats["held"] == 9)
        srv.update_config(hold=False)
        await requests
        assert srv.stats["max_in_flight"] == 9


async def test_capacity_reject_answers_429_with_retry_after(session: aiohttp.ClientSession) -> None:
    config = DevServerConfig(capacity=1, overflow="reject", retry_after_s=0.5, hold=True)
    async with DevServer(config) as srv:
        # The first request holds the only slot (held) while the other two arrive: both find it taken.
        first = asyncio.ensure_future(_concurrent_statuses(session, srv.url, 1))
        await _wait_until(lambda: srv.stats["held"] == 1)
        rejected = await _concurrent_statuses(session, srv.url, 2)
        srv.update_config(hold=False)
        results = [*await first, *rejected]
        statuses = sorted(status for status, _ in results)
        assert statuses == [200, 429, 429]
        for status, headers in results:
            if status == 429:
                assert headers["Retry-After"] == "1"  # whole seconds, rounded up
                assert headers["retry-after-ms"] == "500"
        assert srv.stats["overflow_rejected"] == 2


async def test_hold_keeps_every_answer_back_until_released(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    """``hold`` is the tests' gate for "the judge has answered nothing yet": requests inside wait,
    counted, whatever their kind (a fault too), and all go on when it is turned off."""
    server.update_config(hold=True)
    bodies = [chat_body("\\boxed{42}"), chat_body("\\boxed{41}"), chat_body("x", extra=" @@fault:500@@")]
    replies = [asyncio.ensure_future(session.post(server.url + CHAT, json=body)) for body in bodies]
    score = asyncio.ensure_future(
        session.post(server.url + "/score", json={"response": "3", "ground_truth": "3"})
    )
    await _wait_until(lambda: server.stats["held"] == 4)
    stats = server.stats
    assert stats["in_flight_total"] == 4 and stats["responses_by_status"] == {}
    assert not any(reply.done() for reply in [*replies, score])
    # Waiting longer changes nothing: only the switch releases them.
    await asyncio.sleep(0.2)
    assert server.stats["held"] == 4 and not any(reply.done() for reply in [*replies, score])

    server.update_config(hold=False)
    responses = await asyncio.gather(*replies, score)
    assert [response.status for response in responses] == [200, 200, 500, 200]
    assert (await responses[0].json())["choices"][0]["message"]["content"].endswith("[[10]]")
    assert (await responses[1].json())["choices"][0]["message"]["content"].endswith("[[0]]")
    assert (await responses[3].json())["score"] == 1.0
    for response in responses:
        response.release()
    assert (server.stats["held"], server.stats["in_flight_total"]) == (0, 0)
    # Off, nothing waits.
    assert (await chat_content(session, server.url, chat_body("\\boxed{42}"))).endswith("[[10]]")


async def test_a_held_request_whose_client_gives_up_leaves(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    server.update_config(hold=True)
    leaving = asyncio.ensure_future(session.post(server.url + CHAT, json=chat_body("\\boxed{42}")))
    await _wait_until(lambda: server.stats["held"] == 1)
    leaving.cancel()  # the client closes its connection
    await _wait_until(lambda: server.stats["in_flight_total"] == 0)
    assert server.stats["held"] == 0 and server.stats["responses_by_status"] == {}


async def test_a_hold_of_n_answers_the_next_n_requests_then_holds_the_rest(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    """``hold: n`` lets n answers through and holds the later ones; set again, it counts from then and
    releases the oldest held first: a test can let exactly the answers it needs through."""

    async def score(i: int) -> float:
        async with session.post(
            server.url + "/score", json={"response": str(i), "ground_truth": "2"}
        ) as resp:
            assert resp.status == 200
            return (await resp.json())["score"]

    server.update_config(hold=2)
    assert [await score(i) for i in (1, 2)] == [0.0, 1.0]  # the two let through, one after the other
    held = []
    for i in (3, 4):  # each held before the next is sent: held in this order
        held.append(asyncio.ensure_future(score(i)))
        await _wait_until(lambda i=i: server.stats["held"] == i - 2)
    server.update_config(latency_ms=[0.0, 0.0])  # another knob leaves the hold as it is
    assert server.stats["held"] == 2
    server.update_config(hold=1)  # one more: the oldest held
    await asyncio.wait_for(held[0], 30)
    assert server.stats["held"] == 1 and not held[1].done()
    server.update_config(hold=False)
    await asyncio.wait_for(held[1], 30)
    assert server.stats["held"] == 0 and server.stats["responses_by_status"] == {"200": 4}


async def test_hold_is_a_runtime_switch_of_true_false_or_a_count(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    for wrong in ("yes", -1, 1.5):
        async with session.post(server.url + "/admin/config", json={"hold": wrong}) as resp:
            assert resp.status == 400
            assert "hold must be true, false or an integer >= 0" in (await resp.json())["error"]["message"]
    with pytest.raises(ValueError, match="hold must be"):
        DevServerConfig(hold=-2).validate()
    async with session.post(server.url + "/admin/config", json={"hold": True}) as resp:
        assert resp.status == 200 and (await resp.json())["hold"] is True
    held = asyncio.ensure_future(session.post(server.url + "/score", json={"response": "1"}))
    await _wait_until(lambda: server.stats["held"] == 1)
    async with session.post(server.url + "/admin/config", json={"hold": False}) as resp:
        assert resp.status == 200  # /admin answers while requests are held
    async with await held as resp:
        assert resp.status == 200


# -- fault injection ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["429", "500", "503", "400"])
async def test_status_fault_markers(server: DevServer, session: aiohttp.ClientSession, kind: str) -> None:
    body = chat_body("\\boxed{42}", extra=f" @@fault:{kind}@@")
    for _ in range(2):  # without :N, every request carrying the marker fails
        async with session.post(server.url + CHAT, json=body) as resp:
            assert resp.status == int(kind)
            assert "injected" in (await resp.json())["error"]["message"]
            assert ("Retry-After" in resp.headers) == (kind == "429")
    assert server.stats["faults_injected"] == {kind: 2}


async def test_malformed_fault_is_not_json(server: DevServer, session: aiohttp.ClientSession) -> None:
    body = chat_body("\\boxed{42}", extra=" @@fault:malformed@@")
    async with session.post(server.url + CHAT, json=body) as resp:
        assert resp.status == 200
        text = await resp.text()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


async def test_drop_fault_disconnects(server: DevServer, session: aiohttp.ClientSession) -> None:
    body = chat_body("\\boxed{42}", extra=" @@fault:drop@@")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with session.post(server.url + CHAT, json=body) as resp:
            await resp.read()
    assert server.stats["faults_injected"] == {"drop": 1}
    # The server itself is fine afterwards.
    assert (await chat_content(session, server.url, chat_body("\\boxed{42}"))).endswith("[[10]]")


async def test_hang_fault_times_out_client_and_server_still_stops_quickly(
    session: aiohttp.ClientSession,
) -> None:
    srv = DevServer(DevServerConfig(capacity=1))
    await srv.start()
    body = chat_body("\\boxed{42}", extra=" @@fault:hang@@")
    pending: asyncio.Future[Any] | None = None
    try:
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(srv.url + CHAT, json=body, timeout=aiohttp.ClientTimeout(total=0.5)):
                pass
        # The hang ends once its client is gone, so it stops counting as in flight.
        await _wait_until(lambda: srv.stats["in_flight_total"] == 0)
        # A hang holds no capacity slot: a normal request still gets through capacity=1.
        pending = asyncio.ensure_future(session.post(srv.url + CHAT, json=body))
        await _wait_until(lambda: srv.stats["in_flight_total"] == 1)
        assert (await chat_content(session, srv.url, chat_body("\\boxed{42}"))).endswith("[[10]]")
        assert srv.stats["faults_injected"] == {"hang": 2}
    finally:
        started = time.monotonic()
        await srv.stop()
        stop_s = time.monotonic() - started
        outcomes = await asyncio.gather(*([pending] if pending else []), return_exceptions=True)
    # stop() cancelled the hanging request instead of waiting for it: the causal proof is the outcome
    # below (cut off, not answered); the bound only guards against a stop that waits for the client's
    # 30 s timeout (stop's own waits add up to 4 s: 2 s for the tasks, 2 s for the runner).
    assert stop_s < 20.0
    assert len(outcomes) == 1 and isinstance(outcomes[0], aiohttp.ClientError)  # cut off, not answered


async def test_counted_marker_fails_exactly_n_times(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    body = chat_body("\\boxed{42}", extra=" @@fault:503:2@@")
    statuses = []
    for _ in range(4):
        async with session.post(server.url + CHAT, json=body) as resp:
            statuses.append(resp.status)
    assert statuses == [503, 503, 200, 200]
    # Counted per exact body: a different body with the same marker starts its own count.
    other = chat_body("\\boxed{41}", extra=" @@fault:503:2@@")
    async with session.post(server.url + CHAT, json=other) as resp:
        assert resp.status == 503


async def test_unknown_marker_kind_is_400(server: DevServer, session: aiohttp.ClientSession) -> None:
    body = chat_body("x", extra=" @@fault:teapot@@")
    async with session.post(server.url + CHAT, json=body) as resp:
        assert resp.status == 400
        assert "teapot" in (await resp.json())["error"]["message"]


async def _fault_sequence(session: aiohttp.ClientSession, url: str, n: int = 40) -> list[int]:
    statuses = []
    for i in range(n):
        async with session.post(url + "/score", json={"response": str(i), "ground_truth": "1"}) as resp:
            await resp.read()
            statuses.append(resp.status)
    return statuses


async def test_seeded_fault_rates_are_reproducible(session: aiohttp.ClientSession) -> None:
    def config(seed: int) -> DevServerConfig:
        return DevServerConfig(fault_rates={"500": 0.3, "429": 0.2}, seed=seed, retry_after_s=0.1)

    async with DevServer(config(7)) as srv:
        first = await _fault_sequence(session, srv.url)
        srv.reset()  # reseeds: the run replays exactly
        assert await _fault_sequence(session, srv.url) == first
        faults = srv.stats["faults_injected"]
    assert {200, 429, 500} <= set(first)
    assert faults == {"500": first.count(500), "429": first.count(429)}
    async with DevServer(config(7)) as srv:
        assert await _fault_sequence(session, srv.url) == first
    async with DevServer(config(8)) as srv:
        assert await _fault_sequence(session, srv.url) != first


# -- admin ----------------------------------------------------------------------------------------


async def test_admin_config_rejects_unknown_keys_and_applies_known_ones(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    async with session.post(server.url + "/admin/config", json={"latency": [1, 2]}) as resp:
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
    assert "latency" in message
    assert all(key in message for key in RUNTIME_CONFIG_KEYS)
    async with session.post(server.url + "/admin/config", json={"capacity": 0}) as resp:
        assert resp.status == 400
    async with session.post(server.url + "/admin/config", json={"verdict_format": "score"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["verdict_format"] == "score"
    assert (await chat_content(session, server.url, chat_body("\\boxed{42}"))).endswith("Score: 10")


@pytest.mark.parametrize(
    "body",
    [
        '{"retry_after_s": NaN}',  # every 429 would then fail: its Retry-After is math.ceil of it
        '{"retry_after_s": Infinity}',
        '{"latency_ms": [0, Infinity]}',  # a request would sleep for ever, holding its slot
        '{"latency_ms": [NaN, 1]}',
        '{"repeat_penalty": Infinity}',
    ],
)
async def test_admin_config_refuses_non_finite_timings(
    server: DevServer, session: aiohttp.ClientSession, body: str
) -> None:
    """JSON's NaN and Infinity parse (Python's json reads them): the config must refuse them itself."""
    before = server.config
    headers = {"Content-Type": "application/json"}
    async with session.post(server.url + "/admin/config", data=body, headers=headers) as resp:
        assert resp.status == 400
        assert "finite" in (await resp.json())["error"]["message"]
    assert server.config == before


async def test_admin_stats_and_reset(server: DevServer, session: aiohttp.ClientSession) -> None:
    before = time.time()
    body = chat_body("\\boxed{42}", extra=" @@fault:500:1@@")
    for _ in range(2):
        async with session.post(server.url + CHAT, json=body) as resp:
            await resp.read()
    async with session.get(server.url + "/admin/stats") as resp:
        stats = await resp.json()
    assert stats["requests_total"] == 2
    assert stats["requests_by_path"] == {CHAT: 2}
    assert stats["responses_by_status"] == {"500": 1, "200": 1}
    assert stats["faults_injected"] == {"500": 1}
    assert stats["tokens_total"] > 0
    assert len(stats["request_times"]) == 2 and all(t >= before - 1 for t in stats["request_times"])
    async with session.post(server.url + "/admin/reset") as resp:
        assert resp.status == 200
    async with session.get(server.url + "/admin/stats") as resp:
        stats = await resp.json()
    assert stats["requests_total"] == 0 and stats["request_times"] == [] and stats["tokens_total"] == 0
    async with session.post(server.url + CHAT, json=body) as resp:
        assert resp.status == 500  # marker counts were reset too


async def test_a_request_from_before_a_reset_is_not_counted_after_it(
    server: DevServer, session: aiohttp.ClientSession
) -> None:
    """A reset between a request's arrival and its answer (the test before was still being served):
    the counters after the reset count neither its arrival nor its outcome, so they agree with each
    other and with what the clients since the reset spent."""
    server.update_config(hold=True)
    bodies = [chat_body("\\boxed{42}"), chat_body("x", extra=" @@fault:500@@")]
    early = [asyncio.ensure_future(session.post(server.url + CHAT, json=body)) for body in bodies]
    await _wait_until(lambda: server.stats["held"] == 2)
    server.reset()
    server.update_config(hold=False)
    responses = await asyncio.gather(*early)
    assert [response.status for response in responses] == [200, 500]  # they were still answered
    for response in responses:
        response.release()
    stats = server.stats
    assert stats["requests_total"] == 0 and stats["tokens_total"] == 0
    assert stats["responses_by_status"] == {} and stats["faults_injected"] == {}
    # A request after the reset counts in full, its tokens those its client was told.
    async with session.post(server.url + CHAT, json=bodies[0]) as resp:
        usage = (await resp.json())["usage"]
    stats = server.stats
    assert stats["requests_total"] == 1 and stats["responses_by_status"] == {"200": 1}
    assert stats["tokens_total"] == usage["total_tokens"] > 0


async def test_health(server: DevServer, session: aiohttp.ClientSession) -> None:
    async with session.get(server.url + "/health") as resp:
        assert await resp.json() == {"status": "ok"}
    assert server.stats["requests_total"] == 0  # probes are not service traffic


# -- threaded server and CLI ----------------------------------------------------------------------


def _post_json(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_threaded_server_serves_sync_code() -> None:
    with ThreadedDevServer(DevServerConfig(verdict_format="boxed")) as srv:
        url = srv.url
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}
        status, reply = _post_json(url + "/score", {"response": "\\boxed{3}", "ground_truth": "3"})
        assert (status, reply["score"]) == (200, 1.0)
        _, completion = _post_json(url + CHAT, chat_body("\\boxed{42}"))
        assert completion["choices"][0]["message"]["content"].endswith("\\boxed{10}")
        assert srv.stats()["requests_total"] == 2
        srv.update_config(verdict_format="score")
        _, completion = _post_json(url + CHAT, chat_body("\\boxed{42}"))
        assert completion["choices"][0]["message"]["content"].endswith("Score: 10")
        with pytest.raises(ValueError, match="valid keys"):
            srv.update_config(nonsense=1)
        srv.reset()
        assert srv.stats()["requests_total"] == 0
        thread = srv._thread
    assert thread is not None and not thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/health", timeout=2)


def test_cli_parser_rejects_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "0", "--latency-ms", "5", "10", "--fault", "429=0.1", "--fault", "drop=0.05"]
    )
    assert args.latency_ms == [5.0, 10.0] and args.fault == [("429", 0.1), ("drop", 0.05)]
    monkeypatch.delenv("ASYNC_REWARD_TEST_UNSET_KEY", raising=False)
    for argv in (
        ["serve", "--api-key-env", "ASYNC_REWARD_TEST_UNSET_KEY"],
        ["serve", "--fault", "teapot=0.1"],
        ["serve", "--fault", "500=0.7", "--fault", "503=0.7"],
        ["serve", "--api-key", "sk-on-the-command-line"],
        [],
    ):
        with pytest.raises(SystemExit) as exc_info:
            main(argv)
        assert exc_info.value.code == 2


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@pytest.mark.subprocess
def test_cli_serve_subprocess() -> None:
    env = {**os.environ, "ASYNC_REWARD_TEST_KEY": "sk-cli-secret", "PYTHONUNBUFFERED": "1"}
    argv = ["serve", "--port", "0", "--api-key-env", "ASYNC_REWARD_TEST_KEY", "--verdict-format", "score"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "async_reward_cli", *argv],  # the console script's entry point
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    output: list[str] = []
    try:
        deadline = time.monotonic() + 240  # generous: importing the package may pull in verl
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                output.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            match = re.search(r"listening on (http://\S+)", output[-1])
            url = match.group(1) if match else None
        assert url is not None, "".join(output)
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}
        request = urllib.request.Request(
            url + CHAT,
            data=json.dumps(chat_body("\\boxed{42}")).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-cli-secret"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read())["choices"][0]["message"]["content"].endswith("Score: 10")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        reader.join(timeout=5)
        assert proc.stdout is not None
        proc.stdout.close()
    while not lines.empty():
        output.append(lines.get())
    assert proc.returncode == 0, "".join(output)  # SIGTERM is a clean stop
    assert "sk-cli-secret" not in "".join(output)


def test_the_shared_servers_reset_puts_every_runtime_knob_back(judge_server: ThreadedDevServer) -> None:
    """The session's server (``conftest.judge_server``) is reset before each test that asks for ``server``:
    every knob a test may turn must come back, or it leaks into the tests after it."""
    from tests.conftest import judge_server_config, reset_judge_server

    turned = {
        "latency_ms": [5.0, 9.0],
        "capacity": 3,
        "overflow": "reject",
        "retry_after_s": 0.25,
        "fault_rates": {"500": 0.5},
        "verdict_format": "json",
        "think": True,
        "think_style": "separate",
        "echo_response": True,
        "judge_style": "verdict-then-quote",
        "fixed_verdict": 7,
        "structured_output": "reject",
        "unescaped_json": True,
        "honour_max_tokens": False,
        "api_key": "test-key-not-secret",
        "hold": True,
        "logprobs": "ignore",
        "verdict_probability": 0.5,
        "verdict_probability_low": 0.25,
        "logprobs_end_token": "<|im_end|>",
        "logprobs_digits": "split",
        "logprobs_space_share": 0.25,
        "verdict_distribution": {"9": 0.5, "10": 0.5},
        "repeat_penalty": 1.1,
        "group_position_bonus": 3,
    }
    assert set(turned) == set(RUNTIME_CONFIG_KEYS), "turn every runtime knob, a new one included"
    judge_server.update_config(**turned)
    start = judge_server_config()
    assert all(getattr(judge_server.server.config, key) != getattr(start, key) for key in turned)
    reset_judge_server(judge_server)
    assert judge_server.server.config == start
    assert judge_server.stats()["requests_total"] == 0
