"""Repeated runs of one (regime, strategy): the mean figure and the spread beside it (``--repeats``).

One run's figure moves with its seed (the judge's latency draws, the batch texts, the simulated
response lengths) and with the machine's load; a figure is only worth comparing with another when a
second run, with another seed, lands near it. Each repeat ``r`` runs with seed ``seed + r``
(``--repeats 1`` is the single run of before, at ``--seed``), and the summary keeps every run beside
the mean and its spread: ``relative_spread`` = (max - min) / mean of the step time, which is the
"reproduced within 2 %" of issue 28 when it is at most 0.02 with two repeats.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["MEAN_FIGURES", "WORST_FIGURES", "add_spread", "combine_repeats", "reseed_judge"]

#: Steady-state figures averaged over the repeats (the per-step lists are the first run's; every run
#: is kept whole under ``runs``).
MEAN_FIGURES: tuple[str, ...] = (
    "step_s",
    "reward_blocked_s",
    "gpu_busy_fraction",
    "generating_fraction",
    "trainer_busy_fraction",
    "gpu_stage_fraction",
    "rollout_idle_fraction",
    "service_busy_fraction",
    "scored_during_rollout",
)
#: How starved the runs were: the worst repeat's, so that the verdict's allowance for a starved
#: machine sees any run that was.
WORST_FIGURES: tuple[str, ...] = (
    "probe_lag_ms",
    "probe_lag_p90_ms",
    "load_average_1min",
    "cpu_busy_fraction",
    "busiest_process_cpu",
    "cpu_unit_ms",
)


def combine_repeats(runs: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """One strategy's summary over its ``runs`` (``report.summarize`` each, run ``i`` at ``seeds[i]``):
    the first run's fields with :data:`MEAN_FIGURES` averaged and :data:`WORST_FIGURES` at their
    maximum, ``window_samples`` summed (the mean's window holds every run's), ``steady_state`` only
    if every run's was, plus ``repeats``, ``seeds`` and ``runs`` (each run's own summary and seed)."""
    if not runs or len(runs) != len(seeds):
        raise ValueError(f"{len(runs)} runs for {len(seeds)} seeds: need one run per seed, at least one")
    combined = copy.deepcopy(dict(runs[0]))
    for key in MEAN_FIGURES:
        if all(key in run for run in runs):
            combined[key] = float(sum(run[key] for run in runs) / len(runs))
    for key in WORST_FIGURES:
        if all(key in run for run in runs):
            combined[key] = float(max(run[key] for run in runs))
    if all("busiest_process_cpu" in run for run in runs):  # the name goes with the worst run's figure
        combined["busiest_process"] = max(runs, key=lambda run: run["busiest_process_cpu"]).get(
            "busiest_process"
        )
    combined["window_samples"] = sum(int(run.get("window_samples", 0)) for run in runs)
    combined["steady_state"] = all(run.get("steady_state", True) for run in runs)
    combined["repeats"] = len(runs)
    combined["seeds"] = list(seeds)
    combined["runs"] = [
        {**copy.deepcopy(dict(run)), "seed": seed} for run, seed in zip(runs, seeds, strict=True)
    ]
    return combined


def add_spread(summary: dict[str, Any]) -> None:
    """Add ``step_s_runs`` and ``ratio_to_bound_runs`` (each run's), ``spread_s`` (max - min step
    time, recipe seconds) and ``relative_spread`` (that over the mean step time; 0 for one run),
    after ``report.add_relative`` set each run's ratio."""
    runs = summary.get("runs") or [summary]
    steps = [float(run["step_s"]) for run in runs]
    summary["step_s_runs"] = steps
    summary["ratio_to_bound_runs"] = [float(run.get("ratio_to_bound", math.nan)) for run in runs]
    summary["spread_s"] = max(steps) - min(steps)
    mean = sum(steps) / len(steps)
    summary["relative_spread"] = summary["spread_s"] / mean if mean > 0 else math.nan


def reseed_judge(server: Any, seed: int) -> None:
    """Make the judge draw its latencies (and faults) from ``seed`` after its next ``reset()``.

    The seed is not one of the dev server's runtime settings (its RNG is seeded once, and every
    ``reset()`` reseeds it from its config), so this sets the in-process server's config, which
    ``reset()`` reads. A judge in a child process has no such door: ``BenchConfig.validate`` refuses
    ``--repeats`` above 1 with ``--server process``."""
    inner = getattr(server, "server", None)
    if inner is None or not hasattr(inner, "config"):
        raise TypeError(f"cannot reseed a judge served by {type(server).__name__}: use --server thread")
    inner.config = dataclasses.replace(inner.config, seed=seed)
