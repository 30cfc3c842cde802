"""What judging cost (issue 29, item 4): each sample carries what its own calls spent, so a sum over
the samples of a step is what the job paid, checked against the judge server's own count over real
HTTP; the step's ``reward/cost/*`` metrics; prices; and usage a judge server could get wrong."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import numpy as np
import pytest

from async_reward import ConfigError
from async_reward.judge import cost
from async_reward.judge.cost import JudgePricing, cost_metrics, spent_extras
from async_reward.managers import LLMJudgeRewardManager
from async_reward.training.metrics import extras_metrics
from tests.managers.test_managers import chat_requests, judge_settings, score_rows, until_the_server_has
from tests.support.openai_standin import standin_judge

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


def test_tokens_reported_only_as_a_total_are_said_where_prices_are_set():
    """A server that reports ``total_tokens`` alone (or more than its split): the money can price
    only the split tokens, so the sample says so instead of a silently low ``judge_cost``."""
    extras = spent_extras({"total_tokens": 1_000_000}, JudgePricing(3.0, 15.0))
    assert (extras["judge_tokens"], extras["judge_cost"]) == (1_000_000, 0.0)
    assert extras["judge_usage_error"] == (
        "usage.total_tokens 1000000 exceeds prompt + completion (0): judge_cost prices the split tokens only"
    )
    assert extras_metrics([extras])["reward/cost/usage_errors"] == 1
    assert spent_extras({"total_tokens": 12}, None)["judge_usage_error"] == ""  # no money to get wrong
    split = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    assert spent_extras(split, JudgePricing(3.0, 15.0))["judge_usage_error"] == ""


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
        "reward/cost/usage_errors": 0.0,
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


# ----------------------------------------------------------------------------- issue 42, items 6-8


async def score_a_rubric_with_a_failing_criterion(
    server: Any, verl_config_factory: Any, tokenizer: Any, batch_factory: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Six criteria, one call each, every call answered the first time: six calls, no retry (item 6:
    ``reward/retries`` was ``attempts - 1`` = 5). Then one criterion whose call always fails (500):
    its two extra attempts are the sample's only retries. Returns the two samples' extras."""
    criteria = [{"name": f"c{i}", "description": f"The response mentions '{i}'"} for i in range(6)]
    row = {"prompt": "What is 2+3?", "response": "The answer is 5", "ground_truth": "5"}
    settings = judge_settings(server, judge={"criteria": criteria, "criteria_per_call": 1})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    (answered,) = infos(await score_rows(manager, batch_factory, [row]))
    metrics = extras_metrics([answered])
    assert metrics["reward/retries"] == 0
    assert answered["status"] == "ok" and answered["attempts"] == 6 and answered["judge_calls"] == 6
    assert metrics["reward/cost/calls"] == chat_requests(server) == 6  # every request sent

    server.reset()
    criteria[2] = {"name": "c2", "description": "@@fault:500@@ The response mentions '2'"}
    settings = judge_settings(
        server, judge={"criteria": criteria, "criteria_per_call": 1}, retry={"max_attempts": 3}
    )
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    (failed,) = infos(await score_rows(manager, batch_factory, [row]))
    assert failed["status"] == "error" and failed["attempts"] == 5 + 3 and failed["judge_calls"] == 6
    metrics = extras_metrics([answered, failed])
    assert metrics["reward/retries"] == 2
    assert metrics["reward/cost/calls"] == 6 + 8
    return answered, failed


async def test_a_rubric_in_several_calls_counts_its_calls_apart_from_its_retries(
    server, verl_config_factory, tokenizer, batch_factory
):
    """In the v1 metrics (``extras_metrics``); the legacy pipelined trainer's by the same rule:
    tests/legacy/test_cost.py."""
    await score_a_rubric_with_a_failing_criterion(server, verl_config_factory, tokenizer, batch_factory)


