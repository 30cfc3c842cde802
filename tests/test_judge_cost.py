"""What judging cost (issue 29, item 4): each sample carries what its own calls spent, so a sum over
the samples of a step is what the job paid, checked against the judge server's own count over real
HTTP; the step's ``reward/cost/*`` metrics; prices; and usage a judge server could get wrong."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from async_reward import ConfigError
from async_reward.cost import JudgePricing, cost_metrics, spent_extras
from async_reward.managers import LLMJudgeRewardManager
from async_reward.reward_metrics import extras_metrics
from tests.test_managers import chat_requests, judge_settings, score_rows

PRICES = {"prompt_price_per_million": 3.0, "completion_price_per_million": 15.0}


def infos(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [output["reward_extra_info"] for output in outputs]


async def test_the_samples_cost_sums_to_what_the_judge_server_counted(
    server, verl_config_factory, tokenizer, batch_factory
):
    """Distinct requests, identical ones in flight (one call shared) and, with the cache, a verdict
    reused later: the tokens summed over samples equal the server's, the calls equal its requests,
    and the money follows the prices."""
    server.update_config(latency_ms=[100.0, 100.0])
    settings = judge_settings(server, judge={"cache": True, **PRICES})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    distinct = [{"prompt": f"q{i}", "response": f"The answer is {i}", "ground_truth": "3"} for i in range(3)]
    twins = [{"prompt": "q", "response": "The answer is 5", "ground_truth": "5"}] * 4
    first = await score_rows(manager, batch_factory, distinct + twins)
    later = await score_rows(manager, batch_factory, twins[:2])  # cached now
    rows = infos(first + later)
    assert [row["status"] for row in rows] == ["ok"] * 9
    metrics = extras_metrics(rows)
    stats = server.stats()
    assert metrics["reward/cost/tokens"] == stats["tokens_total"] > 0
    assert (
        metrics["reward/cost/prompt_tokens"] + metrics["reward/cost/completion_tokens"]
        == stats["tokens_total"]
    )
    assert metrics["reward/cost/calls"] == chat_requests(server) == 4  # 3 distinct + 1 for the twins
    assert metrics["reward/cost/shared"] == 3  # the other twins in flight
    assert metrics["reward/cost/cache_hits"] == 2
    expected = (
        3.0 * metrics["reward/cost/prompt_tokens"] + 15.0 * metrics["reward/cost/completion_tokens"]
    ) / 1e6
    assert math.isclose(metrics["reward/cost/money"], expected)
    assert sum(row["judge_cost"] for row in rows) == pytest.approx(expected)
    for row in rows:  # a sample that made no call spent nothing
        if row["judge_shared"] or row["judge_cache_hit"]:
            assert row["attempts"] == 0 and row["judge_tokens"] == 0 and row["judge_cost"] == 0.0


async def test_a_refused_verdict_keeps_the_tokens_its_reply_spent(
    server, verl_config_factory, tokenizer, batch_factory
):
    """``max_tokens=1`` cuts every reply (finish_reason ``length``): the verdict is refused
    (``invalid``), but the judge was paid for the reply, and the cost says so."""
    settings = judge_settings(server, judge={"max_tokens": 1})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    rows = [{"prompt": f"q{i}", "response": f"The answer is {i}", "ground_truth": "3"} for i in range(3)]
    outputs = infos(await score_rows(manager, batch_factory, rows))
    assert [row["status"] for row in outputs] == ["invalid"] * 3, [r["failure_reason"] for r in outputs]
    assert all(row["judge_prompt_tokens"] > 0 and row["judge_completion_tokens"] == 1 for row in outputs)
    assert "judge_cost" not in outputs[0]  # no prices set: no money figure
    metrics = extras_metrics(outputs)
    assert metrics["reward/cost/tokens"] == server.stats()["tokens_total"]
    assert "reward/cost/money" not in metrics


async def test_a_call_that_fails_without_a_reply_counts_as_calls_with_no_tokens(
    server, verl_config_factory, tokenizer, batch_factory
):
    settings = judge_settings(server, judge=PRICES, retry={"max_attempts": 2})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    rows = [{"prompt": "q", "response": "The answer is 5 @@fault:500@@", "ground_truth": "5"}]
    (info,) = infos(await score_rows(manager, batch_factory, rows))
    assert info["status"] == "error" and info["attempts"] == 2
    assert info["judge_tokens"] == 0 and info["judge_cost"] == 0.0
    metrics = extras_metrics([info])
    assert metrics["reward/cost/calls"] == 2 and metrics["reward/retries"] == 1
    assert metrics["reward/cost/money"] == 0.0


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}, (10, 2, 12)),
        ({"prompt_tokens": 10, "completion_tokens": 2}, (10, 2, 12)),  # no total: the sum
        ({"prompt_tokens": -5, "completion_tokens": 2}, (0, 2, 2)),  # a negative count is no count
        ({"prompt_tokens": True, "completion_tokens": 2.5}, (0, 0, 0)),  # not integers
        ({"prompt_tokens": "9", "completion_tokens": None}, (0, 0, 0)),
        ("not a mapping", (0, 0, 0)),
        (None, (0, 0, 0)),
    ],
)
def test_usage_a_server_gets_wrong_never_makes_a_negative_or_made_up_cost(usage, expected):
    extras = spent_extras(usage, JudgePricing(1.0, 1.0))
    got = (extras["judge_prompt_tokens"], extras["judge_completion_tokens"], extras["judge_tokens"])
    assert got == expected
    assert extras["judge_cost"] == (expected[0] + expected[1]) / 1e6


def test_cost_metrics_read_the_arrays_verl_stacks_extras_into():
    """verl hands extras back as numpy scalars (and floats where a column mixed types)."""
    rows = [
        {
            "attempts": np.int64(2),
            "judge_prompt_tokens": np.int64(7),
            "judge_completion_tokens": np.float64(3.0),
            "judge_tokens": np.int64(10),
            "judge_cache_hit": np.bool_(False),
            "judge_shared": np.bool_(False),
            "judge_cost": np.float64(0.5),
        },
        {
            "attempts": np.int64(0),
            "judge_prompt_tokens": np.int64(0),
            "judge_completion_tokens": np.float64(0.0),
            "judge_tokens": np.int64(0),
            "judge_cache_hit": np.bool_(True),
            "judge_shared": np.bool_(False),
            "judge_cost": np.float64(0.0),
        },
    ]
    assert cost_metrics(rows) == {
        "reward/cost/calls": 2.0,
        "reward/cost/shared": 0.0,
        "reward/cost/prompt_tokens": 7.0,
        "reward/cost/completion_tokens": 3.0,
        "reward/cost/tokens": 10.0,
        "reward/cost/cache_hits": 1.0,
        "reward/cost/money": 0.5,
    }
    # A manager without judge tokens (a function, a reward service): calls only.
    assert cost_metrics([{"attempts": 1}, {"attempts": 3}]) == {
        "reward/cost/calls": 4.0,
        "reward/cost/shared": 0.0,
    }


def test_one_price_alone_is_refused_at_start_up_naming_the_other(verl_config_factory, tokenizer):
    settings = {"judge": {"base_url": "http://127.0.0.1:9/v1", "prompt_price_per_million": 3.0}}
    with pytest.raises(ConfigError, match="completion_price_per_million too") as caught:
        LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    assert caught.value.key == "reward.async_reward.judge.prompt_price_per_million"
