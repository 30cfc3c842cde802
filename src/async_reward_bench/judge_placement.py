"""Where a judge served inside the job runs, and what that does to a step: the placement model.

A judge that verl serves in the job (``reward.reward_model.enable=true``) is a model on GPUs, so its
throughput is a number of GPUs times what one of them decodes, not a latency an API hands us. The
benchmark (``benchmarks/judge_placement.py``, ``async_reward_bench.placement_bench``) derives it from
the recipe's calibrated rollout, under assumptions that are fields of :class:`JudgeModel`:

* the judge decodes per GPU ``speed`` x what the policy does (1.0: a model of the policy's size,
  the recipe's 7B; 0.5: about twice its size);
* per sample it writes ``tokens_ratio`` x the tokens of the policy's mean response (its prefill of
  the prompt and response, read in one pass, is left out), so a verdict takes ``tokens_ratio /
  speed`` x the policy's mean decoding time at full speed (:func:`mean_response_s`: 11.0 s for the
  recipe's 640-sample batch), spread uniform in the recipe judge's shape (1-40 s around 20.5 s);
* one GPU decodes as many verdicts at full speed as it decodes policy responses (the benchmark's
  engine: one batch on the calibration's 8 GPUs, so batch / 8 per GPU); requests beyond that queue.

The two placements (verl's ``reward.reward_model.enable_resource_pool``):

* **standalone** (``true``, k GPUs of the job's N): capacity k x slots per GPU; it scores each sample
  as it is generated, during generation and training; the policy keeps N - k GPUs, every stage
  scaled as ``gpu_split`` scales them (linear);
* **colocated** (``false``): the judge shares the N training GPUs: capacity N x slots per GPU (a
  whole batch at once), but only between sampling and training (verl's ``_compute_reward_colocate``
  wakes it, scores the sampled batch, puts it back to sleep), plus ``wake_sleep_s`` each time. Only
  verl's ``sync`` and ``colocate_async`` take it: verl's ``separate_async`` asserts a standalone
  judge, and ours (the v1 ``pipelined`` and legacy schedules) refuse it at start-up.

Pure arithmetic, cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass

from async_reward_bench.calibration import RECIPE_SERVICE, StageMedians
from async_reward_bench.generation import rollout_work
from async_reward_bench.gpu_split import (
    CALIBRATION_GPUS,
    SEPARATE_MODES,
    GpuSplit,
    colocated_bound,
    colocated_stages,
    split_for,
)
from async_reward_bench.scenarios import STRATEGIES

__all__ = [
    "COLOCATED_STRATEGIES",
    "REFUSED_COLOCATED",
    "STANDALONE_STRATEGIES",
    "JudgeModel",
    "Placement",
    "RunPlan",
    "mean_response_s",
    "placements",
    "plan_run",
    "slots_per_gpu",
]

#: Strategies that take a judge on the training GPUs (verl's ``_compute_reward_colocate`` path).
COLOCATED_STRATEGIES: tuple[str, ...] = ("v1_sync", "v1_colocate_async")
#: Strategies run with a standalone judge: verl's three v1 trainers, our v1 mode, legacy ``both``.
STANDALONE_STRATEGIES: tuple[str, ...] = (
    "v1_sync",
    "v1_colocate_async",
    "v1_separate_async",
    "v1_pipelined_both",
    "both",
)
#: Why the other strategies do not run with a colocated judge (what their trainers say at start-up).
REFUSED_COLOCATED: dict[str, str] = {
    "v1_separate_async": "verl's separate_async asserts reward.reward_model.enable_resource_pool=true",
    "v1_decoupled": "our decoupled mode refuses a judge on the training GPUs",
    **dict.fromkeys(
        ("v1_pipelined_both", "both"),
        "our pipelined schedules refuse a judge on the training GPUs (fix: enable_resource_pool=true)",
    ),
}


@dataclass(frozen=True)
class JudgeModel:
    """The served judge's size relative to the policy, and what waking it costs."""

    tokens_ratio: float = 1.0
    """Tokens the judge writes per sample / tokens of the policy's mean response (1.0: a short
    rationale and a verdict about as long as a GSM8K answer; 4.0: a thinking judge)."""
    speed: float = 1.0
    """The judge's per-GPU decode throughput / the policy's (1.0: the policy's size)."""
    wake_sleep_s: float = 5.0
    """Seconds a colocated judge's wake-up and sleep add to each scoring (stated: about the 5 s the
    speed-up benchmark takes for a 7B weight push; vLLM's sleep level 1 moves the weights off the GPU
    and back)."""

    def __post_init__(self) -> None:
        if not (self.tokens_ratio > 0 and self.speed > 0 and self.wake_sleep_s >= 0):
            raise ValueError(
                f"judge tokens ratio and speed must be > 0 and wake/sleep >= 0, got {self.tokens_ratio}, "
                f"{self.speed}, {self.wake_sleep_s}"
            )

    def mean_latency_s(self, response_s: float) -> float:
        """One verdict's decoding time at full speed, given the policy's mean ``response_s``."""
        return self.tokens_ratio / self.speed * response_s

    def latency_s(self, response_s: float) -> tuple[float, float]:
        """The judge's uniform latency range: the recipe judge's shape (1-40 s) with this mean."""
        lo, hi = RECIPE_SERVICE.latency_s
        factor = self.mean_latency_s(response_s) / RECIPE_SERVICE.mean_latency_s
        return lo * factor, hi * factor


