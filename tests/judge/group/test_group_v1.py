"""Group judging (``judge.mode: group``) under verl's v1 trainer, on CPU, through verl's real v1 code:
our agent loop routes each session to the reward worker chosen for its ``uid``, so with two reward
workers every group still meets in one and is judged in one call (tests/v1/test_v1_integration.py's
set-up)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.v1_standins import group_by_index
from tests.v1.test_v1_integration import FAST_RETRY, assert_same_extras_keys, train

pytestmark = pytest.mark.usefixtures("ray_cluster")

ROWS = [("What is 2+3?", "5"), ("What is 4*4?", "16")]
SCRIPT = {
    "What is 2+3?": ["The answer is 5", "The answer is 6", "The answer is 5", "The answer is 7"],
    "What is 4*4?": ["The answer is 16", "The answer is 16", "The answer is 3", "The answer is 16"],
}
SCORES = {0: [0.0, 0.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0, 1.0]}


def test_v1_groups_meet_in_one_of_two_reward_workers_and_are_judged_in_one_call(
    tmp_path, model_dir, rollout, transfer_queue, server
):
    run = train(
        tmp_path,
        model_dir,
        rollout,
        ROWS,
        SCRIPT,
        [
            "reward.reward_manager.name=llm_judge",
            "reward.num_workers=2",  # least-loaded routing would deal a group's sessions to both
            f"+reward.async_reward.judge.base_url={server.url}/v1",
            "+reward.async_reward.judge.mode=group",
            "+reward.async_reward.judge.group_wait_s=90",
            *FAST_RETRY,
        ],
        n=4,
    )
    (update,) = run.updates
    groups = group_by_index(update)
    for index, group in groups.items():
        statuses = [row.reward_extra_info["status"] for row in group]
        assert statuses == ["ok"] * 4, [row.reward_extra_info["failure_reason"] for row in group]
        assert sorted(row.score for row in group) == SCORES[index]
        assert sorted(row.reward_extra_info["judge_group_position"] for row in group) == [1, 2, 3, 4]
    assert {"judge_group_position", "judge_group_size", "judge_group_reason"} <= assert_same_extras_keys(run)
    assert server.stats()["requests_by_path"]["/v1/chat/completions"] == 2  # one call a group


# ----------------------------------------------------------------------------- our v1 modes

#: 90 s: far beyond the spread of a group's sessions here, even on a loaded 2-core machine; it is only
#: reached when a group is split (the routing broken), which then fails the test with the count.
GROUP_JUDGE = ["+reward.async_reward.judge.mode=group", "+reward.async_reward.judge.group_wait_s=90"]


def assert_each_group_judged_in_one_call(rows: list[Any], n: int, calls: int) -> set[int]:
    """Every trained session ``ok``, its group listed whole in one call (positions 1..n, each once),
    the reward the right answer's: and no more calls than groups scored. Returns the trained rows'
    group indices."""
    by_index: dict[int, list[Any]] = {}
    for row in rows:
        by_index.setdefault(row.index, []).append(row)
    for index, group in by_index.items():
        statuses = [row.reward_extra_info["status"] for row in group]
        assert statuses == ["ok"] * n, [row.reward_extra_info["failure_reason"] for row in group]
        assert sorted(row.reward_extra_info["judge_group_position"] for row in group) == list(range(1, n + 1))
        assert {row.reward_extra_info["judge_group_size"] for row in group} == {n}, index
    assert calls > 0 and calls >= len(by_index)
    return set(by_index)


def test_our_pipelined_mode_judges_each_group_in_one_call_across_two_reward_workers(
    tmp_path, model_dir, rollout, transfer_queue, server
):
    """``trainer.v1.trainer_mode=pipelined`` (mini-batch + one-step off), two reward workers: each
    session is scored as it is generated, routed by its ``uid``, so the two sessions of every group
    meet in one worker and are judged in one call; every sample trains once, ``ok``."""
    import async_reward.v1.pipelined.trainer  # noqa: F401  (registers the mode in this process)
    from async_reward.wiring.integration import SETUP_HOOK
    from tests.support.v1_standins import (
        base_overrides,
        compose_v1_config,
        run_v1_training,
        sessions,
        write_dataset,
    )
    from tests.v1.pipelined.test_pipelined import ROWS as PIPELINED_ROWS
    from tests.v1.pipelined.test_pipelined import SCRIPT as PIPELINED_SCRIPT
    from tests.v1.pipelined.test_pipelined import schedule_flags

    dataset = write_dataset(tmp_path / "train.parquet", PIPELINED_ROWS)
    config = compose_v1_config(
        [
            *base_overrides(model_dir, dataset, steps=2, prompts=4, n=2),
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags("both"),
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "trainer.val_before_train=false",
            "reward.reward_manager.name=llm_judge",
            "reward.num_workers=2",
            f"+reward.async_reward.judge.base_url={server.url}/v1",
            *GROUP_JUDGE,
            *FAST_RETRY,
        ]
    )
    run = run_v1_training(config, rollout, PIPELINED_SCRIPT, tmp_path / "metrics.jsonl")
    rows = [row for update in run.updates for row in sessions(update)]
    calls = server.stats()["requests_by_path"]["/v1/chat/completions"]
    assert assert_each_group_judged_in_one_call(rows, 2, calls) == set(range(8))
    assert len(rows) == 16 and calls == 8  # 2 steps x 4 groups, each trained once, one call each
    for row in rows:  # the script's first answer of each question is right, the second wrong
        right = row.reward_extra_info["judge_verdict"] == 10
        assert row.score == (1.0 if right else 0.0)
    assert {row.score for row in rows} == {0.0, 1.0}


def test_the_decoupled_mode_judges_each_group_in_one_call_across_two_reward_workers(
    tmp_path, model_dir, rollout, transfer_queue, server
):
    """``trainer.v1.trainer_mode=decoupled`` on a standalone rollout pool, two reward workers: every
    trained group was judged whole in one call, ``ok``, none evicted, and the prompt ledger balanced
    (with least-loaded routing instead, some groups split, time out and are evicted)."""
    from tests.v1.decoupled.test_decoupled import (
        N,
        assert_accounted_every_step,
        judge_lines,
        script_for,
        train,
        trained_rows,
    )

    run = train(
        tmp_path,
        model_dir,
        rollout,
        script_for({}),
        judge_lines(server.url, "raise", *GROUP_JUDGE, reward_workers=2),
        steps=3,
    )
    logs = assert_accounted_every_step(run, 3)
    rows = trained_rows(run)
    calls = server.stats()["requests_by_path"]["/v1/chat/completions"]
    trained = assert_each_group_judged_in_one_call(rows, N, calls)
    assert len(trained) == 6  # 3 steps x 2 groups
    # no group failed and was replaced (a group split between the workers times out, is evicted)
    assert logs[-1]["ledger/evicted"] == 0, logs[-1]
    # one call a group scored, and the mode dispatches ahead of training (its generation window):
    # never more calls than groups dispatched (pointwise would make N a group)
    assert calls <= logs[-1]["ledger/dispatched"] + logs[-1]["ledger/carried_over"], (calls, logs[-1])
    for row in rows:
        assert row.score == (1.0 if row.reward_extra_info["judge_verdict"] == 10 else 0.0)
