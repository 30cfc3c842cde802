"""Where group judging runs (``judge.mode: group``): a group's members must meet in one reward worker.

Our v1 agent loop routes each session by its ``uid``; verl's own agent loop, which draws a reward
worker at random per sample, is refused at start-up with more than one worker, as is verl's
``RewardLoopManager`` where its contiguous chunks would cut groups. (The legacy pipelined manager,
which deals whole groups to its workers: tests/legacy/test_group_placement.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from omegaconf import open_dict

from async_reward import ConfigError
from async_reward.config.checks import check_reward
from async_reward.v1.reward_failover import RewardWorkerPool
from tests.judge.group.test_judging import group_config
from tests.managers.test_managers import chat_requests
from tests.v1.test_reward_routing import RecordingRewardWorker, agent_loop_worker, session

GOOD = {"response": "The answer is 5", "ground_truth": "5"}
BAD = {"response": "The answer is 7", "ground_truth": "5"}


def groups_of(count: int, size: int) -> list[dict[str, Any]]:
    """``count`` groups of ``size`` members, each group its own prompt, the second member wrong."""
    rows = []
    for _ in range(count):
        uid = uuid.uuid4().hex
        for member in range(size):
            rows.append({**(BAD if member == 1 else GOOD), "prompt": f"What is 2+3? ({uid})", "uid": uid})
    return rows


# ------------------------------------------------------------------------------- start-up refusals


def test_verl_agent_loop_with_several_reward_workers_is_refused(server, verl_config_factory):
    config = group_config(verl_config_factory, server)
    with open_dict(config):
        config.reward.num_workers = 2
    with pytest.raises(ConfigError) as refused:
        check_reward(config)
    assert refused.value.key == "reward.num_workers" and "drawn at random" in str(refused.value)
    with open_dict(config):  # verl v1 with our agent loop routes by uid: accepted
        config.trainer.use_v1 = True
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = (
            "async_reward.v1.agent_loop.RewardAgentLoopManager"
        )
    check_reward(config)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"data.train_batch_size": 3}, "data.train_batch_size"),
        ({"trainer.balance_batch": True}, "trainer.balance_batch"),
        ({"trainer.val_before_train": True}, "reward.num_workers"),
    ],
)
def test_verl_reward_loop_manager_chunks_that_would_cut_groups_are_refused(
    server, verl_config_factory, changes, key
):
    """A judge colocated on the training GPUs is scored by verl's RewardLoopManager.compute_rm_score,
    one contiguous chunk per reward worker: whole groups only under these conditions."""
    from async_reward.judge.group.placement import group_size

    config = group_config(verl_config_factory, server)
    with open_dict(config):
        config.reward.num_workers = 2
        config.reward.reward_model.enable = True
        config.reward.reward_model.enable_resource_pool = False
        config.data.train_batch_size = 4
        config.trainer.use_v1 = False  # verl's legacy trainer balances the batch before it scores it
        config.trainer.balance_batch = False
        config.trainer.val_before_train = False
        config.trainer.test_freq = -1
    assert group_size(config) == 3  # 4 prompts x 3 responses: two whole groups per worker
    with open_dict(config):
        for dotted, value in changes.items():
            section, name = dotted.split(".")
            config[section][name] = value
    with pytest.raises(ConfigError) as refused:
        group_size(config)
    assert refused.value.key == key, refused.value


@pytest.mark.parametrize(("max_model_len", "refused"), [(4096, True), (8192, False), (None, False)])
def test_a_served_judge_too_short_for_a_group_of_full_length_responses_is_refused(
    server, verl_config_factory, max_model_len, refused
):
    """With the judge verl serves, its context is known at start-up: 4 responses of up to 1024
    tokens, the instructions (512 + 32 a member) and judge.max_tokens 512 need 5248 tokens, which a
    4096-token judge cannot hold (every member of such a group would be invalid). Unknown context
    (no max_model_len, no local config.json): left to each call's own count."""
    from async_reward.judge.group.placement import group_size

    config = group_config(verl_config_factory, server, n=4, max_tokens=512)
    with open_dict(config):
        config.data.max_response_length = 1024
        config.reward.reward_model.enable = True
        config.reward.reward_model.rollout.max_model_len = max_model_len
    if not refused:
        assert group_size(config) == 4
        return
    with pytest.raises(ConfigError) as refusal:
        group_size(config)
    assert refusal.value.key == "reward.reward_model.rollout.max_model_len", refusal.value
    message = str(refusal.value)
    assert "actor_rollout_ref.rollout.response_length=1024" in message and "5248 tokens" in message
    assert "context of 4096 (rollout.max_model_len)" in message
    with open_dict(config):  # an external judge: its context is not known here
        config.reward.reward_model.enable = False
    assert group_size(config) == 4


def test_offline_scoring_has_no_groups_and_is_refused():
    from async_reward.judge.group.placement import group_size

    with pytest.raises(ConfigError) as refused:
        group_size({"reward": {"async_reward": {"judge": {"mode": "group"}}}})
    assert refused.value.key == "reward.async_reward.judge.mode"


# ------------------------------------------------------------------------------- verl's reward loop


def test_one_reward_worker_judges_each_group_in_one_call_through_verl(
    server, verl_config_factory, reward_loop, batch_factory
):
    config = group_config(verl_config_factory, server)
    batch = batch_factory(groups_of(3, 3))
    output = reward_loop(config).compute_rm_score(batch)
    assert list(output.non_tensor_batch["status"]) == ["ok"] * 9
    assert list(output.non_tensor_batch["judge_verdict"]) == [10.0, 0.0, 10.0] * 3
    assert chat_requests(server) == 3


# ------------------------------------------------------------------------------- our v1 agent loop


def test_v1_sessions_of_a_group_reach_one_reward_worker() -> None:
    """Least-loaded routing spreads a group's sessions over the workers; group routing keeps each
    uid's sessions on one worker, and different groups on different ones."""

    async def run() -> list[tuple[str, str]]:
        handles = [RecordingRewardWorker(f"w{i}", fast=True) for i in range(3)]
        worker = agent_loop_worker(handles)
        worker._route_by_group = True
        outputs = [(f"g{g}", session()) for _ in range(3) for g in range(8)]  # members interleaved
        await asyncio.gather(*(worker._compute_score([o], {"uid": uid}) for uid, o in outputs))
        return [(uid, o.extra_fields["reward_extra_info"]["worker"]) for uid, o in outputs]

    routed = asyncio.run(run())
    by_group: dict[str, set[str]] = {}
    for uid, name in routed:
        by_group.setdefault(uid, set()).add(name)
    assert all(len(names) == 1 for names in by_group.values()), by_group
    assert len(set().union(*by_group.values())) > 1  # groups still spread over the workers


def test_a_dead_reward_worker_moves_only_its_groups_all_members_to_one_worker() -> None:
    pool = RewardWorkerPool(["a", "b", "c"])
    before = {f"g{i}": pool.choose(f"g{i}") for i in range(60)}
    assert set(before.values()) == {0, 1, 2}
    pool.mark_dead(1)
    after = {uid: pool.choose(uid) for uid in before}
    assert all(after[uid] == before[uid] for uid in before if before[uid] != 1)
    assert {after[uid] for uid in before if before[uid] == 1} <= {0, 2}
    assert all(pool.choose(uid) == after[uid] for uid in before)  # stable: every member, every time
