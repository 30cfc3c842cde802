"""The recipe's measured stage times, the yardstick of the benchmark.

``seed_stage_timings.csv`` (shipped next to this module, copied from the project's
``calibration/seed_stage_timings.csv``) holds, per published run of verl's async-reward-agent recipe,
the median seconds per step of each stage, read from its TensorBoard logs (105 steps each). The GPU
stages of the benchmark sleep these medians, scaled down in time; the recipe's step times per strategy
are what the benchmark's results are compared with.

The recipe's reward service: every sample waits uniform(1, 40) s, at most 256 requests at once, 1024
prompts x 5 responses per step, so the service alone needs 5120 x 20.5 / 256 = 410 s per step.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CSV",
    "RECIPE_RUNS",
    "RECIPE_SERVICE",
    "ServiceModel",
    "StageMedians",
    "load_medians",
    "recipe_targets",
]

DEFAULT_CSV = Path(__file__).with_name("seed_stage_timings.csv")

#: Which published run measured each strategy (Qwen2-7B, Megatron, GSM8K; the recipe's tables).
RECIPE_RUNS: dict[str, str] = {
    "baseline": "gsm8k_qwen2_7b_base",
    "mini_batch": "gsm8k_qwen2_7b_async",
    "one_step_off": "q7b_mcore_off",
    "both": "gsm8k_qwen2_7b_off_ppl",
}


@dataclass(frozen=True)
class StageMedians:
    """Median seconds per step of each stage of one run (or those medians time-scaled)."""

    run: str
    steps: int
    """Steps the medians were taken over."""
    gen_s: float
    """Rollout (generation)."""
    reward_s: float
    """Launching the reward requests (not waiting for them)."""
    old_log_prob_s: float
    ref_s: float
    adv_s: float
    """The ``adv`` timer: in the recipe it includes the wait for rewards, hence its size."""
    update_actor_s: float
    """All mini-batch updates of one step."""
    step_s: float

    @property
    def prepare_s(self) -> float:
        """Old + reference log-probs: the stages that overlap the reward wait in every strategy."""
        return self.old_log_prob_s + self.ref_s

    @property
    def gpu_work_s(self) -> float:
        """GPU time per step: generation, old and reference log-probs, updates."""
        return self.gen_s + self.prepare_s + self.update_actor_s

    def scaled(self, factor: float) -> StageMedians:
        """Every duration multiplied by ``factor`` (e.g. 0.01 runs a 585 s step in 5.9 s)."""
        if factor <= 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name) * factor
                for f in dataclasses.fields(self)
                if f.name.endswith("_s")
            },
        )


@dataclass(frozen=True)
class ServiceModel:
    """A reward service: samples per step, per-request latency range, concurrent request capacity."""

    samples: int
    latency_s: tuple[float, float]
    capacity: int

    @property
    def mean_latency_s(self) -> float:
        return (self.latency_s[0] + self.latency_s[1]) / 2

    @property
    def work_per_capacity_s(self) -> float:
        """Seconds the service needs for one step's samples at full capacity (its throughput bound)."""
        return self.samples * self.mean_latency_s / self.capacity


#: The recipe's simulated judge: 1024 prompts x 5 responses, uniform 1-40 s, 256 concurrent requests.
RECIPE_SERVICE = ServiceModel(samples=1024 * 5, latency_s=(1.0, 40.0), capacity=256)


def load_medians(path: str | Path | None = None) -> dict[str, StageMedians]:
    """Stage medians per run name, from the calibration CSV (default: the copy shipped here).

    Raises:
        ValueError: a row lacks a column or holds a non-number.
    """
    csv_path = Path(path) if path is not None else DEFAULT_CSV
    medians: dict[str, StageMedians] = {}
    with csv_path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                medians[row["run"]] = StageMedians(
                    run=row["run"],
                    steps=int(row["steps"]),
                    gen_s=float(row["median_gen_s"]),
                    reward_s=float(row["median_reward_s"]),
                    old_log_prob_s=float(row["median_old_log_prob_s"]),
                    ref_s=float(row["median_ref_s"]),
                    adv_s=float(row["median_adv_s"]),
                    update_actor_s=float(row["median_update_actor_s"]),
                    step_s=float(row["median_step_s"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{csv_path}:{line}: bad calibration row ({exc!r})") from None
    return medians


def recipe_targets(medians: dict[str, StageMedians]) -> dict[str, dict[str, Any]]:
    """The recipe's per-step time of each strategy and its reduction versus the baseline (a fraction)."""
    base = medians[RECIPE_RUNS["baseline"]].step_s
    return {
        strategy: {
            "run": run,
            "step_s": medians[run].step_s,
            "reduction": 1.0 - medians[run].step_s / base,
            "ratio_to_bound": medians[run].step_s
            / max(RECIPE_SERVICE.work_per_capacity_s, medians[RECIPE_RUNS["baseline"]].gpu_work_s),
        }
        for strategy, run in RECIPE_RUNS.items()
    }
