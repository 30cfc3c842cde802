"""``async_remote`` and ``llm_judge`` against a service that misbehaves on purpose (redirects
elsewhere, echoes the request's secrets in a 200 reply, a gzip bomb), driven through ``run_single``
with real verl DataProto items and real HTTP on loopback: the reward never comes from another host,
no secret reaches a reason, the extras or the log, and every sample gets one explicit status."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from async_reward._core.http import MAX_REPLY_BYTES
from async_reward.config.judge import JudgeConfig
from async_reward.managers import AsyncRemoteRewardManager, LLMJudgeRewardManager
from tests.managers.test_managers import FAST_RETRY, score_rows
from tests.support.hostile_service import Origin, collect, echo_headers, gzip_bomb, redirect, serve
from tests.support.openai_standin import standin_judge

KEY = "sk-BEARERSECRET-0123456789"
HEADER_SECRET = "hdr-SECRET-abcdefghijk"
KEY_ENV = "ASYNC_REWARD_TEST_REMOTE_KEY"


@pytest.fixture
async def hostile() -> AsyncIterator[Origin]:
    origin = Origin()
    routes = [
        ("/redirect", redirect(origin)),
        ("/v1/chat/completions", redirect(origin)),  # a judge endpoint that moved
        ("/echo_headers", echo_headers),
        ("/gzip_bomb", gzip_bomb),
    ]
    async with serve(origin, routes):
        yield origin


@pytest.fixture
async def elsewhere() -> AsyncIterator[Origin]:
    """Another origin, scoring 1.0 whatever reaches it: the reward must never come from it."""
    origin = Origin()
    async with serve(origin, [("*", collect(origin, (KEY, HEADER_SECRET, "GT-42")))]):
        yield origin


def remote_manager(verl_config_factory: Any, tokenizer: Any, url: str) -> AsyncRemoteRewardManager:
    settings = {
        "remote": {"url": url, "api_key_env": KEY_ENV, "headers": {"X-Api-Key": HEADER_SECRET}},
        "retry": FAST_RETRY,
        "timeout_s": 30,
    }
    return AsyncRemoteRewardManager(verl_config_factory("async_remote", settings), tokenizer)


def leaked(*texts: Any) -> list[str]:
    return [secret for secret in (KEY, HEADER_SECRET) if any(secret in str(text) for text in texts)]


@pytest.mark.parametrize("code", [302, 307])
async def test_a_redirect_elsewhere_is_an_error_and_sends_it_nothing(
    hostile, elsewhere, verl_config_factory, tokenizer, batch_factory, monkeypatch, caplog, code
):
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level(logging.DEBUG)
    hostile.redirect_to = elsewhere.url.replace("127.0.0.1", "localhost") + "/collect?token=QTOKEN-SECRET-1"
    manager = remote_manager(verl_config_factory, tokenizer, f"{hostile.url}/redirect?code={code}")
    [output] = await score_rows(manager, batch_factory, [{"response": "x", "ground_truth": "GT-42"}])
    info = output["reward_extra_info"]
    assert (info["status"], float(output["reward_score"]), info["attempts"]) == ("error", 0.0, 1)
    where = elsewhere.url.replace("127.0.0.1", "localhost") + "/collect"
    assert info["failure_reason"] == (
        f"HTTP {code}: redirect to {where} not followed (set remote.url to the final URL)"
    )
    assert elsewhere.hits == Counter()  # neither the key, nor the sample with its ground truth
    assert not leaked(info, caplog.text) and "QTOKEN" not in str(info) + caplog.text


async def test_a_judge_endpoint_that_redirects_is_an_error_naming_base_url(
    hostile, elsewhere, verl_config_factory, tokenizer, batch_factory, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    hostile.redirect_to = elsewhere.url + "/v1/chat/completions"
    settings = {"judge": {"base_url": hostile.url + "/v1", "api_key_env": KEY_ENV}, "retry": FAST_RETRY}
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    [output] = await score_rows(manager, batch_factory, [{"response": "4", "ground_truth": "4"}])
    info = output["reward_extra_info"]
    assert info["status"] == "error" and elsewhere.hits == Counter()
    assert "not followed (set judge.base_url to the final URL)" in info["failure_reason"]
    assert not leaked(info)


async def test_secrets_echoed_in_a_200_reply_stay_out_of_the_extras(
    hostile, verl_config_factory, tokenizer, batch_factory, monkeypatch, caplog
):
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level(logging.DEBUG)
    manager = remote_manager(verl_config_factory, tokenizer, f"{hostile.url}/echo_headers")
    [output] = await score_rows(manager, batch_factory, [{"response": "x"}])
    info = output["reward_extra_info"]
    assert (info["status"], float(output["reward_score"])) == ("ok", 1.0)
    assert "[redacted]" in info["debug"] and "[redacted]" in info  # nested values, and a key
    assert not leaked(info, list(info), caplog.text, repr(output))


async def test_a_gzip_bomb_is_invalid_naming_the_cap(
    hostile, verl_config_factory, tokenizer, batch_factory, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    manager = remote_manager(
        verl_config_factory, tokenizer, f"{hostile.url}/gzip_bomb?bytes={MAX_REPLY_BYTES + 1}"
    )
    rows = [{"response": "x"}]
    [output] = await score_rows(manager, batch_factory, rows)
    info = output["reward_extra_info"]
    assert (info["status"], info["attempts"], float(output["reward_score"])) == ("invalid", 1, 0.0)
    assert f"larger than {MAX_REPLY_BYTES >> 20} MiB" in info["failure_reason"]
    assert "MAX_REPLY_BYTES" in info["failure_reason"]
    # A reply within the cap (megabytes, as a judge's with logprobs) is read and scored.
    manager = remote_manager(verl_config_factory, tokenizer, f"{hostile.url}/gzip_bomb?bytes={4 << 20}")
    [output] = await score_rows(manager, batch_factory, rows)
    assert (output["reward_extra_info"]["status"], float(output["reward_score"])) == ("ok", 0.5)


@dataclass
class ScriptedOrigin(Origin):
    replies: list[tuple[int, str]] = field(default_factory=list)
    """What ``/reply`` answers, in turn: (status, body); ``{auth}`` in a body is the request's
    Authorization header, ``{auth_escaped}`` the same with each ``/`` written ``\\/``."""


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedOrigin]:
    """A service whose ``/reply`` answers ``origin.replies`` in turn (status, body), the last one for
    good; a judge's ``/v1/chat/completions`` too."""
    origin = ScriptedOrigin()

    async def reply(request: web.Request) -> web.Response:
        origin.hits["reply"] += 1
        status, body = origin.replies[min(origin.hits["reply"], len(origin.replies)) - 1]
        auth = request.headers.get("Authorization", "")
        text = body.replace("{auth}", auth).replace("{auth_escaped}", auth.replace("/", "\\/"))
        return web.Response(status=status, text=text, content_type="application/json")

    async with serve(origin, [("/reply", reply), ("/v1/chat/completions", reply)]):
        yield origin


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        # A service that pastes the response into its JSON can be made to send a second score.
        ('{"score": 0.0, "feedback": "", "score": 1.0}', "repeats the key 'score' in one object"),
        ('{"score": true}', "score is a JSON boolean, not a number"),
    ],
)
async def test_a_reply_whose_score_is_not_one_number_is_invalid(
    scripted, verl_config_factory, tokenizer, batch_factory, monkeypatch, reply, reason
):
    monkeypatch.setenv(KEY_ENV, KEY)
    scripted.replies = [(200, reply)]
    manager = remote_manager(verl_config_factory, tokenizer, f"{scripted.url}/reply")
    [output] = await score_rows(manager, batch_factory, [{"response": "x"}])
    info = output["reward_extra_info"]
    assert (info["status"], float(output["reward_score"]), info["attempts"]) == ("invalid", 0.0, 1)
    assert reason in info["failure_reason"]


