"""``async-reward bench``: step time of each schedule strategy against a slow, bounded reward service.

The same :class:`~async_reward.pipeline.schedule.StepSchedule` the trainer uses, driven by GPU stages
that are calibrated waits (the recipe's per-stage medians, time-scaled) and by a reward path that is
entirely real: :class:`~async_reward.pipeline.PipelinedRewardLoopManager`, its Ray workers, the
``llm_judge`` manager, and HTTP to the local dev server, whose latency is uniform in 1-40 s
(time-scaled) and which serves a fixed number of requests at once.

The recipe's proportions are kept and scaled down together: 1024 prompts x 5 responses with capacity
256 becomes 128 x 5 with capacity 32 (64 x 5 with 16 in ``--quick``), so the service needs the same
share of a step (5120 x 20.5 s / 256 = 410 s). Regimes change the judge latency so that reward work /
capacity is ~1.7x the GPU work (the recipe's), equal to it, or half of it. Ray and the reward workers
start once per run; every (regime, strategy) run then starts from an idle service.

Outputs: a table per regime on stdout, ``<out>/pipeline_speedup.json`` with the raw numbers and
``<out>/timeline_<regime>_<strategy>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from async_reward.benchmark.calibration import RECIPE_SERVICE, StageMedians, load_medians, recipe_targets
from async_reward.config import dataclass_from_flags

__all__ = [
    "QUICK",
    "REGIMES",
    "STRATEGIES",
    "BenchConfig",
    "Regime",
    "config_from_args",
    "configure_parser",
    "main",
    "regime_latency",
    "run",
    "run_benchmark",
]

#: Strategy -> schedule mode. ``recipe_style`` is "both" with the recipe's admission: batch k+1's
#: rewards start only when all of batch k's are in (instead of taking the slots batch k leaves free).
STRATEGIES: dict[str, str] = {
    "baseline": "baseline",
    "mini_batch": "mini_batch",
    "one_step_off": "one_step_off",
    "both": "both",
    "recipe_style": "both",
}


@dataclass(frozen=True)
class Regime:
    """How loaded the reward service is relative to the GPU."""

    name: str
    reward_to_gpu: float | None
    """Target (reward work / capacity) / GPU work, reached by scaling the judge latency; None keeps
    the recipe's uniform 1-40 s."""
    description: str


REGIMES: dict[str, Regime] = {
    "recipe": Regime("recipe", None, "the recipe's judge latency, reward-bound"),
    "balanced": Regime("balanced", 1.0, "latency scaled so reward work / capacity = GPU work"),
    "gpu_bound": Regime("gpu_bound", 0.5, "latency scaled so reward work / capacity = 0.5 x GPU work"),
}


@dataclass
class BenchConfig:
    """One benchmark run. Times are recipe seconds unless named ``*_real``."""

    prompts: int = 128
    """Prompts per step (the recipe: 1024)."""
    group_size: int = 5
    """Responses per prompt (the recipe: 5)."""
    mini_batches: int = 4
    """Optimizer updates per step (the recipe: 4)."""
    capacity: int = 32
    """Requests the judge serves at once (the recipe: 256 for 1024 prompts)."""
    steps: int = 10
    """Steps per (regime, strategy); see ``report.STEADY_STATE_RULE`` for which are averaged."""
    time_scale: float = 0.01
    """Real seconds per recipe second: 0.01 runs a 585.7 s step in 5.9 s."""
    regimes: tuple[str, ...] = tuple(REGIMES)
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    calibration_run: str = "gsm8k_qwen2_7b_base"
    """CSV row whose stage medians the GPU stages sleep."""
    calibration_csv: str | None = None
    """Calibration CSV (default: the copy shipped with the package)."""
    num_workers: int = 2
    """Ray reward workers (``reward.num_workers``)."""
    server: str = "thread"
    """Where the judge runs: ``thread`` (a thread of this process) or ``process`` (a child process,
    which keeps it off this process's GIL; measured no different here, and slower to start)."""
    worker_concurrency: int | None = None
    """Samples each worker scores at once (``limits.max_concurrency``). None: ``capacity``, so that
    the service, not our admission, is the bottleneck even when one worker holds all the work."""
    seed: int = 0
    sample_interval_real: float = 0.05
    """Real seconds between samples of the service's in-flight counters (for the timelines)."""
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    progress: bool = True
    plots: bool = True

    @property
    def per_worker_concurrency(self) -> int:
        return self.worker_concurrency or self.capacity

    def validate(self) -> None:
        unknown = [r for r in self.regimes if r not in REGIMES] + [
            s for s in self.strategies if s not in STRATEGIES
        ]
        if unknown:
            raise ValueError(f"unknown regime(s)/strategy(ies) {unknown}")
        if min(self.prompts, self.group_size, self.mini_batches, self.capacity, self.steps) < 1:
            raise ValueError("prompts, group size, mini-batches, capacity and steps must be >= 1")
        if self.prompts % self.mini_batches:
            raise ValueError(f"{self.prompts} prompts cannot be split into {self.mini_batches} mini-batches")
        if self.server not in ("process", "thread"):
            raise ValueError(f"server must be 'process' or 'thread', got {self.server!r}")
        if not 0 < self.time_scale <= 1:
            raise ValueError(f"time scale must be in (0, 1], got {self.time_scale}")


