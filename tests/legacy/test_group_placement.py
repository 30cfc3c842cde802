"""Group judging (``judge.mode: group``) on the legacy pipelined manager: it deals whole groups to its
workers, re-sends a dead worker's samples as whole groups, and steals none, so a group's members meet
in one worker (the other placements: tests/judge/group/test_placement.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
from omegaconf import open_dict

from async_reward import ConfigError
from async_reward.legacy import PipelinedRewardLoopManager
from async_reward.legacy.worker import PipelineRewardWorker
from tests.judge.group.test_judging import group_config
from tests.judge.group.test_placement import groups_of
from tests.legacy.test_manager import assert_complete_groups, drain
from tests.managers.test_managers import chat_requests


@pytest.fixture(scope="module")
def group_pipeline(
    ray_cluster: None, judge_server: Any, verl_config_factory: Callable[..., Any]
) -> Iterator[Any]:
    config = group_config(verl_config_factory, judge_server, group_wait_s=30.0)
    with open_dict(config):
        config.reward.async_reward.limits = {"max_concurrency": 6}
    manager = PipelinedRewardLoopManager(config, num_workers=3, collect_wait_s=0.5)
    yield manager
    manager.close()


def test_the_pipelined_manager_judges_each_group_in_one_call(group_pipeline, batch_factory, server) -> None:
    batch = batch_factory(groups_of(6, 3))
    chunks = drain(group_pipeline, group_pipeline.submit(batch), 6)
    assert_complete_groups(batch, chunks)
    assert all((chunk.statuses == "ok").all() for chunk in chunks)
    assert chat_requests(server) == 6


def test_a_dead_workers_groups_are_resent_whole(group_pipeline, batch_factory, server) -> None:
    """Re-sent samples are dealt as whole groups to the two live workers: cut in halves, a group's
    members would wait in two workers until judge.group_wait_s and fail."""
    server.update_config(latency_ms=[100.0, 200.0])
    batch = batch_factory(groups_of(16, 3))
    ticket = group_pipeline.submit(batch)
    chunks = [group_pipeline.get_chunk(ticket, 3, timeout=60)]  # mid-batch: every worker holds work
    ray.kill(group_pipeline.worker_handles[0], no_restart=True)
    chunks += drain(group_pipeline, ticket, 48, timeout=120)
    assert_complete_groups(batch, chunks)
    statuses = [status for chunk in chunks for status in chunk.statuses.tolist()]
    assert statuses == ["ok"] * 48, sorted(set(statuses))


async def test_a_pipelined_worker_gives_no_member_away_and_refuses_too_few_slots(
    server, verl_config_factory, batch_factory
) -> None:
    config = group_config(verl_config_factory, server)
    with pytest.raises(ConfigError) as refused:
        PipelineRewardWorker(config, max_concurrency=2)
    assert refused.value.key == "reward.async_reward.limits.max_concurrency"
    worker = PipelineRewardWorker(config, max_concurrency=3)
    await worker.enqueue(1, list(range(6)), batch_factory(groups_of(2, 3)))
    assert await worker.steal(1, 3) == []  # the second group waits here: stealing it could split it
    assert await worker.cancel(1) == 6