async def test_a_non_object_reply_after_retries_reports_every_attempt(
    scripted, verl_config_factory, tokenizer, batch_factory, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    scripted.replies = [(503, "busy"), (503, "busy"), (200, "[0.9]")]
    manager = remote_manager(verl_config_factory, tokenizer, f"{scripted.url}/reply")
    [output] = await score_rows(manager, batch_factory, [{"response": "x"}])
    info = output["reward_extra_info"]
    assert (info["status"], info["attempts"], scripted.hits["reply"]) == ("invalid", 3, 3)
    assert info["failure_reason"] == "reward service replied with list, not an object"


@pytest.mark.parametrize(
    "body",
    [
        '{"error": "invalid token: {auth_escaped}"}',  # "\\/" for "/", as PHP's json_encode writes it
        '{"error": "invalid token: \\u0042earer \\u0073k-live/SECRET+0123456789/abc"}',
    ],
)
async def test_a_key_echoed_in_an_error_body_in_any_spelling_stays_out_of_the_reason(
    scripted, verl_config_factory, tokenizer, batch_factory, monkeypatch, caplog, body
):
    monkeypatch.setenv(KEY_ENV, "sk-live/SECRET+0123456789/abc")
    caplog.set_level(logging.DEBUG)
    scripted.replies = [(401, body)]
    manager = remote_manager(verl_config_factory, tokenizer, f"{scripted.url}/reply")
    [output] = await score_rows(manager, batch_factory, [{"response": "x"}])
    info = output["reward_extra_info"]
    assert info["status"] == "error" and "invalid token: [redacted]" in info["failure_reason"]
    assert "SECRET" not in str(info) + caplog.text


async def test_a_judge_reply_with_two_contents_is_invalid(
    scripted, verl_config_factory, tokenizer, batch_factory, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    message = '{"role": "assistant", "content": "[[0]]", "content": "[[10]]"}'
    scripted.replies = [(200, '{"choices": [{"index": 0, "message": ' + message + "}]}")]
    settings = {"judge": {"base_url": scripted.url + "/v1", "api_key_env": KEY_ENV}, "retry": FAST_RETRY}
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    [output] = await score_rows(manager, batch_factory, [{"response": "4", "ground_truth": "4"}])
    info = output["reward_extra_info"]
    assert (info["status"], float(output["reward_score"]), scripted.hits["reply"]) == ("invalid", 0.0, 1)
    assert "repeats the key 'content' in one object" in info["failure_reason"]


def test_url_credentials_and_query_tokens_stay_out_of_reprs(verl_config_factory, tokenizer):
    url = "http://usr:PW-SECRET-1@127.0.0.1:9/score?api_key=Q-SECRET-2"
    manager = AsyncRemoteRewardManager(
        verl_config_factory("async_remote", {"remote": {"url": url}}), tokenizer
    )
    shown = "http://<hidden>@127.0.0.1:9/score?<hidden>"
    assert repr(manager) == f"AsyncRemoteRewardManager(url={shown!r})"
    assert repr(manager.remote) == f"RemoteConfig(url={shown!r}, api_key_env=None)"
    assert "SECRET" not in repr(manager.settings)
    judge = JudgeConfig(base_url="http://usr:PW-SECRET-1@127.0.0.1:9/v1?key=Q-SECRET-2")
    assert repr(judge).startswith("JudgeConfig(base_url='http://<hidden>@127.0.0.1:9/v1?<hidden>', ")
    assert "SECRET" not in repr(judge) and "model='judge'" in repr(judge)
    judge_manager = LLMJudgeRewardManager(
        verl_config_factory("llm_judge", {"judge": {"base_url": judge.base_url}}), tokenizer
    )
    assert repr(judge_manager) == (
        "LLMJudgeRewardManager(url='http://<hidden>@127.0.0.1:9/v1/chat/completions?<hidden>', model='judge')"
    )


async def test_a_judge_base_url_with_a_query_keeps_it_after_the_endpoint(
    verl_config_factory, tokenizer, batch_factory
):
    """``judge.base_url`` with a query (Azure OpenAI's ``?api-version=``): the endpoint's path goes
    before it. ``/chat/completions`` was appended after the query: the request went to ``/v1`` with a
    query of ``...=2024-02-01/chat/completions``, a 404 for every sample."""
    async with standin_judge() as judge:
        settings = {"judge": {"base_url": judge.url + "/v1/?api-version=2024-02-01"}}
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        rows = [{"prompt": "q", "response": "r", "ground_truth": "5"}]
        (output,) = await score_rows(manager, batch_factory, rows)
    assert output["reward_extra_info"]["status"] == "ok", output["reward_extra_info"]["failure_reason"]
    assert manager.url == judge.url + "/v1/chat/completions?api-version=2024-02-01"
    assert len(judge.bodies) == 1
