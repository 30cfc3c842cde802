"""``StepSchedule`` over a small recording backend and a local reward source.

The backend does no GPU work: it builds real verl batches, computes verl's real GRPO advantages and
records every call with the policy version it saw, so the asserts are about ordering and bookkeeping.
The four schedules with rewards from real Ray workers (the legacy ``PipelinedRewardLoopManager``
running ``llm_judge`` against the local server over loopback): tests/legacy/test_schedule.py.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

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


# -- refusals and edge cases (a local reward source: no Ray needed) --------------------------------


@dataclass
class LocalChunk:
    """What a reward source's ``get_chunk`` returns (``RewardChunkLike``): scores laid out by verl's own
    ``RewardManagerBase.assemble_rm_scores``."""

    indices: np.ndarray
    rm_scores: torch.Tensor
    reward_extra_info: dict[str, np.ndarray]


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
        batch, left = self._batches[ticket], self._left[ticket]
        uids = batch.non_tensor_batch["uid"]
        take: list[int] = []
        while left and (len(take) < n_samples or uids[left[0]] == uids[take[-1]]):
            take.append(left.pop(0))
        indices = np.array(take, dtype=np.int64)
        scores = [expected_score(s) for s in batch.non_tensor_batch["sample_id"][indices]]
        return LocalChunk(
            indices=indices,
            rm_scores=RewardManagerBase.assemble_rm_scores(batch[indices], scores),
            reward_extra_info={"status": np.array(["ok"] * len(indices))},
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