@pytest.mark.parametrize("cache", [False, True], ids=["in flight", "cached"])
async def test_a_shared_call_is_paid_once_when_the_sample_that_started_it_is_cancelled(
    server, verl_config_factory, tokenizer, batch_factory, cache
):
    """Three identical requests share one call; the one that started it is cancelled while the judge
    holds the reply. The call completes for the other two, and exactly one of them carries what it
    cost (item 7: both carried 0 tokens, 0 calls), as does a later cached verdict: the step's sums
    equal what the judge server counted."""
    server.update_config(hold=True)
    settings = judge_settings(server, judge={"cache": cache, **PRICES})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    row = {"prompt": "q", "response": "The answer is 5", "ground_truth": "5"}
    batch = batch_factory([row] * 3)
    tasks = [asyncio.ensure_future(manager.run_single(batch[i : i + 1])) for i in range(3)]
    await until_the_server_has(server, 1)
    tasks[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    server.update_config(hold=False)
    rows = infos(list(await asyncio.gather(*tasks[1:])))
    if cache:  # a later identical request takes the cached verdict
        rows += infos(await score_rows(manager, batch_factory, [row]))
    assert [info["status"] for info in rows] == ["ok"] * len(rows)
    assert chat_requests(server) == 1
    metrics = extras_metrics(rows)
    assert metrics["reward/cost/tokens"] == server.stats()["tokens_total"] > 0
    assert metrics["reward/cost/calls"] == 1
    money = (
        3.0 * metrics["reward/cost/prompt_tokens"] + 15.0 * metrics["reward/cost/completion_tokens"]
    ) / 1e6
    assert money > 0 and metrics["reward/cost/money"] == pytest.approx(money)
    paying = [info for info in rows if not info["judge_shared"] and not info["judge_cache_hit"]]
    assert len(paying) == 1 and paying[0]["attempts"] == 1
    assert metrics["reward/cost/cache_hits"] == (1 if cache else 0)


WHOLE_FLOATS = {"prompt_tokens": 100.0, "completion_tokens": 10.0, "total_tokens": 110.0}


async def test_whole_number_floats_in_usage_are_booked_over_real_http(
    verl_config_factory, tokenizer, batch_factory
):
    """A server that writes ``"prompt_tokens": 100.0`` (item 8: booked as 0 tokens, cost 0)."""
    async with standin_judge(usage=WHOLE_FLOATS) as judge:
        settings = {"judge": {"base_url": judge.url + "/v1", **PRICES}}
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        row = {"prompt": "q", "response": "r", "ground_truth": "5"}
        (info,) = infos(await score_rows(manager, batch_factory, [row]))
    assert info["status"] == "ok"
    counts = (info["judge_prompt_tokens"], info["judge_completion_tokens"], info["judge_tokens"])
    assert counts == (100, 10, 110)
    assert info["judge_cost"] == pytest.approx((100 * 3.0 + 10 * 15.0) / 1e6)
    assert info["judge_usage_error"] == ""
    assert extras_metrics([info])["reward/cost/tokens"] == 110


async def test_usage_that_cannot_be_read_is_said_not_booked_silently(
    verl_config_factory, tokenizer, batch_factory, caplog, monkeypatch
):
    """A count that breaks the rule (a fraction here) is counted 0 and said: in each call's sample
    (``judge_usage_error``), the step's ``reward/cost/usage_errors``, and one log line."""
    monkeypatch.setattr(cost, "_said", set())  # said once per process: start this test afresh
    usage = {"prompt_tokens": 100.5, "completion_tokens": 10, "total_tokens": 110.5}
    async with standin_judge(usage=usage) as judge:
        settings = {"judge": {"base_url": judge.url + "/v1"}}
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        with caplog.at_level(logging.WARNING):
            rows = [{"prompt": f"q{i}", "response": "r", "ground_truth": "5"} for i in range(2)]
            outputs = infos(await score_rows(manager, batch_factory, rows))
    for info in outputs:
        assert info["status"] == "ok"  # the verdict stands; only its cost is unknown
        assert "usage.prompt_tokens 100.5 is not a whole number" in info["judge_usage_error"]
        assert info["judge_completion_tokens"] == 10
    assert extras_metrics(outputs)["reward/cost/usage_errors"] == 2
    assert len([r for r in caplog.records if "usage.prompt_tokens" in r.getMessage()]) == 1  # said once


async def test_a_reported_total_beyond_what_the_call_can_use_does_not_starve_the_token_budget(
    verl_config_factory, tokenizer, batch_factory
):
    """A reply claiming 10**12 tokens put the job in token debt for ever: the next call waited out its
    admission. The charge to ``tokens_per_minute`` is capped at what the call can use (its prompt's
    bytes and a margin, plus ``max_tokens``); the extras still say what the server reported."""
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 10**12}
    async with standin_judge(usage=usage) as judge:
        settings = {
            "judge": {"base_url": judge.url + "/v1"},
            "limits": {"tokens_per_minute": 600_000},
            "admission_timeout_s": 20.0,
        }
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        rows = [{"prompt": f"q{i}", "response": "r", "ground_truth": "5"} for i in range(2)]
        first = infos(await score_rows(manager, batch_factory, rows[:1]))
        second = infos(await score_rows(manager, batch_factory, rows[1:]))
    assert [info["status"] for info in first + second] == ["ok", "ok"], second[0]["failure_reason"]
    assert first[0]["judge_tokens"] == 10**12


