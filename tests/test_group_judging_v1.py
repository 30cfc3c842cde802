"""Group judging (``judge.mode: group``) under verl's v1 trainer, on CPU, through verl's real v1 code:
our agent loop routes each session to the reward worker chosen for its ``uid``, so with two reward
workers every group still meets in one and is judged in one call (tests/test_v1.py's set-up)."""

from __future__ import annotations

import pytest

from tests.test_v1 import FAST_RETRY, assert_same_extras_keys, train
from tests.v1_standins import group_by_index

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
            "+reward.async_reward.judge.group_wait_s=20",
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
