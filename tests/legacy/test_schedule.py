"""``StepSchedule`` in its four modes with rewards from the legacy ``PipelinedRewardLoopManager``: real Ray
workers running ``llm_judge`` against the local server over loopback, groups completing out of order.
The recording backend and the schedule's refusals and edge cases: tests/training/test_schedule.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from async_reward.training.schedule import StepSchedule
from tests.training.test_schedule import (
    GROUP,
    PROMPTS,
    RecordingBackend,
    drive,
    expected_score,
    per_sample_scores,
)


@pytest.fixture(scope="module")
def pipeline(ray_cluster: None, judge_server: Any, verl_config_factory: Callable[..., Any]) -> Iterator[Any]:
    """One real pipelined manager for the module: two Ray workers running ``llm_judge``."""
    from async_reward.legacy import PipelinedRewardLoopManager

    config = verl_config_factory(
        "llm_judge",
        {"judge": {"base_url": judge_server.url + "/v1"}, "limits": {"max_concurrency": 8}},
        num_workers=2,
    )
    manager = PipelinedRewardLoopManager(config)
    yield manager
    manager.close()


@pytest.fixture
def slow_server(server: Any) -> Any:
    """The judge with random latency, so groups complete out of order and rewards take a while."""
    server.update_config(latency_ms=[2.0, 40.0], capacity=4)
    return server


def test_baseline_waits_once_then_updates_mini_batches(pipeline, slow_server, batch_factory):
    backend = RecordingBackend(batch_factory)
    schedule = StepSchedule(backend, pipeline, "baseline", mini_batches=2, chunk_timeout_s=60)
    records = drive(schedule, backend, 3)

    assert [r.step for r in records] == [0, 1, 2]
    for record in records:
        names = [e.name for e in record.events]
        assert names == ["rollout", "submit", "prepare", "reward_wait", "advantage", "update", "update"]
        assert record.chunk_sizes == [4, 4] and record.staleness == 0
        assert record.metrics["pipeline/num_updates"] == 2
        assert record.metrics["timing_s/reward_blocked"] == pytest.approx(record.reward_blocked_s)
        assert record.metrics["reward/status_ok"] == 8
        assert per_sample_scores(record.batch) == [
            expected_score(s) for s in record.batch.non_tensor_batch["sample_id"]
        ]
    # Steps tile the run, and the updates of a step come in order on contiguous halves.
    assert all(a.end <= b.start for a, b in itertools.pairwise(records))
    assert [step for step, _, _ in backend.updates] == [0, 0, 1, 1, 2, 2]
    assert backend.updates[0][1] == ["0:0:0", "0:0:1", "0:1:0", "0:1:1"]
    assert [c for c in backend.calls if c[0] == "rollout"] == [("rollout", k, k) for k in range(3)]


def test_mini_batch_updates_on_complete_groups_each_sample_once(pipeline, slow_server, batch_factory):
    backend = RecordingBackend(batch_factory, prompts=6)
    schedule = StepSchedule(backend, pipeline, "mini_batch", mini_batches=3, chunk_timeout_s=60)
    records = drive(schedule, backend, 2)

    for record in records:
        assert record.chunk_sizes == [4, 4, 4]  # same number of optimizer updates as baseline
        names = [e.name for e in record.events]
        assert names[:3] == ["rollout", "submit", "prepare"]
        assert names[3:] == ["reward_wait", "advantage", "update"] * 3
    for step in (0, 1):
        updates = [(ids, batch) for s, ids, batch in backend.updates if s == step]
        assert len(updates) == 3
        used = [sample for ids, _ in updates for sample in ids]
        assert sorted(used) == sorted(f"{step}:{p}:{j}" for p in range(6) for j in range(GROUP))
        for ids, batch in updates:
            # Complete groups only, and per-chunk GRPO advantages equal the whole group's.
            assert set(Counter(batch.non_tensor_batch["uid"]).values()) == {GROUP}
            assert per_sample_scores(batch) == [expected_score(s) for s in ids]
            adv = batch.batch["advantages"].sum(dim=1) / batch.batch["advantages"].ne(0).sum(dim=1).clamp(
                min=1
            )
            for sample, value in zip(ids, adv.tolist(), strict=True):
                assert value == pytest.approx(0.7071, abs=1e-3) if expected_score(sample) else value < 0


def test_one_step_off_rolls_out_next_batch_before_updating(pipeline, slow_server, batch_factory):
    backend = RecordingBackend(batch_factory)
    schedule = StepSchedule(backend, pipeline, "one_step_off", mini_batches=2, chunk_timeout_s=60)
    records = drive(schedule, backend, 4)

    assert [r.staleness for r in records] == [0, 1, 1, 1]
    assert [r.policy_version for r in records] == [0, 0, 1, 2]
    assert [r.metrics["off_policy/staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    # No batch skipped, repeated, or rolled out beyond the last step.
    rollouts = [(step, version) for stage, step, version in backend.calls if stage == "rollout"]
    assert rollouts == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [step for step, _, _ in backend.updates] == [0, 0, 1, 1, 2, 2, 3, 3]
    for record in records[:-1]:
        rollout_next = next(e for e in record.events if e.name == "rollout" and e.batch == record.step + 1)
        first_update = next(e for e in record.events if e.name == "update")
        prepare = next(e for e in record.events if e.name == "prepare")
        assert prepare.end <= rollout_next.start < first_update.start
    assert not [e for e in records[-1].events if e.name == "rollout"]
    # Batch k was generated by the policy before update k-1 (the backend's version at rollout time).
    for record in records:
        assert {info["version"] for info in record.batch.non_tensor_batch["extra_info"]} == {
            record.policy_version
        }


def test_both_combines_off_policy_and_mini_batches(pipeline, slow_server, batch_factory):
    backend = RecordingBackend(batch_factory)
    schedule = StepSchedule(backend, pipeline, "both", mini_batches=2, chunk_timeout_s=60)
    records = drive(schedule, backend, 3)

    assert [r.staleness for r in records] == [0, 1, 1]
    seen: Counter[str] = Counter()
    for record in records:
        assert record.chunk_sizes == [4, 4]
        names = [e.name for e in record.events if e.batch == record.step]
        assert names.count("reward_wait") == 2 and names.count("update") == 2
    for _, ids, batch in backend.updates:
        seen.update(ids)
        assert set(Counter(batch.non_tensor_batch["uid"]).values()) == {GROUP}
    assert len(seen) == 3 * PROMPTS * GROUP and set(seen.values()) == {1}
