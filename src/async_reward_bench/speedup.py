"""``async-reward bench``: step time of each schedule strategy against a slow, bounded reward service.

The same :class:`~async_reward.training.schedule.StepSchedule` the trainer uses, driven by GPU stages
that are calibrated waits (the recipe's per-stage medians, time-scaled) and by a reward path that is
entirely real: :class:`~async_reward.legacy.PipelinedRewardLoopManager`, its Ray workers, the
``llm_judge`` manager, and HTTP to the local dev server, whose latency is uniform in 1-40 s
(time-scaled) and which serves a fixed number of requests at once.

The recipe's proportions are kept and scaled down together: 1024 prompts x 5 responses with capacity
256 becomes 128 x 5 with capacity 32 (64 x 5 with 16 in ``--quick``), so the service needs the same
share of a step (5120 x 20.5 s / 256 = 410 s). Regimes change the judge latency so that reward work /
capacity is ~1.7x the GPU work (the recipe's), equal to it, or half of it; ``long_tail`` stretches
the rollout 4x with long-tailed response lengths at equal reward and GPU work. Ray and the reward workers
start once per run; every (regime, strategy) run then starts from an idle service.

Our strategies (``baseline``, ``mini_batch``, ``one_step_off``, ``both``, ``recipe_style``) run on the
deprecated legacy trainer's manager and are offered only while ``async_reward.legacy`` is installed;
without it the benchmark runs the v1 strategies alone, with no verdict.

Beside our strategies run verl's own v1 trainer modes ``sync`` and ``colocate_async``
(``benchmark.v1_trainer``): verl's trainer code with the same calibrated GPU stages, each sample
scored as soon as its (simulated) generation finishes by verl's ``RewardLoopWorker`` actors running
the same ``llm_judge`` against the same server. A fourth regime has a long-tailed generation.

The run ends with a verdict on our strategies in the recipe regime (``benchmark.verdict``): one line
first (PASS, FAIL or INCONCLUSIVE), then the tables and the checks. ``--quick`` and ``--check`` exit 1
on FAIL. ``--disable-pipeline`` runs each of our strategies with the baseline schedule under its own
name, to show the verdict failing a pipeline that overlaps nothing (``benchmark.structure``), at any
machine load.

With no options it runs the README's performance table (``scenarios.DEFAULT_STRATEGIES`` over every
regime, 12 steps, time scale 0.02: about 20 minutes on 2 cores); every other strategy on request. It
says loudly when the machine is too busy for its figures: other work before the start, figures run on
saturated CPUs or on CPUs that ran slower than in the run's median figure (``host_speed``).

Outputs: a table per regime on stdout, ``<out>/pipeline_speedup.json`` with the raw numbers and
``<out>/timeline_<regime>_<strategy>.png``.

Longer than 400 lines: the run loop every figure goes through and the command line that sets it
up; each part with an idea of its own is its own module (``scenarios``, ``steady_state``,
``report``, ``verdict``, ``environment``, ``cpu_use``, ``host_speed``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from async_reward.config import dataclass_from_flags
from async_reward_bench.calibration import StageMedians, load_medians, recipe_targets
from async_reward_bench.gpu_split import GpuSplit, colocated_bound, colocated_stages, split_for
from async_reward_bench.scenarios import (
    DEFAULT_REGIMES,
    DEFAULT_STRATEGIES,
    LEGACY_TRAINER,
    OUR_STRATEGIES,
    REGIMES,
    SEPARATE_STRATEGIES,
    STRATEGIES,
    V1_STRATEGIES,
    Regime,
    not_offered,
    regime_latency,
    regime_stages,
)
from async_reward_bench.settings import QUICK, BenchConfig

__all__ = [
    "QUICK",
    "REGIMES",
    "STRATEGIES",
    "BenchConfig",
    "Regime",
    "config_from_args",
    "configure_parser",
    "main",
    "run",
    "run_benchmark",
    "v1_mode_headline",
]


# -- running ----------------------------------------------------------------------------------------


def _run_one(
    env: dict[str, Any], backend: Any, cfg: BenchConfig, strategy: str, tag: int, bar: Any
) -> dict[str, Any]:
    from async_reward.training.schedule import StepSchedule
    from async_reward_bench.recipe_style import SequentialRewards
    from async_reward_bench.timeline import InFlightSampler

    server, manager = env["server"], env["manager"]
    backend.factory.tag = tag
    server.reset()
    source = SequentialRewards(manager) if strategy == "recipe_style" else manager
    timeout = max(60.0, 20 * backend.stages.step_s)
    mode = OUR_STRATEGIES[strategy] if cfg.pipeline else "baseline"  # --disable-pipeline
    schedule = StepSchedule(backend, source, mode, cfg.mini_batches, timeout, keep_batches=False)
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


def _run_summary(
    run: dict[str, Any], cfg: BenchConfig, strategy: str, split: GpuSplit | None, regime: dict[str, Any]
) -> dict[str, Any]:
    """``report.summarize`` of one run, with what depends on where the strategy runs (its GPUs, its
    own bound, its rollout idle time and GPU busy share) and the load it ran under."""
    from async_reward_bench.report import summarize
    from async_reward_bench.steady_state import scheduled_staleness

    result = summarize(
        run["records"],
        cfg.time_scale,
        run["samples"],
        cfg.capacity,
        cfg.sample_interval_real,
        staleness=scheduled_staleness(strategy),
    )
    if strategy in SEPARATE_STRATEGIES:
        assert split is not None
        result["gpus"] = f"{split.rollout}+{split.trainer}"
        result["bound_s"] = regime["gpu_split"]["bound_s"]
        # The standalone rollout GPUs idle whenever nothing decodes; GPU busy is the
        # share of the N GPUs' time used: generating on R, training on T.
        result["rollout_idle_fraction"] = 1.0 - result["generating_fraction"]
        result["gpu_busy_fraction"] = (
            split.rollout * result["generating_fraction"] + split.trainer * result["trainer_busy_fraction"]
        ) / split.total
    else:
        result["gpus"] = str(cfg.total_gpus)
        # Colocated: the GPUs that generate also train; they idle when doing neither.
        result["rollout_idle_fraction"] = 1.0 - result["gpu_stage_fraction"]
    result["load_average_1min"] = os.getloadavg()[0]
    for key in (
        "cpu_busy_fraction",
        "busiest_process",
        "busiest_process_cpu",
        "process_cpu_s_per_step",
        "cpu_unit_ms",
    ):
        if run.get(key) is not None:
            result[key] = run[key]
    if "scored_during_rollout" in run:
        result["scored_during_rollout"] = run["scored_during_rollout"]
    return result


def _rollout_work(regime: Regime, cfg: BenchConfig, calibrated: StageMedians) -> float:
    """Generation work per batch on the calibration's GPUs (``generation.rollout_work``)."""
    from async_reward_bench.generation import rollout_work

    samples = cfg.prompts * cfg.group_size
    return rollout_work(calibrated.gen_s, regime.gen_sigma, samples, cfg.rollout_slots or samples)


