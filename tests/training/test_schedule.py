"""``StepSchedule`` over a small recording backend and the real ``PipelinedRewardLoopManager``.

The backend does no GPU work: it builds real verl batches, computes verl's real GRPO advantages and
records every call with the policy version it saw, so the asserts are about ordering and bookkeeping.
Rewards come from real Ray workers running ``llm_judge`` against the local server over loopback.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from async_reward.training.schedule import (
    BATCH_COUPLED_ESTIMATORS,
    GROUP_LOCAL_ESTIMATORS,
    StepSchedule,
    check_estimator,
)

GROUP = 2  # responses per prompt
PROMPTS = 4  # prompts per step: 8 samples, mini-batches of 2 prompts


class RecordingBackend:
    """An honest stand-in for the GPU stages: real batches and advantages, a log of every call."""

    def __init__(self, batch_factory: Callable[..., Any], prompts: int = PROMPTS, group: int = GROUP) -> None:
        self.batch_factory = batch_factory
        self.prompts, self.group = prompts, group
        self.version = 0  # number of steps whose updates finished
        self.calls: list[tuple[str, int, int]] = []  # (stage, step, policy version at the call)
        self.updates: list[tuple[int, list[str], Any]] = []  # (step, sample ids, the updated mini-batch)
        self._updated_steps: Counter[int] = Counter()
        self._lock = threading.Lock()

    def rollout(self, step: int) -> Any:
        self.calls.append(("rollout", step, self.version))
        rows = []
        for p in range(self.prompts):
            a, b = 3 * step + p, 7 + p
            for j in range(self.group):
                answer = a + b if j % 2 == 0 else a + b + 1  # half right, half wrong
                rows.append(
                    {
                        "prompt": f"step {step} q{p}: {a}+{b}?",
                        "response": f"try {j}: {answer}",
                        "ground_truth": str(a + b),
                        "uid": f"s{step}-p{p}",
                        "extra_info": {"sample": f"{step}:{p}:{j}", "version": self.version},
                    }
                )
        batch = self.batch_factory(rows, prompt_length=24, response_length=16)
        batch.non_tensor_batch["sample_id"] = np.array(
            [r["extra_info"]["sample"] for r in rows], dtype=object
        )
        return batch

    def prepare(self, batch: Any) -> Any:
        self.calls.append(
            ("prepare", int(batch.non_tensor_batch["sample_id"][0].split(":")[0]), self.version)
        )
        batch.batch["old_log_probs"] = torch.zeros_like(batch.batch["responses"], dtype=torch.float32)
        return batch

    def compute_advantage(self, batch: Any) -> Any:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        response_mask = batch.batch["attention_mask"][:, -batch.batch["responses"].shape[1] :]
        advantages, returns = compute_grpo_outcome_advantage(
            batch.batch["rm_scores"], response_mask, batch.non_tensor_batch["uid"]
        )
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        return batch

    def update(self, batch: Any, step: int) -> dict[str, float]:
        self.calls.append(("update", step, self.version))
        self.updates.append((step, list(batch.non_tensor_batch["sample_id"]), batch))
        self._updated_steps[step] += 1
        return {
            "actor/samples": float(len(batch)),
            "actor/score_mean": float(batch.batch["rm_scores"].sum(1).mean()),
        }

    def end_step(self) -> None:
        self.version += 1


def drive(schedule: StepSchedule, backend: RecordingBackend, steps: int) -> list[Any]:
    """Run the generator the way a trainer does: its own bookkeeping between steps."""
    records = []
    for record in schedule.steps(steps):
        backend.end_step()
        records.append(record)
    return records


def expected_score(sample_id: str) -> float:
    return 1.0 if int(sample_id.split(":")[2]) % 2 == 0 else 0.0


def per_sample_scores(batch: Any) -> list[float]:
    return batch.batch["rm_scores"].sum(dim=1).tolist()


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


# -- refusals and edge cases (a local reward source: no Ray needed) --------------------------------


class LocalRewards:
    """A synchronous reward source scoring by the same rule as the judge, recording what it saw."""

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.cancelled: list[int] = []
        self._batches: dict[int, Any] = {}
        self._left: dict[int, list[int]] = {}

    def submit(self, batch: Any, group_key: str = "uid") -> int:
        ticket = len(self.submitted)
        self.submitted.append(len(batch))
        self._batches[ticket] = batch
        self._left[ticket] = list(range(len(batch)))
        return ticket

    def get_chunk(self, ticket: int, n_samples: int, timeout: float | None = None) -> Any:
        from async_reward.legacy.chunks import RewardChunk, assemble_rm_scores

        batch, left = self._batches[ticket], self._left[ticket]
        uids = batch.non_tensor_batch["uid"]
        take: list[int] = []
        while left and (len(take) < n_samples or uids[left[0]] == uids[take[-1]]):
            take.append(left.pop(0))
        indices = np.array(take, dtype=np.int64)
        scores = [expected_score(s) for s in batch.non_tensor_batch["sample_id"][indices]]
        return RewardChunk(
            indices=indices,
            rm_scores=assemble_rm_scores(batch.batch, indices, scores),
            reward_extra_info={"status": np.array(["ok"] * len(indices))},
            statuses=np.array(["ok"] * len(indices)),
            remaining=len(left),
        )

    def ticket_metrics(self, ticket: int) -> dict[str, float]:
        return {"reward/local": 1.0}

    def cancel(self, ticket: int) -> None:
        self.cancelled.append(ticket)


@pytest.mark.parametrize("estimator", sorted(BATCH_COUPLED_ESTIMATORS))
@pytest.mark.parametrize("mode", ["mini_batch", "both"])
def test_mini_batch_modes_refuse_batch_coupled_estimators(estimator, mode, batch_factory):
    with pytest.raises(ValueError, match="group-local advantage estimator"):
        StepSchedule(RecordingBackend(batch_factory), LocalRewards(), mode, 2, adv_estimator=estimator)
    # The whole-batch modes compute advantages on the whole batch: any estimator is fine there.
    StepSchedule(RecordingBackend(batch_factory), LocalRewards(), "one_step_off", 2, adv_estimator=estimator)


def test_estimator_checks():
    for name in GROUP_LOCAL_ESTIMATORS:
        check_estimator(name)
    with pytest.raises(ValueError, match="unknown advantage estimator 'my_est'"):
        check_estimator("my_est")
    check_estimator("my_est", assume_group_local=True)
    with pytest.raises(ValueError, match="whitens"):
        check_estimator("gae", assume_group_local=True)


@pytest.mark.parametrize(
    ("prompts", "group", "mini_batches", "match"),
    [(3, 2, 4, "cannot be split into 4 equal"), (4, 4, 8, "do not hold whole groups of 4")],
)
def test_refuses_batches_mini_batches_cannot_split(prompts, group, mini_batches, match, batch_factory):
    rewards = LocalRewards()
    backend = RecordingBackend(batch_factory, prompts=prompts, group=group)
    schedule = StepSchedule(backend, rewards, "mini_batch", mini_batches)
    with pytest.raises(ValueError, match=match):
        schedule.run(1)
    assert rewards.submitted == []  # refused before any reward was requested


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "async"}, "mode must be one of"),
        ({"mini_batches": 0}, "mini_batches"),
        ({"chunk_timeout_s": 0}, "chunk_timeout_s"),
    ],
)
def test_bad_arguments(kwargs, match, batch_factory):
    with pytest.raises(ValueError, match=match):
        StepSchedule(RecordingBackend(batch_factory), LocalRewards(), **kwargs)


def test_stopping_an_off_policy_run_cancels_the_batch_ahead(batch_factory):
    rewards = LocalRewards()
    backend = RecordingBackend(batch_factory)
    steps = StepSchedule(backend, rewards, "both", 2, keep_batches=False).steps(5)
    first = next(steps)
    assert first.batch is None and first.metrics["reward/local"] == 1.0
    steps.close()
    assert rewards.submitted == [8, 8] and rewards.cancelled == [1]


def test_first_step_sets_policy_versions(batch_factory):
    backend = RecordingBackend(batch_factory)
    ticks = itertools.count()  # a virtual clock: each reading is the next integer
    records = StepSchedule(backend, LocalRewards(), "one_step_off", 1, clock=lambda: next(ticks)).run(
        2, first_step=10
    )
    assert [(r.step, r.policy_version, r.trained_version) for r in records] == [(10, 10, 10), (11, 10, 11)]
    # Step times are readings of the given clock, in order; the caller's time between steps is in neither.
    assert 0 == records[0].start < records[0].end < records[1].start < records[1].end < next(ticks)


def test_an_error_mid_step_cancels_the_batches_still_scoring(batch_factory):
    class FailingBackend(RecordingBackend):
        def update(self, batch: Any, step: int) -> dict[str, float]:
            if step == 1:
                raise RuntimeError("optimizer exploded")
            return super().update(batch, step)

    rewards = LocalRewards()
    schedule = StepSchedule(FailingBackend(batch_factory), rewards, "both", 2)
    with pytest.raises(RuntimeError, match="optimizer exploded"):
        schedule.run(4)
    assert len(rewards.submitted) == 3 and rewards.cancelled == [1, 2]
