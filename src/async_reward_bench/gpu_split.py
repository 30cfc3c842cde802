"""Standalone rollout GPUs and trainer GPUs at equal total: the split, its stage times and its bound.

The calibrated medians (``calibration.StageMedians``) are colocated times: the recipe's run generated
and trained on the same C = :data:`CALIBRATION_GPUS` GPUs. verl's ``separate_async`` (and our
``decoupled`` mode) put generation on R standalone rollout GPUs and training on the other T = N - R
of N GPUs in all. The benchmark models GPU count linearly, which flatters the separate modes (vLLM
data-parallel replicas and FSDP at 7B come close to linear, never above it):

* every response's decoding time x C / R (so a batch alone takes ``gen_s x C / R``; at N = C this
  is N / R);
* every GPU training stage (old and reference log-probs, actor updates) x C / T;
* a colocated strategy on N GPUs: every GPU stage x C / N (nothing changes at the default N = C);
* weight sync: the trainer pushes weights once per step (``on_step_end``), pausing generation for
  ``weight_sync_s`` (default 0: the colocated ``gen`` median already includes a sync).

The bound of a step is then ``max(generation work x C/R, train x C/T, reward work / capacity)``, each
GPU term plus the sync, against the colocated ``max((gen + train) x C/N, reward work / capacity)``.
Generation *work* (``generation.rollout_work``: decoding time summed over a batch's responses, over
the engine's full-speed slots) is below the ``gen`` makespan: the standalone rollout is fed
continuously, so while one batch's longest responses finish it decodes the next batch's bulk (0.28x
the makespan with the regimes' response lengths, 0.10x with the long tail's). A makespan term would
not be a bound: verl's ``separate_async`` ran at 0.77x of one on a single rollout GPU. The colocated
bound keeps today's makespan (a colocated rollout stops while the GPUs train; ``colocate_async`` can
go below it too). The default R is the integer that minimises the GPU part of the separate bound in
each regime (at 8 GPUs: 1, training is the larger share everywhere).

Pure arithmetic, cheap to import (the command line uses it before anything heavy is loaded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from async_reward_bench.calibration import StageMedians

__all__ = [
    "CALIBRATION_GPUS",
    "SEPARATE_MODES",
    "GpuSplit",
    "best_rollout_gpus",
    "colocated_bound",
    "colocated_stages",
    "split_for",
]

#: GPUs of the calibration run (``gsm8k_qwen2_7b_base``: one node of 8), the N of the model.
CALIBRATION_GPUS = 8
#: verl v1 trainer modes with standalone rollout GPUs (``trainer.v1.trainer_mode``).
SEPARATE_MODES = frozenset({"separate_async", "decoupled"})


def _train_s(stages: StageMedians) -> float:
    """GPU training work of one step on all N GPUs: old + reference log-probs, actor updates."""
    return stages.prepare_s + stages.update_actor_s


def _scale_gpu(stages: StageMedians, gen: float, train: float) -> StageMedians:
    return dataclasses.replace(
        stages,
        gen_s=stages.gen_s * gen,
        old_log_prob_s=stages.old_log_prob_s * train,
        ref_s=stages.ref_s * train,
        update_actor_s=stages.update_actor_s * train,
    )


def colocated_stages(stages: StageMedians, total: int) -> StageMedians:
    """The calibration's ``stages`` on ``total`` colocated GPUs: every GPU stage x C / N."""
    if total < 1:
        raise ValueError(f"need at least 1 GPU, got {total}")
    factor = CALIBRATION_GPUS / total
    return stages if total == CALIBRATION_GPUS else _scale_gpu(stages, factor, factor)


def colocated_bound(stages: StageMedians, reward_work_s: float) -> float:
    """A colocated step's bound (``stages`` on its own GPUs): the GPUs generate then train, the
    service scores in parallel."""
    return max(stages.gen_s + _train_s(stages), reward_work_s)


@dataclass(frozen=True)
class GpuSplit:
    """``total`` GPUs, ``rollout`` of them standalone rollout GPUs, the rest trainer GPUs."""

    total: int
    """N: the GPUs a colocated strategy runs on, and a separate one splits."""
    rollout: int
    """R: standalone rollout GPUs (``actor_rollout_ref.rollout.n_gpus_per_node``)."""
    weight_sync_s: float = 0.0
    """Seconds (recipe time) one weight push costs the trainer and pauses generation, once a step."""

    def __post_init__(self) -> None:
        if self.total < 2 or not 1 <= self.rollout < self.total:
            raise ValueError(
                f"a split needs at least 1 rollout and 1 trainer GPU: got {self.rollout} rollout GPUs "
                f"of {self.total} (set --rollout-gpus between 1 and --total-gpus - 1)"
            )
        if not self.weight_sync_s >= 0:
            raise ValueError(f"weight sync must be >= 0 s, got {self.weight_sync_s}")

    @property
    def trainer(self) -> int:
        """T = N - R."""
        return self.total - self.rollout

    @property
    def gen_factor(self) -> float:
        """C / R: how much longer each response decodes than on the calibration's C GPUs."""
        return CALIBRATION_GPUS / self.rollout

    @property
    def train_factor(self) -> float:
        """C / T: how much longer each training stage takes than on the calibration's C GPUs."""
        return CALIBRATION_GPUS / self.trainer

    def stages(self, stages: StageMedians) -> StageMedians:
        """The calibration's ``stages`` as this split runs them: generation x C/R, training x C/T."""
        return _scale_gpu(stages, self.gen_factor, self.train_factor)

    def terms(self, stages: StageMedians, rollout_work_s: float, reward_work_s: float) -> dict[str, float]:
        """The three throughput limits of a step: rollout GPUs (``rollout_work_s``: generation work
        per batch on the calibration's GPUs), trainer GPUs (``stages``: the calibration's), the
        reward service."""
        return {
            "rollout_s": rollout_work_s * self.gen_factor + self.weight_sync_s,
            "trainer_s": _train_s(stages) * self.train_factor + self.weight_sync_s,
            "reward_s": reward_work_s,
        }

    def bound(self, stages: StageMedians, rollout_work_s: float, reward_work_s: float) -> float:
        """``max(generation work x C/R, train x C/T, reward work / capacity)`` (GPU terms plus the
        sync)."""
        return max(self.terms(stages, rollout_work_s, reward_work_s).values())


def best_rollout_gpus(stages: StageMedians, rollout_work_s: float, total: int) -> int:
    """The R in 1..N-1 minimising ``max(generation work / R, train / (N-R))`` (the smallest such R)."""
    if total < 2:
        raise ValueError(f"splitting needs at least 2 GPUs, got {total}")
    return min(range(1, total), key=lambda r: max(rollout_work_s / r, _train_s(stages) / (total - r)))


def split_for(
    stages: StageMedians,
    rollout_work_s: float,
    total: int,
    rollout: int | None = None,
    weight_sync_s: float = 0.0,
) -> GpuSplit:
    """The split of ``total`` GPUs: ``rollout`` when given, else :func:`best_rollout_gpus`."""
    chosen = best_rollout_gpus(stages, rollout_work_s, total) if rollout is None else rollout
    return GpuSplit(total, chosen, weight_sync_s)
