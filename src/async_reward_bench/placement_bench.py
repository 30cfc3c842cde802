"""Which placement for a judge served in the job, measured (``benchmarks/judge_placement.py``).

The speed-up benchmark's machinery, unchanged where it can be: verl's v1 trainers and our schedules
with calibrated GPU stages, the simulated rollout engine, and a reward path that is real (verl's
``RewardLoopWorker`` actors or our ``PipelinedRewardLoopManager`` running ``llm_judge``, HTTP to the
local judge). What changes is the judge: a model on GPUs (``judge_placement``), so its capacity and
latency follow from where it runs, and the policy's stages from the GPUs it leaves:

* **colocated** (the judge shares the 8 training GPUs): verl's ``sync`` and ``colocate_async``, the
  whole sampled batch scored at once between sampling and training, waking and putting the judge
  to sleep around it (``colocated_judge``);
* **standalone, k = 1, 2** (the judge on k GPUs of its own, the policy on 8 - k): verl's ``sync``,
  ``colocate_async`` and ``separate_async`` (its 8 - k GPUs split into rollout and trainer GPUs as
  ``gpu_split`` chooses), our v1 ``pipelined`` mode (schedule both) and legacy ``both``, each sample
  scored as it is generated.

Every step time is compared with verl's default (``v1_sync``, colocated judge) measured in the same
run, and with the run's own bound. Writes ``<out>/judge_placement.json``; prints one markdown table
per judge size.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from async_reward_bench.judge_placement import (
    COLOCATED_STRATEGIES,
    REFUSED_COLOCATED,
    STANDALONE_STRATEGIES,
    JudgeModel,
    RunPlan,
    mean_response_s,
    placements,
    plan_run,
    slots_per_gpu,
)
from async_reward_bench.scenarios import OFFERED_STRATEGIES, REGIMES, V1_STRATEGIES, Regime, not_offered
from async_reward_bench.settings import BenchConfig

__all__ = ["BASELINE", "PlacementConfig", "format_table", "judge_settings", "main", "run_placements"]

#: The row every ratio is against: verl's default trainer with verl's default placement.
BASELINE = ("colocated", "v1_sync")


@dataclass
class PlacementConfig:
    """One placement benchmark run. Times are recipe seconds unless named ``*_real``."""

    judge_tokens: tuple[float, ...] = (1.0, 4.0)
    """Judge sizes, one table each: tokens it writes per sample / the policy's mean response's."""
    judge_speed: float = 1.0
    """The judge's per-GPU decode throughput / the policy's (1.0: a model of the policy's size)."""
    wake_sleep_s: float = 5.0
    """A colocated judge's wake-up plus sleep per scoring (``JudgeModel.wake_sleep_s``)."""
    judge_gpus: tuple[int, ...] = (1, 2)
    """Standalone placements: the judge's GPUs of the 8 (colocated always runs: it holds the baseline)."""
    strategies: tuple[str, ...] = tuple(s for s in STANDALONE_STRATEGIES if s in OFFERED_STRATEGIES)
    """Run with every placement that takes them (colocated: ``v1_sync`` and ``v1_colocate_async``).
    Default: those this installation can run (legacy ``both`` needs the legacy trainer)."""
    regime: str = "recipe"
    """Generation's shape (``scenarios.REGIMES``); the judge's latency comes from the judge model."""
    prompts: int = 32
    """Prompts per step: 32 x 5 = 160 samples, 1/32 of the recipe's, so that a fast served judge's
    request rate stays within what 2 CPU cores serve at the time scale."""
    group_size: int = 5
    """Responses per prompt (the recipe's 5), as in ``BenchSettings``."""
    mini_batches: int = 4
    """Optimizer updates per step (the recipe's 4)."""
    steps: int = 7
    """Steps per (judge, placement, trainer); steps 2..N-2 are averaged (steady state)."""
    time_scale: float = 0.02
    """Real seconds per recipe second."""
    num_workers: int = 2
    """verl reward workers scoring for the judge."""
    seed: int = 0
    """The run's seed, passed to every row's ``BenchSettings.seed``."""
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    """Where ``judge_placement.json`` and the tables are written."""
    progress: bool = True
    """Print a line per finished run."""

    def validate(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError(f"unknown regime {self.regime!r}; choose one of {list(REGIMES)}")
        unknown = [s for s in self.strategies if s not in STANDALONE_STRATEGIES]
        if unknown:
            raise ValueError(
                f"strategies {unknown} are not in the placement benchmark: {STANDALONE_STRATEGIES}"
            )
        if "v1_sync" not in self.strategies:
            raise ValueError("v1_sync must run: the colocated v1_sync row is every ratio's baseline")
        placements(self.judge_gpus)  # each k in 1..7
        for tokens in self.judge_tokens:
            JudgeModel(tokens, self.judge_speed, self.wake_sleep_s)
        slots_per_gpu(self.prompts * self.group_size)
        self.bench_config().validate()

    def bench_config(self) -> BenchConfig:
        """The speed-up benchmark's settings for the shared environment: the server's and the reward
        workers' concurrency is the largest judge's (colocated: the whole batch)."""
        return BenchConfig(
            prompts=self.prompts,
            group_size=self.group_size,
            mini_batches=self.mini_batches,
            capacity=self.prompts * self.group_size,
            steps=self.steps,
            time_scale=self.time_scale,
            regimes=(self.regime,),
            strategies=self.strategies,
            num_workers=self.num_workers,
            seed=self.seed,
            out_dir=self.out_dir,
            progress=self.progress,
            plots=False,
        )


def judge_settings(plan: RunPlan, time_scale: float) -> dict[str, Any]:
    """The local judge's settings for ``plan``: its capacity, and its latency in time-scaled ms."""
    lo, hi = plan.judge_latency_s
    return {"latency_ms": [lo * 1000 * time_scale, hi * 1000 * time_scale], "capacity": plan.judge_capacity}


def _run_plan(
    env: dict[str, Any], cfg: BenchConfig, regime: Regime, plan: RunPlan, tag: int, bar: Any
) -> dict[str, Any]:
    """One (placement, strategy) run: the judge set to the plan's capacity and latency, the policy's
    stages on its GPUs."""
    from async_reward_bench.backend import CalibratedBackend
    from async_reward_bench.report import summarize
    from async_reward_bench.speedup import _run_one
    from async_reward_bench.steady_state import scheduled_staleness
    from async_reward_bench.v1_run import run_v1_strategy

    scale = cfg.time_scale
    env["server"].update_config(**judge_settings(plan, scale))
    stages = plan.stages.scaled(scale)
    if plan.strategy in V1_STRATEGIES:
        run = run_v1_strategy(
            env, cfg, regime, stages, plan.strategy, tag, bar, plan.split, plan.wake_sleep_s
        )
    else:
        run = _run_one(env, CalibratedBackend(stages, env["factory"]), cfg, plan.strategy, tag, bar)
    records = run["records"]
    summary = summarize(
        records,
        scale,
        run["samples"],
        plan.judge_capacity,
        cfg.sample_interval_real,
        staleness=scheduled_staleness(plan.strategy),
    )
    measured = [r for r in records if r.step in summary["measured_steps"]]  # the same window
    phases = [e.duration for r in measured for e in r.events if e.name == "judge"]
    place = plan.placement
    policy = f"{plan.split.rollout}+{plan.split.trainer}" if plan.split else str(place.policy_gpus)
    return {
        "placement": place.name,
        "judge_gpus": place.judge_gpus,
        "policy_gpus": policy,
        "strategy": plan.strategy,
        "step_s": summary["step_s"],
        "step_times_s": summary["step_times_s"],
        "bound_s": plan.bound_s,
        "ratio_to_bound": summary["step_s"] / plan.bound_s,
        "judge_capacity": plan.judge_capacity,
        "judge_latency_s": list(plan.judge_latency_s),
        "judge_work_s": plan.judge_work_s,
        "judge_phase_s": sum(phases) / len(measured) / scale if phases else math.nan,
        # colocated: the batch's longest verdict plus wake and sleep, what the bound counts for it
        "judge_phase_model_s": plan.bound_s - plan.stages.gpu_work_s if place.colocated else math.nan,
        "service_busy_fraction": summary["service_busy_fraction"],
        "staleness": max(summary["staleness"] or [0]),
        "reward_status_ok": summary["reward_status_ok"],
        "scored_during_rollout": run.get("scored_during_rollout", math.nan),
        "load_average_1min": os.getloadavg()[0],
    }


def run_placements(pc: PlacementConfig) -> dict[str, Any]:
    """Every (judge size, placement, strategy) that runs; results also written to ``pc.out_dir``."""
    from async_reward._core.progress import progress_bar
    from async_reward_bench.calibration import load_medians
    from async_reward_bench.environment import bench_environment
    from async_reward_bench.scenarios import regime_stages

    pc.validate()
    cfg = pc.bench_config()
    started = time.perf_counter()
    regime = REGIMES[pc.regime]
    calibrated = regime_stages(regime, load_medians(cfg.calibration_csv)[cfg.calibration_run])
    samples = pc.prompts * pc.group_size
    per_gpu = slots_per_gpu(samples)
    places = placements(pc.judge_gpus)
    runs = [(p, s) for p in places for s in pc.strategies if not p.colocated or s in COLOCATED_STRATEGIES]
    results: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(pc).items()},
        "policy_mean_response_s": mean_response_s(calibrated, regime.gen_sigma, samples),
        "slots_per_gpu": per_gpu,
        "baseline": list(BASELINE),
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_before": os.getloadavg(),
        "judges": {},
    }
    tags = itertools.count()
    bar = progress_bar(len(pc.judge_tokens) * len(runs) * pc.steps, unit="step", enabled=pc.progress)
    with bar, bench_environment(cfg) as env:
        for tokens in pc.judge_tokens:
            judge = JudgeModel(tokens, pc.judge_speed, pc.wake_sleep_s)
            rows: list[dict[str, Any]] = []
            for place in places:
                for strategy in pc.strategies:
                    if place.colocated and strategy not in COLOCATED_STRATEGIES:
                        rows.append({"placement": place.name, "strategy": strategy,
                                     "refused": REFUSED_COLOCATED[strategy]})  # fmt: skip
                        continue
                    bar.set_description(f"judge x{tokens:g} {place.name} {strategy}")
                    plan = plan_run(
                        strategy,
                        place,
                        judge,
                        calibrated,
                        sigma=regime.gen_sigma,
                        samples=samples,
                        per_gpu=per_gpu,
                    )
                    rows.append(_run_plan(env, cfg, regime, plan, next(tags), bar))
            base = next(r["step_s"] for r in rows if (r["placement"], r["strategy"]) == BASELINE)
            for row in rows:
                if "step_s" in row:
                    row["ratio_to_baseline"] = row["step_s"] / base
            results["judges"][f"{tokens:g}"] = {"judge": dataclasses.asdict(judge), "rows": rows}
    results["wall_time_s"] = time.perf_counter() - started
    pc.out_dir.mkdir(parents=True, exist_ok=True)
    (pc.out_dir / "judge_placement.json").write_text(json.dumps(results, indent=2, allow_nan=True) + "\n")
    return results