def _regime_summary(
    regime: Regime, cfg: BenchConfig, stages: StageMedians, split: GpuSplit | None = None
) -> dict[str, Any]:
    """The regime's numbers: ``stages`` are the colocated ones on ``cfg.total_gpus`` GPUs; ``split``
    (when a separate strategy runs) is applied to the calibration's stages of the regime."""
    latency = regime_latency(regime, cfg.prompts * cfg.group_size, cfg.capacity, stages.gpu_work_s)
    work = cfg.prompts * cfg.group_size * sum(latency) / 2 / cfg.capacity
    summary: dict[str, Any] = {
        "name": regime.name,
        "description": regime.description,
        "latency_s": list(latency),
        "gen_s": stages.gen_s,
        "gen_sigma": regime.gen_sigma,
        "total_gpus": cfg.total_gpus,
        "gpu_work_s": stages.gpu_work_s,
        "reward_work_per_capacity_s": work,
        "bound_s": colocated_bound(stages, work),
        "strategies": {},
    }
    if split is not None:
        calibrated = regime_stages(regime, load_medians(cfg.calibration_csv)[cfg.calibration_run])
        gen_work = _rollout_work(regime, cfg, calibrated)
        summary["gpu_split"] = {
            "total": split.total,
            "rollout": split.rollout,
            "trainer": split.trainer,
            "chosen": "--rollout-gpus" if cfg.rollout_gpus is not None else "best for the regime",
            "weight_sync_s": split.weight_sync_s,
            "rollout_work_s": gen_work,
            "terms_s": split.terms(calibrated, gen_work, work),
            "bound_s": split.bound(calibrated, gen_work, work),
            "model": "linear: decoding time x 8/R, training stages x 8/T (calibration on 8 GPUs); rollout "
            "term: generation work (decoding time summed over a batch / full-speed slots), not makespan",
        }
    return summary


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Run every (regime, strategy) and return the results (also written to ``cfg.out_dir``)."""
    from async_reward._core.progress import progress_bar
    from async_reward_bench.backend import CalibratedBackend
    from async_reward_bench.cpu_use import CpuTimes, ProcessCpu, busy_before_start, busy_share
    from async_reward_bench.environment import bench_environment
    from async_reward_bench.gc_pauses import no_full_collections
    from async_reward_bench.host_speed import add_host_slowdown, host_speed_probe
    from async_reward_bench.repeats import combine_repeats, reseed_judge
    from async_reward_bench.report import STEADY_STATE_RULE, add_relative, busy_start_warning
    from async_reward_bench.timeline import plot_timeline
    from async_reward_bench.verdict import FULL_TOLERANCES, QUICK_TOLERANCES, judge

    cfg.validate()
    # Other work on the machine, before anything of ours starts: said at once, and again under the results.
    busy_before = busy_before_start()
    warning = busy_start_warning(busy_before, len(os.sched_getaffinity(0)))
    if warning:
        print(f"async-reward bench: {warning}", file=sys.stderr, flush=True)
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
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_before": os.getloadavg(),
        "cpu_busy_before_start": busy_before,
        "regimes": {},
    }
    total = len(cfg.regimes) * len(cfg.strategies) * cfg.steps * cfg.repeats
    bar = progress_bar(total, unit="step", enabled=cfg.progress)
    tags = itertools.count()
    with bar, bench_environment(cfg) as env, host_speed_probe() as probe:
        results["setup_s"] = time.perf_counter() - started
        if cfg.judge_faults:  # after the zero-latency warm-up, which must succeed
            env["server"].update_config(fault_rates=cfg.fault_rates)
        separate = [s for s in cfg.strategies if s in SEPARATE_STRATEGIES]
        for regime_name in cfg.regimes:
            regime = REGIMES[regime_name]
            calibrated = regime_stages(regime, stages)
            split = (
                split_for(
                    calibrated,
                    _rollout_work(regime, cfg, calibrated),
                    cfg.total_gpus,
                    cfg.rollout_gpus,
                    cfg.weight_sync_s,
                )
                if separate
                else None
            )
            regime_stage = colocated_stages(calibrated, cfg.total_gpus)
            summary = _regime_summary(regime, cfg, regime_stage, split)
            lo, hi = summary["latency_s"]
            env["server"].update_config(latency_ms=[lo * 1000 * scale, hi * 1000 * scale])
            backend = CalibratedBackend(regime_stage.scaled(scale), env["factory"])
            for strategy in cfg.strategies:
                bar.set_description(f"{regime_name}/{strategy}")
                runs, seeds = [], [cfg.seed + r for r in range(cfg.repeats)]
                for seed in seeds:
                    if cfg.repeats > 1:  # one run keeps the judge as --seed started it
                        reseed_judge(env["server"], seed)
                    env["factory"].seed = seed
                    run_cfg = dataclasses.replace(cfg, seed=seed)
                    with no_full_collections(list(env["actors"].values())):
                        cpu_before, probe_from = CpuTimes.now(), time.monotonic()
                        processes_before = ProcessCpu.now(env["pids"], time.perf_counter())
                        if strategy in V1_STRATEGIES:
                            from async_reward_bench.v1_run import run_v1_strategy

                            on = split if strategy in SEPARATE_STRATEGIES else None  # standalone rollout GPUs
                            run_stages = on.stages(calibrated) if on is not None else regime_stage
                            run = run_v1_strategy(
                                env, run_cfg, regime, run_stages.scaled(scale), strategy, next(tags), bar, on
                            )
                        else:
                            run = _run_one(env, backend, run_cfg, strategy, next(tags), bar)
                    run["cpu_busy_fraction"] = busy_share(cpu_before, CpuTimes.now())
                    run["cpu_unit_ms"] = probe.unit_ms(probe_from, time.monotonic())
                    processes_after = ProcessCpu.now(env["pids"], time.perf_counter())
                    busiest = processes_before.busiest(processes_after, os.sysconf("SC_CLK_TCK"))
                    if busiest is not None:
                        run["busiest_process"], run["busiest_process_cpu"] = busiest
                    spent = processes_before.cpu_seconds(processes_after, os.sysconf("SC_CLK_TCK"))
                    run["process_cpu_s_per_step"] = {name: s / cfg.steps for name, s in spent.items()}
                    runs.append(_run_summary(run, run_cfg, strategy, split, summary))
                    if cfg.plots and seed == cfg.seed:  # the first run's timeline
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
                            separate_rollout=strategy in SEPARATE_STRATEGIES,
                        )
                        runs[0]["timeline_png"] = str(path)
                summary["strategies"][strategy] = combine_repeats(runs, seeds)
            add_relative(summary["strategies"], summary["bound_s"], summary["latency_s"])
            ours = {k: v for k, v in summary["strategies"].items() if k in OUR_STRATEGIES}
            if regime_name == "recipe" and ours:  # the verdict is on our strategies, against the recipe
                tolerances = QUICK_TOLERANCES if cfg.checks == "quick" else FULL_TOLERANCES
                summary["verdict"] = judge(
                    ours,
                    targets,
                    cfg.prompts * cfg.group_size,
                    tolerances,
                    results["cpus"],
                    modes=OUR_STRATEGIES,  # what each should run, also under --disable-pipeline
                    mini_batches=cfg.mini_batches,
                )
            results["regimes"][regime_name] = summary
    add_host_slowdown(results["regimes"])
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
    parser.add_argument(
        "--regimes",
        nargs="+",
        choices=list(REGIMES),
        help=f"regimes to run (default: {' '.join(DEFAULT_REGIMES)})",
    )
    legacy = ", ".join(OUR_STRATEGIES)
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=list(STRATEGIES),
        help=f"strategies (default: {' '.join(DEFAULT_STRATEGIES)}, the README's performance table; "
        "every other one on request). "
        + (
            f"{legacy} run on the deprecated legacy trainer (async_reward.legacy)"
            if LEGACY_TRAINER
            else f"{legacy} are not offered: they need the deprecated legacy trainer "
            "(async_reward.legacy), which is not installed"
        ),
    )
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
    parser.add_argument(
        "--seed", type=int, help="seed of the judge's latency draws, the answers and the response lengths"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="runs of each (regime, strategy), run r with seed + r; the tables give each figure's mean "
        "with every run's and their spread, (max - min) / mean (default 1; 2 checks that each figure "
        "reproduces within 2 %%)",
    )
    parser.add_argument("--out", dest="out_dir", type=Path, help="output directory (default bench_out)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--no-plots", dest="plots", action="store_false", default=None)
    parser.add_argument(
        "--rollout-slots",
        type=int,
        help="sequences the v1 strategies' simulated engine decodes at full speed (default: one batch)",
    )
    parser.add_argument(
        "--total-gpus",
        type=int,
        help=f"GPUs of every strategy, split by the separate ones (default {defaults.total_gpus}, the "
        "calibration's)",
    )
    parser.add_argument(
        "--rollout-gpus",
        type=int,
        help="standalone rollout GPUs of the separate strategies (default: per regime, the split with the "
        "lowest GPU bound)",
    )
    parser.add_argument(
        "--weight-sync-s",
        type=float,
        help="recipe seconds a separate strategy's weight push pauses generation and the trainer, once a "
        f"step (default {defaults.weight_sync_s:g})",
    )
    parser.add_argument(
        "--judge-fault",
        dest="judge_faults",
        action="append",
        metavar="KIND=RATE",
        help="make the judge inject a fault (as 'async-reward serve --fault'), e.g. 400=1 fails every call",
    )
    parser.add_argument(
        "--disable-pipeline",
        dest="pipeline",
        action="store_false",
        default=None,
        help="run every one of our strategies with the baseline schedule (verl's order) under its own "
        "name: shows what the verdict does with a pipeline that overlaps nothing (it must FAIL)",
    )
    parser.add_argument(
        "--checks", choices=("full", "quick"), help="tolerances of the verdict (default: quick with --quick)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the verdict fails (always so with --quick)"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return dataclass_from_flags(BenchConfig, args, QUICK if args.quick else None)


def v1_mode_headline(strategies: dict[str, dict[str, Any]]) -> str:
    """The line ``make bench`` opens with: the schedule to use (our v1 mode, both) against the bound and
    against legacy "both" measured in the same run; ``""`` when it did not run."""
    v1 = strategies.get("v1_pipelined_both")
    if v1 is None:
        return ""
    line = (
        f"v1 mode (trainer.v1.trainer_mode=pipelined, mini_batch, max_staleness=1) at "
        f"{v1['ratio_to_bound']:.3f}x the critical-path bound"
    )
    legacy = strategies.get("both")
    if legacy is not None:
        line += f", {v1['step_s'] / legacy['step_s']:.3f}x the legacy trainer's both (same run)"
    return line


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed arguments; prints the verdict line, then the tables and checks.

    Returns 1 when the recipe regime's verdict is FAIL and ``--check`` or ``--quick`` was given (what
    ``make bench`` runs: a failing first command must say so), 2 on bad settings, else 0 (also for
    INCONCLUSIVE: the machine was too busy to tell, which says nothing against the code).
    """
    from async_reward_bench.report import busy_machine_warnings, format_table
    from async_reward_bench.verdict import summary_line

    cfg = config_from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"async-reward bench: {exc}", file=sys.stderr)
        return 2
    if not_offered(cfg.strategies):
        print(f"async-reward bench: {not_offered(cfg.strategies)}", file=sys.stderr)
        return 2
    results = run_benchmark(cfg)
    verdict = results["regimes"].get("recipe", {}).get("verdict")
    print()
    v1_line = v1_mode_headline(results["regimes"].get("recipe", {}).get("strategies", {}))
    if v1_line:
        print(f"async-reward bench: {v1_line}")
    if verdict is not None:
        print(f"async-reward bench: {summary_line(verdict)}")
    else:
        print("async-reward bench: no verdict (it judges our strategies in the recipe regime; none ran)")
    busy = busy_machine_warnings(results)
    for line in busy:
        print(f"async-reward bench: {line}")
    print(
        f"\n{cfg.prompts}x{cfg.group_size} samples/step, capacity {cfg.capacity}, {cfg.mini_batches} "
        f"mini-batches, time scale {cfg.time_scale:.4g}, {cfg.steps} steps per strategy"
        + (
            f", {cfg.repeats} runs of each (seeds {cfg.seed}..{cfg.seed + cfg.repeats - 1})"
            if cfg.repeats > 1
            else ""
        )
        + ("" if cfg.pipeline else "; PIPELINE DISABLED: every strategy ran the baseline schedule")
    )
    print(f"steady state: {results['steady_state']}\n")
    for name, regime in results["regimes"].items():
        print(format_table(regime, results["recipe"] if name == "recipe" else None))
        if "verdict" in regime:
            for key, check in regime["verdict"]["checks"].items():
                shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in check.items()}
                print(f"  check {key}: {shown}")
            print(f"  verdict: {regime['verdict']['outcome']}")
        print()
    load = ", ".join(f"{x:.1f}" for x in results["load_average_before"])
    if busy:  # again where the output ends, so that no one reads the tables without it
        print(f"async-reward bench: WARNING: the machine was too busy for its figures ({len(busy)} above)")
    print(
        f"wall time {results['wall_time_s']:.1f} s (setup {results['setup_s']:.1f} s); load average "
        f"{load} on {results['cpus']} CPUs at the start; results in {cfg.out_dir / 'pipeline_speedup.json'}"
    )
    failed = verdict is not None and verdict["outcome"] == "FAIL"
    return 1 if failed and (args.check or args.quick) else 0


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/pipeline_speedup.py [options]``; returns the exit code."""
    parser = configure_parser(argparse.ArgumentParser(prog="pipeline_speedup"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