#: ``--quick`` (what ``make bench`` runs): the recipe regime only, half the samples with half the
#: capacity (the same service share), 6 steps (3 measured), a faster clock. About 100 s on 2 cores,
#: of which ~40 s are imports, Ray and worker start-up.
QUICK: dict[str, Any] = {
    "prompts": 64,
    "capacity": 16,
    "steps": 6,
    "time_scale": 1 / 300,
    "regimes": ("recipe",),
}


def regime_latency(regime: Regime, cfg: BenchConfig, gpu_work_s: float) -> tuple[float, float]:
    """The judge's latency range (recipe seconds) that puts the service at the regime's load."""
    lo, hi = RECIPE_SERVICE.latency_s
    if regime.reward_to_gpu is None:
        return lo, hi
    work = cfg.prompts * cfg.group_size * (lo + hi) / 2 / cfg.capacity
    factor = regime.reward_to_gpu * gpu_work_s / work
    return lo * factor, hi * factor


# -- running ----------------------------------------------------------------------------------------


def _run_one(
    env: dict[str, Any], backend: Any, cfg: BenchConfig, strategy: str, tag: int, bar: Any
) -> dict[str, Any]:
    from async_reward.benchmark.recipe_style import SequentialRewards
    from async_reward.benchmark.timeline import InFlightSampler
    from async_reward.pipeline.schedule import StepSchedule

    server, manager = env["server"], env["manager"]
    backend.factory.tag = tag
    server.reset()
    source = SequentialRewards(manager) if strategy == "recipe_style" else manager
    timeout = max(60.0, 20 * backend.stages.step_s)
    schedule = StepSchedule(
        backend, source, STRATEGIES[strategy], cfg.mini_batches, timeout, keep_batches=False
    )
    sampler = InFlightSampler(server.stats, cfg.sample_interval_real).start()
    origin = time.perf_counter()
    records = []
    try:
        for record in schedule.steps(cfg.steps):
            records.append(record)
            bar.update(1)
    finally:
        samples = sampler.stop()
        if isinstance(source, SequentialRewards):
            source.close()
    return {"records": records, "samples": samples, "origin": origin}


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Run every (regime, strategy) and return the results (also written to ``cfg.out_dir``)."""
    from async_reward.benchmark.backend import CalibratedBackend
    from async_reward.benchmark.environment import bench_environment
    from async_reward.benchmark.report import STEADY_STATE_RULE, acceptance, add_relative, summarize
    from async_reward.benchmark.timeline import plot_timeline
    from async_reward.progress import progress_bar

    cfg.validate()
    started = time.perf_counter()
    medians = load_medians(cfg.calibration_csv)
    stages: StageMedians = medians[cfg.calibration_run]
    targets = recipe_targets(medians)
    scale = cfg.time_scale
    results: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
        "stages_s": dataclasses.asdict(stages),
        "steady_state": STEADY_STATE_RULE,
        "recipe": targets,
        "regimes": {},
    }
    total = len(cfg.regimes) * len(cfg.strategies) * cfg.steps
    bar = progress_bar(total, unit="step", enabled=cfg.progress)
    tags = itertools.count()
    with bar, bench_environment(cfg) as env:
        results["setup_s"] = time.perf_counter() - started
        backend = CalibratedBackend(stages.scaled(scale), env["factory"])
        for regime_name in cfg.regimes:
            regime = REGIMES[regime_name]
            latency = regime_latency(regime, cfg, stages.gpu_work_s)
            env["server"].update_config(latency_ms=[latency[0] * 1000 * scale, latency[1] * 1000 * scale])
            work = cfg.prompts * cfg.group_size * sum(latency) / 2 / cfg.capacity
            summary: dict[str, Any] = {
                "name": regime_name,
                "description": regime.description,
                "latency_s": list(latency),
                "gpu_work_s": stages.gpu_work_s,
                "reward_work_per_capacity_s": work,
                "bound_s": max(stages.gpu_work_s, work),
                "strategies": {},
            }
            for strategy in cfg.strategies:
                bar.set_description(f"{regime_name}/{strategy}")
                run = _run_one(env, backend, cfg, strategy, next(tags), bar)
                summary["strategies"][strategy] = summarize(
                    run["records"], scale, run["samples"], cfg.capacity
                )
                if cfg.plots:
                    path = cfg.out_dir / f"timeline_{regime_name}_{strategy}.png"
                    title = (
                        f"{regime_name} regime, {strategy}: {cfg.prompts}x{cfg.group_size} samples, "
                        f"capacity {cfg.capacity}, time scale {scale:.4g}"
                    )
                    plot_timeline(
                        path,
                        run["records"],
                        run["samples"],
                        title=title,
                        capacity=cfg.capacity,
                        time_scale=scale,
                        origin=run["origin"],
                    )
                    summary["strategies"][strategy]["timeline_png"] = str(path)
            add_relative(summary["strategies"], summary["bound_s"])
            if regime_name == "recipe":
                summary["acceptance"] = acceptance(summary["strategies"], targets)
            results["regimes"][regime_name] = summary
    results["wall_time_s"] = time.perf_counter() - started
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "pipeline_speedup.json").write_text(json.dumps(results, indent=2, allow_nan=True) + "\n")
    return results


# -- command line -------------------------------------------------------------------------------------


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the benchmark's options to ``parser`` (used by ``async-reward bench`` and the script)."""
    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    defaults = BenchConfig()
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"recipe regime only, fewer steps and samples (under 2 minutes): {QUICK}",
    )
    parser.add_argument("--steps", type=int, help=f"steps per strategy (default {defaults.steps})")
    parser.add_argument(
        "--time-scale", type=float, help=f"real seconds per recipe second (default {defaults.time_scale})"
    )
    parser.add_argument("--prompts", type=int, help=f"prompts per step (default {defaults.prompts})")
    parser.add_argument(
        "--group-size", type=int, help=f"responses per prompt (default {defaults.group_size})"
    )
    parser.add_argument(
        "--capacity", type=int, help=f"judge's concurrent requests (default {defaults.capacity})"
    )
    parser.add_argument(
        "--mini-batches", type=int, help=f"updates per step (default {defaults.mini_batches})"
    )
    parser.add_argument("--regimes", nargs="+", choices=list(REGIMES), help="regimes to run (default: all)")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), help="strategies (default: all)")
    parser.add_argument(
        "--calibration", dest="calibration_csv", help="calibration CSV (default: shipped copy)"
    )
    parser.add_argument(
        "--calibration-run", help=f"CSV row of the GPU stages (default {defaults.calibration_run})"
    )
    parser.add_argument(
        "--num-workers", type=int, help=f"Ray reward workers (default {defaults.num_workers})"
    )
    parser.add_argument(
        "--worker-concurrency", type=int, help="samples each reward worker scores at once (default: capacity)"
    )
    parser.add_argument(
        "--server",
        choices=("process", "thread"),
        help="run the judge in a thread (default) or a child process",
    )
    parser.add_argument("--seed", type=int, help="seed of the judge's latency draws and of the answers")
    parser.add_argument("--out", dest="out_dir", type=Path, help="output directory (default bench_out)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--no-plots", dest="plots", action="store_false", default=None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the recipe regime misses the acceptance targets"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return dataclass_from_flags(BenchConfig, args, QUICK if args.quick else None)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed arguments; prints the tables, returns the exit code."""
    from async_reward.benchmark.report import format_table

    cfg = config_from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"async-reward bench: {exc}", file=sys.stderr)
        return 2
    results = run_benchmark(cfg)
    print(
        f"\nasync-reward bench: {cfg.prompts}x{cfg.group_size} samples/step, capacity {cfg.capacity}, "
        f"{cfg.mini_batches} mini-batches, time scale {cfg.time_scale:.4g}, {cfg.steps} steps per strategy"
    )
    print(f"steady state: {results['steady_state']}\n")
    for name, regime in results["regimes"].items():
        print(format_table(regime, results["recipe"] if name == "recipe" else None))
        checks = regime.get("acceptance")
        if checks:
            for key, check in checks.items():
                if isinstance(check, dict):
                    shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in check.items()}
                    print(f"  check {key}: {shown}")
            print(f"  acceptance: {'PASS' if checks['all_ok'] else 'MISS'}")
        print()
    print(
        f"wall time {results['wall_time_s']:.1f} s (setup {results['setup_s']:.1f} s); "
        f"results in {cfg.out_dir / 'pipeline_speedup.json'}"
    )
    recipe = results["regimes"].get("recipe", {}).get("acceptance")
    return 1 if args.check and recipe is not None and not recipe["all_ok"] else 0


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/pipeline_speedup.py [options]``; returns the exit code."""
    parser = configure_parser(argparse.ArgumentParser(prog="pipeline_speedup"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