def format_table(entry: dict[str, Any]) -> str:
    """A markdown table of one judge size's rows."""
    judge = entry["judge"]
    lines = [
        f"judge: {judge['tokens_ratio']:g}x the policy's tokens per sample at {judge['speed']:g}x its "
        f"per-GPU speed, wake + sleep {judge['wake_sleep_s']:g} s",
        "",
        "| placement | policy GPUs | strategy | step (s) | vs baseline | x bound (s) | judge phase / busy "
        "| stale |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in entry["rows"]:
        if "refused" in r:
            lines.append(f"| {r['placement']} | | {r['strategy']} | refused: {r['refused']} | | | | |")
            continue
        if r["judge_gpus"] == 0:
            judge_cell = f"{r['judge_phase_s']:.1f} s a step ({r['judge_phase_model_s']:.1f} modelled)"
        else:
            judge_cell = f"{r['service_busy_fraction'] * 100:.0f} % busy"
        lines.append(
            f"| {r['placement']} | {r['policy_gpus']} | {r['strategy']} | {r['step_s']:.1f} | "
            f"{(r['ratio_to_baseline'] - 1) * 100:+.1f} % | {r['ratio_to_bound']:.2f}x "
            f"({r['bound_s']:.0f}) | {judge_cell} | {r['staleness']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/judge_placement.py [options]``; returns the exit code."""
    defaults = PlacementConfig()
    parser = argparse.ArgumentParser(prog="judge_placement", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--judge-tokens", type=float, nargs="+", help=f"judge sizes (default {defaults.judge_tokens})"
    )
    parser.add_argument(
        "--judge-speed", type=float, help=f"per-GPU speed vs the policy (default {defaults.judge_speed})"
    )
    parser.add_argument(
        "--wake-sleep-s", type=float, help=f"colocated wake + sleep (default {defaults.wake_sleep_s})"
    )
    parser.add_argument(
        "--judge-gpus", type=int, nargs="+", help=f"standalone k (default {defaults.judge_gpus})"
    )
    parser.add_argument("--strategies", nargs="+", choices=STANDALONE_STRATEGIES, help="default: all")
    parser.add_argument(
        "--regime", choices=list(REGIMES), help=f"generation's shape (default {defaults.regime})"
    )
    parser.add_argument("--prompts", type=int, help=f"prompts per step (default {defaults.prompts})")
    parser.add_argument("--steps", type=int, help=f"steps per run (default {defaults.steps})")
    parser.add_argument(
        "--time-scale", type=float, help=f"real s per recipe s (default {defaults.time_scale})"
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", dest="out_dir", type=Path, help="output directory (default bench_out)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    args = vars(parser.parse_args(argv))
    given: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in args.items() if v is not None
    }
    pc = PlacementConfig(**given)
    try:
        pc.validate()
    except ValueError as exc:
        print(f"judge_placement: {exc}")
        return 2
    if not_offered(pc.strategies):
        print(f"judge_placement: {not_offered(pc.strategies)}")
        return 2
    results = run_placements(pc)
    print(
        f"\n{pc.prompts}x{pc.group_size} samples/step, {pc.mini_batches} mini-batches, time scale "
        f"{pc.time_scale:g}, {pc.steps} steps per run (steady state: steps 2..N-2), regime {pc.regime}; "
        f"policy's mean response {results['policy_mean_response_s']:.1f} s; {results['slots_per_gpu']} "
        "sequences per GPU at full speed; baseline: v1_sync with the colocated judge\n"
    )
    for entry in results["judges"].values():
        print(format_table(entry) + "\n")
    load = ", ".join(f"{x:.1f}" for x in results["load_average_before"])
    print(
        f"wall time {results['wall_time_s']:.0f} s; load average {load} on {results['cpus']} CPUs at the "
        "start"
    )
    return 0
