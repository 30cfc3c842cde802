"""Our managers and v1 lines under verl's ``separate_async`` trainer mode, on CPU, through verl's code.

``separate_async`` is verl's fully-async mode: a standalone rollout pool generates continuously while
the trainer samples mini-batches from the replay buffer and syncs weights every
``parameter_sync_step`` of them (partial rollout through ``FullyAsyncLLMServerClient``, decoupled
PPO's pi_old kept on the CPU). Here verl's own ``PPOTrainerSeparateAsync.fit`` runs with our
``RewardAgentLoopManager``, our ``RewardReplayBuffer`` and verl's ``RewardLoopManager`` whose Ray
workers run our managers; stand-ins only for the standalone rollout (the scripted server behind
verl's real load balancer), the actor's model and the weight sync (tests/support/v1_standins.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from async_reward.v1 import V1_OVERRIDES
from tests.managers.test_managers import USER_FUNCTIONS, write_module
from tests.support.v1_standins import (
    SEPARATE_ASYNC_OVERRIDES,
    ScriptedRollout,
    StandInActor,
    TrainingRun,
    base_overrides,
    compose_v1_config,
    run_v1_training,
    sessions,
    write_dataset,
)
from tests.v1.test_v1_integration import (
    FAST_RETRY,
    assert_reward_metrics_every_step,
    assert_same_extras_keys,
    excluding_reward,
    grpo_advantages,
    step_logs,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")

ROWS = [(f"What is {a}+{b}?", str(a + b)) for a, b in [(1, 1), (2, 3), (4, 4), (7, 1), (9, 4), (3, 3)]]
#: Enough rows that verl's dataloader never comes back to row 0 within a run (warm-up, two steps of two
#: prompts and the refills that separate_async dispatches while it trains).
MORE_ROWS = ROWS + [
    (f"What is {a}*{b}?", str(a * b)) for a, b in [(2, 2), (3, 2), (4, 3), (5, 5), (6, 2), (7, 3)]
]


def train_separate_async(
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    script: dict[str, list[str]],
    reward_lines: list[str],
    *,
    steps: int,
    prompts: int = 2,
    n: int = 2,
    sync_every: int = 2,
    actor: StandInActor | None = None,
    rows: list[tuple[str, str]] = ROWS,
) -> TrainingRun:
    """verl's ``separate_async`` with the README's v1 lines, ``sync_every`` mini-batches per weight sync."""
    dataset = write_dataset(tmp_path / "train.parquet", rows)
    overrides = [
        *base_overrides(
            model_dir, dataset, steps=steps, prompts=prompts, n=n, mini_batch=prompts // sync_every
        ),
        "trainer.v1.trainer_mode=separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={sync_every}",
        *SEPARATE_ASYNC_OVERRIDES,
        *V1_OVERRIDES,
        *reward_lines,
        "trainer.val_before_train=false",
    ]
    return run_v1_training(
        compose_v1_config(overrides), rollout, script, tmp_path / "metrics.jsonl", actor=actor
    )


def test_llm_judge_trains_under_separate_async_every_sample_once_with_reward_metrics(
    tmp_path, model_dir, rollout, transfer_queue, server
):
    """Two steps of two mini-batches: our judge scores every trained session (real HTTP to the local
    judge), each session is trained exactly once, and every step logs ``reward/*`` for all of its
    samples; verl's own separate_async path ran (decoupled PPO saved pi_old on the CPU)."""
    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in ROWS}
    actor = StandInActor()
    run = train_separate_async(
        tmp_path,
        model_dir,
        rollout,
        script,
        [
            "reward.reward_manager.name=llm_judge",
            f"+reward.async_reward.judge.base_url={server.url}/v1",
            *FAST_RETRY,
        ],
        steps=2,
        actor=actor,
    )
    assert len(run.updates) == 4  # parameter_sync_step=2 mini-batches per step, one update call each
    trained = [row for update in run.updates for row in sessions(update)]
    assert len(trained) == 8
    assert not [key for key, count in Counter(row.key for row in trained).items() if count > 1]
    for update in run.updates:  # one group per mini-batch, one right and one wrong answer
        assert sorted(row.score for row in sessions(update)) == [0.0, 1.0]
    assert all(row.reward_extra_info["status"] == "ok" for row in trained)
    assert {"judge_verdict", "judge_tokens"} <= assert_same_extras_keys(run)
    assert_reward_metrics_every_step(run, steps=2, samples_per_step=4)
    assert ("save", 0) in actor.cpu_snapshots  # separate_async's decoupled PPO, not another mode's path


def test_raise_under_separate_async_evicts_the_group_and_trains_a_fresh_prompt(
    tmp_path, model_dir, rollout, transfer_queue
):
    """``on_failure: raise``: the group whose session raised is tagged failed, evicted and replaced by
    verl's refill; none of its members is trained, and the run neither crashes nor hangs."""
    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in MORE_ROWS}
    script["What is 1+1?"] = ["The answer is 2", "boom"]
    run = train_separate_async(
        tmp_path,
        model_dir,
        rollout,
        script,
        [
            "reward.reward_manager.name=async_rate_limited",
            f"reward.custom_reward_function.path={write_module(tmp_path, USER_FUNCTIONS)}",
            "reward.custom_reward_function.name=sync_score",
            "+reward.async_reward.on_failure=raise",
        ],
        steps=2,
        rows=MORE_ROWS,
    )
    trained = [row for update in run.updates for row in sessions(update)]
    assert len(trained) == 8 and 0 not in {row.index for row in trained}
    logs = step_logs(run)
    assert sum(m.get("training/rollout_failure/evicted_samples", 0) for m in logs) == 1
    assert_reward_metrics_every_step(run, steps=2, samples_per_step=4)
    assert all(m["reward/status_ok"] == 4.0 for m in logs)


def test_exclude_under_separate_async_masks_the_failed_session_and_no_update_trains_on_nothing(
    tmp_path, model_dir, rollout, transfer_queue
):
    """``on_failure: exclude`` with the rollout never asleep: a failed session stays in its group with
    no loss token, the group's advantages come from its scored members, a mini-batch left with
    nothing to train is generated again rather than stepped on, and every AdamW step has loss tokens."""
    script = {question: [f"The answer is {truth}", "The answer is 0", f"{truth}"] for question, truth in ROWS}
    script["What is 2+3?"] = ["The answer is 5", "fail", "The answer is 0"]  # one excluded of three
    script["What is 4+4?"] = ["fail", "fail", "fail"]  # a mini-batch with nothing to train
    actor = StandInActor()
    run = train_separate_async(
        tmp_path, model_dir, rollout, script, excluding_reward(tmp_path), steps=2, n=3, actor=actor
    )
    trained = [row for update in run.updates for row in sessions(update)]
    assert not [key for key, count in Counter(row.key for row in trained).items() if count > 1]
    (excluded,) = [row for row in trained if row.reward_extra_info["excluded"]]
    assert excluded.index == 1 and excluded.mask_tokens == 0 and excluded.advantage == 0.0
    scored = [row for row in trained if row.index == 1 and row is not excluded]
    expected = dict(zip([1.0, 0.0], grpo_advantages([1.0, 0.0]), strict=True))
    assert sorted(row.score for row in scored) == [0.0, 1.0]
    for row in scored:
        assert row.mask_tokens > 0 and row.advantage == pytest.approx(expected[row.score], abs=1e-4)
    assert 2 not in {row.index for row in trained}  # the all-failed group never reached the actor
    assert actor.steps and all(step.loss_tokens > 0 for step in actor.steps)
    logs = step_logs(run)
    assert sum(m["reward/skipped_batches"] for m in logs) == 1.0
    assert sum(m["reward/excluded"] for m in logs) == 4.0