@pytest.mark.parametrize(
    ("usage", "expected", "problem"),
    [
        (WHOLE_FLOATS, (100, 10, 110), ""),
        ({"prompt_tokens": np.int64(7), "completion_tokens": np.float64(3.0)}, (7, 3, 10), ""),
        ({"prompt_tokens": 10, "completion_tokens": None}, (10, 0, 10), ""),  # null: not reported
        ({"prompt_tokens": 100.5, "completion_tokens": 2}, (0, 2, 2), "100.5 is not a whole number"),
        ({"prompt_tokens": -5, "completion_tokens": 2}, (0, 2, 2), "-5 is negative"),
        ({"prompt_tokens": True, "completion_tokens": 2}, (0, 2, 2), "True is not a number"),
        ({"prompt_tokens": math.nan, "completion_tokens": 2}, (0, 2, 2), "nan is not finite"),
        ({"prompt_tokens": math.inf, "completion_tokens": 2}, (0, 2, 2), "inf is not finite"),
        ({"prompt_tokens": "9", "completion_tokens": 2}, (0, 2, 2), "'9' is not a number"),
        (
            {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12.5},
            (10, 2, 12),
            "total_tokens 12.5",
        ),
        ("not a mapping", (0, 0, 0), "usage is a str, not an object"),
    ],
)
def test_one_rule_reads_every_count_and_names_what_it_refuses(usage, expected, problem):
    extras = spent_extras(usage, JudgePricing(1.0, 1.0))
    got = (extras["judge_prompt_tokens"], extras["judge_completion_tokens"], extras["judge_tokens"])
    assert got == expected
    assert all(type(count) is int for count in got)
    assert extras["judge_cost"] == (expected[0] + expected[1]) / 1e6
    if problem:
        assert problem in extras["judge_usage_error"]
    else:
        assert extras["judge_usage_error"] == ""
    # The step's sums read the sample's counts by the same rule (verl stacks them as floats).
    as_floats = {key: float(value) if isinstance(value, int) else value for key, value in extras.items()}
    assert cost_metrics([as_floats])["reward/cost/tokens"] == expected[2]
    assert cost_metrics([as_floats])["reward/cost/usage_errors"] == (1 if problem else 0)


#: ``Verdict: [[7]]`` written with certainty, but the verdict's alternative ``8`` carries a log-probability
#: past float's range (a JSON integer of 401 digits).
_OVERFLOWING = [
    {"token": text, "logprob": 0.0, "bytes": list(text.encode()), "top_logprobs": []}
    for text in ("Verdict", ":", " ", "[[")
] + [
    {
        "token": "7",
        "logprob": 0.0,
        "bytes": list(b"7"),
        "top_logprobs": [{"token": "8", "logprob": -(10**400), "bytes": list(b"8")}],
    },
    {"token": "]]", "logprob": 0.0, "bytes": list(b"]]"), "top_logprobs": []},
]


async def test_a_logprob_past_floats_range_keeps_the_plain_verdict_and_the_replys_tokens(
    verl_config_factory, tokenizer, batch_factory
):
    """A weighted verdict whose server sends a log-probability Python cannot hold as a float: it raised
    OverflowError out of the weighing (status ``error``, the 940 tokens of the reply missing from the
    cost; review of 2026-11-30). Now malformed logprobs like any other: the plain verdict, said why."""
    usage = {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940}
    async with standin_judge(content="Verdict: [[7]]", usage=usage, logprobs=_OVERFLOWING) as judge:
        settings = {"judge": {"base_url": judge.url + "/v1", "expected_verdict": True, **PRICES}}
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        (info,) = infos(
            await score_rows(manager, batch_factory, [{"prompt": "q", "response": "r", "ground_truth": "5"}])
        )
    assert info["status"] == "ok", info["failure_reason"]
    assert info["judge_verdict"] == 7.0 and info["judge_weighted"] == 0.0
    assert info["judge_weighting"].startswith("plain: malformed logprobs: token 4, alternative 0: logprob -1")
    assert info["judge_weighting"].endswith("is out of range")
    assert info["judge_tokens"] == 940 and info["judge_cost"] == pytest.approx((900 * 3.0 + 40 * 15.0) / 1e6)


async def test_a_reply_that_breaks_reading_is_an_error_that_keeps_its_tokens(
    verl_config_factory, tokenizer, batch_factory, monkeypatch
):
    """Whatever a reply does to the reading that no rule foresaw (a bug, a value past what Python
    reads), the sample is ``error`` naming it, never a silent score, and the call's tokens stay booked:
    the judge was paid whatever the reply said."""
    from async_reward.managers import llm_judge

    def breaks(*_: Any, **__: Any) -> float:
        raise RuntimeError("a reading no rule foresaw")

    monkeypatch.setattr(llm_judge, "read_reply_verdict", breaks)
    async with standin_judge() as judge:
        settings = {"judge": {"base_url": judge.url + "/v1", **PRICES}}
        manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
        (info,) = infos(
            await score_rows(manager, batch_factory, [{"prompt": "q", "response": "r", "ground_truth": "5"}])
        )
    assert info["status"] == "error"
    assert info["failure_reason"] == (
        "the judge's reply could not be read: RuntimeError: a reading no rule foresaw"
    )
    assert info["judge_tokens"] == 12 and info["attempts"] == 1
    assert extras_metrics([info])["reward/cost/tokens"] == 12
