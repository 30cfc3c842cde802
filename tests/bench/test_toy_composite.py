"""The rewards of the toy's issue-45 arms (``rule`` and ``rule_judge`` of
``async_reward_bench.toy.v1_parity``), built from the very verl config a run composes, scoring toy
responses against the dev judge over real HTTP: no Ray, no training (the learning runs are the
benchmark's, ``python benchmarks/toy_grpo_v1.py --modes rule rule_judge``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_reward_bench.toy.task import ArithmeticTask, compute_score, exact_match, is_bare
from async_reward_bench.toy.v1_parity import V1ParityConfig, _overrides, compose

#: Responses to ``3+4=`` (7): bare and right, right with a stray symbol the rule does not see, wrong.
RESPONSES = ("7", "7=", "+7", "07", "8", "=")


@pytest.fixture(scope="module")
def judge() -> Iterator[Any]:
    from async_reward.tools.devserver import DevServerConfig, ThreadedDevServer

    server = ThreadedDevServer(DevServerConfig(seed=0, latency_ms=(0.0, 0.0)))
    server.start()
    yield server
    server.stop()


async def score(mode: str, judge: Any, model_dir: Path) -> list[dict[str, Any]]:
    """Each of :data:`RESPONSES` scored by ``mode``'s reward manager, as verl loads it."""
    from verl.trainer.ppo.reward import load_reward_manager

    from async_reward._core.http import close_sessions
    from async_reward.testing import rollout_batch
    from async_reward_bench.toy.v1_policy import build_toy_model_dir

    tokenizer = build_toy_model_dir(model_dir)
    cfg = V1ParityConfig(max_operand=4)
    config = compose(_overrides(cfg, mode, model_dir, "unused.parquet", judge.url))
    manager = load_reward_manager(config, tokenizer)
    task = ArithmeticTask(max_operand=4)
    batch = rollout_batch(
        tokenizer,
        [task.prompt(3, 4)] * len(RESPONSES),
        list(RESPONSES),
        ["7"] * len(RESPONSES),
        data_source=task.data_source,
        prompt_length=task.prompt_length,
        response_length=task.max_response_tokens,
    )
    try:
        outputs = await asyncio.gather(*(manager.run_single(batch[i : i + 1]) for i in range(len(batch))))
    finally:
        await close_sessions()
    return [{"score": float(o["reward_score"]), **o["reward_extra_info"]} for o in outputs]


async def test_the_gated_judge_pays_a_bare_right_answer_half_more_and_is_asked_only_where_the_rule_says_right(
    judge: Any, tmp_path: Path
) -> None:
    """``rule``: the toy's rule (``compute_score`` in ``async_naive``), 1 or 0, no judge call.
    ``rule_judge``: the same rule plus half the judge's verdict on the property the rule does not
    see (``task.is_bare``: no stray ``+`` / ``=``), the judge asked over HTTP for the right answers
    only; a wrong answer's judge is ``skipped``. The benchmark's local figure of that property
    (``is_bare``) agrees with the judge on every response."""
    judge.reset()
    rule = await score("rule", judge, tmp_path / "rule")
    assert judge.stats()["requests_by_path"].get("/v1/chat/completions", 0) == 0
    assert [r["score"] for r in rule] == [float(exact_match(t, "7")) for t in RESPONSES] == [1, 1, 1, 1, 0, 0]
    assert [r["score"] for r in rule] == [compute_score("toy_arithmetic", t, "7") for t in RESPONSES]
    assert all(r["status"] == "ok" for r in rule)

    judge.reset()
    gated = await score("rule_judge", judge, tmp_path / "rule_judge")
    right = [t for t in RESPONSES if exact_match(t, "7")]
    assert judge.stats()["requests_by_path"]["/v1/chat/completions"] == len(right) == 4
    assert [r["score"] for r in gated] == [1.5, 1.0, 1.0, 1.5, 0.0, 0.0]
    assert [r["score"] for r in gated] == [
        float(exact_match(t, "7")) * (1 + 0.5 * is_bare(t)) for t in RESPONSES
    ]
    assert all(r["status"] == "ok" for r in gated)
    assert [r["composite_judge_status"] for r in gated] == ["ok"] * 4 + ["skipped"] * 2
    assert [r["composite_rule_score"] for r in gated] == [r["score"] for r in rule]
    assert all(r["judge_tokens"] > 0 for r in gated[:4]) and all(r["judge_tokens"] == 0 for r in gated[4:])