@dataclass(frozen=True)
class Placement:
    """Where the judge runs: ``judge_gpus`` GPUs of its own, or 0 for the training GPUs."""

    judge_gpus: int
    total_gpus: int = CALIBRATION_GPUS

    def __post_init__(self) -> None:
        if not 0 <= self.judge_gpus < self.total_gpus:
            raise ValueError(
                f"a standalone judge needs 1 to {self.total_gpus - 1} of the job's {self.total_gpus} "
                f"GPUs (0: colocated), got {self.judge_gpus}"
            )

    @property
    def colocated(self) -> bool:
        return self.judge_gpus == 0

    @property
    def name(self) -> str:
        return "colocated" if self.colocated else f"standalone k={self.judge_gpus}"

    @property
    def policy_gpus(self) -> int:
        """GPUs left to the policy (generation and training)."""
        return self.total_gpus - self.judge_gpus

    def judge_capacity(self, per_gpu: int) -> int:
        """Verdicts decoded at once at full speed: the judge's GPUs (all N when colocated) x ``per_gpu``."""
        return per_gpu * (self.total_gpus if self.colocated else self.judge_gpus)


def placements(judge_gpus: tuple[int, ...], total_gpus: int = CALIBRATION_GPUS) -> list[Placement]:
    """Colocated first (the baseline's placement), then a standalone judge on each k of ``judge_gpus``."""
    return [Placement(0, total_gpus), *(Placement(k, total_gpus) for k in judge_gpus)]


def slots_per_gpu(batch_samples: int, rollout_slots: int | None = None) -> int:
    """Sequences one GPU decodes at full speed: the engine's slots (default one batch) / 8."""
    slots = rollout_slots or batch_samples
    if slots % CALIBRATION_GPUS:
        raise ValueError(
            f"the engine's {slots} full-speed slots do not split over {CALIBRATION_GPUS} GPUs: choose "
            f"prompts x group size divisible by {CALIBRATION_GPUS}"
        )
    return slots // CALIBRATION_GPUS


def mean_response_s(stages: StageMedians, sigma: float, samples: int) -> float:
    """The policy's mean decoding time per response at full speed on the calibration's GPUs (recipe
    seconds): a batch's decoding time summed over its responses / its samples."""
    return rollout_work(stages.gen_s, sigma, samples, samples)


@dataclass(frozen=True)
class RunPlan:
    """What one (placement, strategy) run gets: its GPUs' stages, the judge's capacity and latency."""

    placement: Placement
    strategy: str
    stages: StageMedians
    """The policy's stages on its GPUs (recipe seconds): colocated on ``policy_gpus``, or ``split``'s."""
    split: GpuSplit | None
    """A separate strategy's split of the policy's GPUs into rollout and trainer GPUs."""
    judge_capacity: int
    judge_latency_s: tuple[float, float]
    wake_sleep_s: float | None
    """Colocated only: the judge's wake + sleep per scoring; None: standalone, scoring per sample."""
    judge_work_s: float
    """Recipe seconds the judge needs per step at full throughput (samples x mean latency / capacity)."""
    bound_s: float
    """The step's lower bound: colocated, the GPUs generate, judge (the batch's longest verdict plus
    wake and sleep) and train in turn; standalone, ``max(policy GPU terms, judge work)``."""


def plan_run(
    strategy: str,
    placement: Placement,
    judge: JudgeModel,
    stages: StageMedians,
    *,
    sigma: float,
    samples: int,
    per_gpu: int,
    rollout_gpus: int | None = None,
) -> RunPlan:
    """The run of ``strategy`` with the judge at ``placement``; ``stages`` are the calibration's (of the
    regime, on its 8 GPUs, recipe seconds), ``sigma`` the regime's response-length shape.

    Raises:
        ValueError: a strategy that does not take a colocated judge (``REFUSED_COLOCATED``), or an
            unknown one.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    if placement.colocated and strategy not in COLOCATED_STRATEGIES:
        reason = REFUSED_COLOCATED.get(strategy, "not modelled with a colocated judge")
        raise ValueError(f"{strategy} cannot run with a colocated judge: {reason}")
    capacity = placement.judge_capacity(per_gpu)
    response = mean_response_s(stages, sigma, samples)
    latency = judge.latency_s(response)
    work = samples * judge.mean_latency_s(response) / capacity
    separate = STRATEGIES[strategy] in SEPARATE_MODES
    if placement.colocated:
        policy = colocated_stages(stages, placement.total_gpus)
        lo, hi = latency
        # The batch's longest verdict (the expected maximum of its uniform draws) when the judge takes
        # the whole batch at once; its throughput when it cannot.
        phase = max(lo + (hi - lo) * samples / (samples + 1), work) + judge.wake_sleep_s
        return RunPlan(
            placement, strategy, policy, None, capacity, latency, judge.wake_sleep_s, work,
            colocated_bound(policy, 0.0) + phase,
        )  # fmt: skip
    if separate:
        gen_work = rollout_work(stages.gen_s, sigma, samples, samples)
        split = split_for(stages, gen_work, placement.policy_gpus, rollout_gpus)
        return RunPlan(
            placement, strategy, split.stages(stages), split, capacity, latency, None, work,
            split.bound(stages, gen_work, work),
        )  # fmt: skip
    policy = colocated_stages(stages, placement.policy_gpus)
    return RunPlan(
        placement, strategy, policy, None, capacity, latency, None, work, colocated_bound(policy, work)
    )
