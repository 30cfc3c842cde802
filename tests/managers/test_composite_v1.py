"""``async_composite`` (a verl-style rule file and a judge gated on it) trained through our v1
``pipelined`` mode on verl's own v1 trainer code (as tests/v1/pipelined/test_pipelined.py), over real
HTTP to the local judge server. Apart from tests/managers/test_composite.py so that it runs with the
other in-process v1 training files, on their warm actors (``V1_WARM_FILES`` in tests/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.managers.test_composite import RULE_FILE
from tests.managers.test_managers import chat_requests, write_module


@pytest.mark.timeout(600)
def test_rule_and_gated_judge_train_through_the_v1_pipelined_mode(
    tmp_path, model_dir, rollout, transfer_queue, ray_cluster, server
) -> None:
    """Two steps of verl's v1 trainer in our ``pipelined`` mode (verl's ``PPOTrainer.fit``, agent loop,
    ``RewardLoopManager`` with the composite in its Ray worker): the rule (a verl-style function file)
    scores every session, the judge only the right answers; what each step trained on and logged."""
    from tests.support.v1_standins import sessions
    from tests.v1.pipelined.test_pipelined import step_logs, train_pipelined

    rule = write_module(tmp_path, RULE_FILE, "rule.py")
    components = (
        "[{name:rule,manager:async_naive},"
        "{name:judge,manager:llm_judge,weight:0.5,only_if:{component:rule,score_at_least:1}}]"
    )
    run = train_pipelined(
        tmp_path,
        model_dir,
        rollout,
        server,
        "mini_batch",
        extra=[
            "reward.reward_manager.name=async_composite",
            "~reward.async_reward.remote",  # train_pipelined's async_remote section: no component reads it
            f"reward.custom_reward_function.path={rule}",
            f"+reward.async_reward.judge.base_url={server.url}/v1",
            f"+reward.async_reward.composite.components={components}",
        ],
    )
    trained = [row for update in run.updates for row in sessions(update)]
    assert len({row.key for row in trained}) == 16  # 2 steps x 4 prompts x 2 sessions, each once
    for row in trained:
        info = row.reward_extra_info
        right = info["composite_rule_score"] == 1.0
        assert row.score == (1.5 if right else 0.0) and info["status"] == "ok"
        assert info["composite_judge_status"] == ("ok" if right else "skipped")
    assert (
        chat_requests(server)
        == sum(row.reward_extra_info["composite_rule_score"] == 1.0 for row in trained)
        == 8
    )
    for metrics in step_logs(run):
        assert metrics["reward/status_ok"] == 8.0 and metrics["reward/untrained"] == 0.0
        assert metrics["reward/cost/calls"] == 12.0  # 8 rule calls + 4 judge calls a step
        assert metrics["reward/cost/tokens"] > 0
        assert metrics["reward/extra/composite_judge_skipped/mean"] == 0.5
