"""``judge.parser: structured`` against a server that refuses ``response_format`` json_schema (issue
42, item 18): llama-cpp-python's server answers HTTP 500 with a validation error, which was retried
as a transient failure (4 calls a row) and reported as the raw body. Over real HTTP to a stand-in
that answers as that server does (tests/support/openai_standin.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from async_reward.managers import LLMJudgeRewardManager
from tests.managers.test_managers import FAST_RETRY, score_rows
from tests.support.openai_standin import standin_judge

ROWS = [
    {"prompt": f"What is {i}+1?", "response": f"It is {i + 1}", "ground_truth": str(i + 1)} for i in range(5)
]


def manager_for(url: str, verl_config_factory: Any, tokenizer: Any, parser: str = "structured") -> Any:
    settings = {"judge": {"base_url": url + "/v1", "parser": parser}, "retry": dict(FAST_RETRY)}
    return LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)


async def test_a_llama_cpp_refusal_is_said_once_and_never_retried(
    verl_config_factory: Any, tokenizer: Any, batch_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with standin_judge(llama_cpp=True) as judge:
        manager = manager_for(judge.url, verl_config_factory, tokenizer)
        with caplog.at_level(logging.ERROR):
            outputs = await score_rows(manager, batch_factory, ROWS)
        assert len(judge.bodies) == len(ROWS)  # one call a row: a refusal is not retried
    for output in outputs:
        info = output["reward_extra_info"]
        assert info["status"] == "error" and info["attempts"] == 1, info
        assert info["failure_reason"].startswith(
            "StructuredOutputUnsupported: server refuses structured output"
        ), info["failure_reason"]
        assert "judge.parser=structured" in info["failure_reason"]
        assert float(output["reward_score"]) == manager.settings.fallback_score
    said = [r for r in caplog.records if "server refuses structured output" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "ERROR"  # once, not once per sample


async def test_the_same_server_judges_a_text_parser_and_a_json_object(
    verl_config_factory: Any, tokenizer: Any, batch_factory: Any
) -> None:
    """Not hollow: the stand-in refuses only what llama-cpp-python refuses."""
    async with standin_judge(llama_cpp=True) as judge:
        manager = manager_for(judge.url, verl_config_factory, tokenizer, parser="brackets")
        outputs = await score_rows(manager, batch_factory, ROWS[:2])
    assert [o["reward_extra_info"]["status"] for o in outputs] == ["ok", "ok"]
    assert all("response_format" not in body for body in judge.bodies)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "CUDA error: out of memory"),  # a server fault: transient
        (503, "the engine is overloaded while compiling the response_format grammar"),  # busy, not a refusal
        (502, "upstream returned: 1 validation error: response_format"),  # a gateway's: transient
    ],
)
async def test_other_server_errors_are_still_retried(
    verl_config_factory: Any, tokenizer: Any, batch_factory: Any, status: int, message: str
) -> None:
    async with standin_judge(fail_with=(status, message)) as judge:
        manager = manager_for(judge.url, verl_config_factory, tokenizer)
        (output,) = await score_rows(manager, batch_factory, ROWS[:1])
        assert len(judge.bodies) == FAST_RETRY["max_attempts"]
    info = output["reward_extra_info"]
    assert info["status"] == "error" and info["attempts"] == FAST_RETRY["max_attempts"]
    assert "server refuses structured output" not in info["failure_reason"]


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "response_format json_schema is not supported by this model"),
        (422, "Unsupported response_format type: json_schema"),
        (500, "Invalid value for response_format: json_schema is not implemented"),
        (501, "json_schema: structured output not implemented"),
    ],
)
async def test_a_refusal_in_other_words_is_recognised(
    verl_config_factory: Any, tokenizer: Any, batch_factory: Any, status: int, message: str
) -> None:
    async with standin_judge(fail_with=(status, message)) as judge:
        manager = manager_for(judge.url, verl_config_factory, tokenizer)
        (output,) = await score_rows(manager, batch_factory, ROWS[:1])
        assert len(judge.bodies) == 1
    info = output["reward_extra_info"]
    assert info["status"] == "error" and info["attempts"] == 1
    assert info["failure_reason"].startswith("StructuredOutputUnsupported: server refuses structured output")
