"""Summaries of benchmark runs: steady-state numbers per strategy, tables, and the recipe comparison.

Longer than 400 lines: a run's summary and the tables printed from it, with every flag a figure
carries (below the bound, short of a steady window, saturated or slowed CPUs); the verdict and the
steady-state rule are modules of their own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from async_reward.training.schedule import StepRecord
from async_reward_bench.cpu_use import BUSY_BEFORE_START_SHARE, CPU_SATURATED_SHARE, PROCESS_SATURATED_SHARE
from async_reward_bench.host_speed import HOST_SLOWED_SHARE, slowed_figures
from async_reward_bench.repeats import add_spread
from async_reward_bench.steady_state import STEADY_STATE_RULE, min_steady_steps, steady_window
from async_reward_bench.structure import schedule_facts

__all__ = [
    "BELOW_BOUND_SIGMAS",
    "STEADY_STATE_RULE",
    "add_relative",
    "below_bound_tolerance",
    "busy_machine_warnings",
    "busy_start_warning",
    "busy_time",
    "format_table",
    "measured_steps",
    "probe_lag_ms",
    "service_busy_fraction",
    "summarize",
]

#: How many standard deviations of the window's realised reward work a figure may sit under the
#: bound before it is flagged (see :func:`below_bound_tolerance`).
BELOW_BOUND_SIGMAS = 3.0
_GPU_STAGES = ("rollout", "prepare", "update", "judge")  # judge: one on the training GPUs
_TRAINING_STAGES = ("prepare", "update")
#: A trainer mode's own per-step metrics kept in the summary (our decoupled mode's window, reward
#: queue and prompt ledger).
_MODE_METRICS = ("decoupled/", "ledger/", "reward_queue/", "pipeline/judge_", "pipeline/next_batch")


def busy_time(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` within [start, end] (overlaps counted once)."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def measured_steps(records: Sequence[StepRecord], staleness: int = 0) -> list[StepRecord]:
    """The steps the steady-state averages use at ``staleness`` (see :data:`STEADY_STATE_RULE`)."""
    return list(records[slice(*_window(len(records), staleness)[:2])])


def _window(steps: int, staleness: int) -> tuple[int, int, bool]:
    """``(first, stop, steady)``: the steady window at ``staleness``, else the widest window of a
    lower staleness the run has (``steady`` False), down to steps 1..N-1 (0 for one step)."""
    for s in range(staleness, -1, -1):
        window = steady_window(steps, s)
        if window is not None:
            return (*window, s == staleness)
    return (min(1, steps - 1), steps, False)


def service_busy_fraction(
    samples: Sequence[tuple[float, int, int]], start: float, end: float, capacity: int
) -> float:
    """Mean requests in service / capacity over [start, end], from (time, in service, total) samples
    held until the next one. 1.0 means the service never had a free slot: the schedule is then at the
    realised reward bound, whatever the random latencies of this window added up to."""
    if end <= start or not samples:
        return math.nan
    area = 0.0
    for (t, busy, _), (t_next, _, _) in zip(samples, [*samples[1:], (end, 0, 0)], strict=True):
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            area += busy * (hi - lo)
    return area / ((end - start) * capacity)


def probe_lag_ms(
    samples: Sequence[tuple[float, int, int]], start: float, end: float, interval_s: float
) -> float:
    """Mean delay, in real milliseconds, by which the in-flight sampler's rounds over [start, end]
    exceeded its ``interval_s``: each round waits ``interval_s`` and asks the judge's event loop for
    its counters, so the lag grows when this process or the judge is short of CPU. On an idle
    machine it is about a millisecond; a time-scaled run cannot be trusted when it is many."""
    times = [t for t, _, _ in samples if start <= t <= end]
    if len(times) < 2:
        return math.nan
    return float(np.mean(np.diff(times)) - interval_s) * 1000


def _lag_percentile(
    samples: Sequence[tuple[float, int, int]], start: float, end: float, interval_s: float | None, q: float
) -> float:
    """The ``q``-th percentile of the sampler's rounds beyond ``interval_s``, real milliseconds."""
    times = [t for t, _, _ in samples if start <= t <= end]
    if interval_s is None or len(times) < 2:
        return math.nan
    return float(np.percentile(np.diff(times), q) - interval_s) * 1000


def summarize(
    records: Sequence[StepRecord],
    time_scale: float,
    samples: Sequence[tuple[float, int, int]] = (),
    capacity: int = 1,
    sample_interval_s: float | None = None,
    staleness: int = 0,
) -> dict[str, Any]:
    """Raw and steady-state numbers of one run, in recipe seconds (measured seconds / ``time_scale``).

    ``samples`` are the service's in-flight counters (see ``timeline.InFlightSampler``), taken every
    ``sample_interval_s`` real seconds (which gives ``probe_lag_ms``). Per-step lists include the
    schedule's structure (``structure.schedule_facts``). ``staleness`` is the most the strategy's
    schedule allows (``steady_state.scheduled_staleness``); the window skips the fill-up and drain of
    that or of the most the run reached, whichever is more (``window_staleness``); ``steady_state``
    is False where the run was too short for it (the window is then that of a lower staleness)."""
    reached = max([staleness, *(int(r.staleness) for r in records)])
    first, stop, steady = _window(len(records), reached)
    measured = list(records[first:stop])
    span = sum(r.duration for r in measured)
    gpu = sum(e.duration for r in measured for e in r.events if e.name in _GPU_STAGES)
    window = (measured[0].start, measured[-1].end)

    def share(names: tuple[str, ...]) -> float:
        """Share of the measured time in which any of the ``names`` stages ran."""
        intervals = [(e.start, e.end) for r in measured for e in r.events if e.name in names]
        return busy_time(intervals, *window) / span if span > 0 else math.nan

    lag = (
        probe_lag_ms(samples, measured[0].start, measured[-1].end, sample_interval_s)
        if sample_interval_s is not None
        else math.nan
    )
    return {
        "probe_lag_ms": lag,
        "probe_lag_p90_ms": _lag_percentile(
            samples, measured[0].start, measured[-1].end, sample_interval_s, 90
        ),
        "step_s": float(np.mean([r.duration for r in measured])) / time_scale,
        "reward_blocked_s": float(np.mean([r.reward_blocked_s for r in measured])) / time_scale,
        "gpu_busy_fraction": gpu / span if span > 0 else math.nan,
        # Shares of the measured steps' time (``rollout_idle_fraction``, which depends on where the
        # strategy generates, is added by the caller):
        "generating_fraction": share(("rollout",)),
        "trainer_busy_fraction": share(_TRAINING_STAGES),
        "gpu_stage_fraction": share(_GPU_STAGES),
        "service_busy_fraction": service_busy_fraction(
            samples, measured[0].start, measured[-1].end, capacity
        ),
        "measured_steps": [r.step for r in measured],
        "window_staleness": reached,
        "steady_state": steady,
        "window_samples": sum(r.num_samples for r in measured),
        "step_times_s": [r.duration / time_scale for r in records],
        "reward_blocked_per_step_s": [r.reward_blocked_s / time_scale for r in records],
        "staleness": [r.staleness for r in records],
        "updates_per_step": [len(r.chunk_sizes) for r in records],
        "reward_submit_to_done_s": [
            r.metrics.get("timing_s/reward_submit_to_done", math.nan) / time_scale for r in records
        ],
        "reward_latency_p50_s": [r.metrics.get("reward/latency_p50", math.nan) / time_scale for r in records],
        "reward_status_ok": [r.metrics.get("reward/status_ok", math.nan) for r in records],
        "mode_metrics": {
            key: [r.metrics.get(key, math.nan) for r in records]
            for key in sorted({k for r in records for k in r.metrics if k.startswith(_MODE_METRICS)})
        },
        **schedule_facts(records, time_scale),
    }


def below_bound_tolerance(latency_s: Sequence[float], window_samples: int) -> float:
    """How far under 1 a ratio to the bound may fall by chance, as a fraction of the bound.

    The bound is max(GPU work, reward work / capacity) with the reward work at the *mean* judge
    latency, (lo + hi) / 2 per request; the GPU stages are waits that only run long. A window of
    ``window_samples`` requests realises a latency sum whose relative standard deviation is
    CV / sqrt(n), CV = (hi - lo) / (sqrt(12) (lo + hi) / 2) for the uniform draw (0.55 for every
    regime: each scales lo and hi together). :data:`BELOW_BOUND_SIGMAS` of it: 2.5 % for a full
    run's 7 steps x 640 samples, 5.3 % for ``--quick``'s 3 x 320. Below that the figure is not what a
    steady schedule can do: the window borrowed work scored before it (a fill-up) or left some
    for after it (a drain)."""
    lo, hi = latency_s
    if window_samples < 1 or hi + lo <= 0:
        return 0.0
    cv = (hi - lo) / (math.sqrt(12) * (hi + lo) / 2)
    return BELOW_BOUND_SIGMAS * cv / math.sqrt(window_samples)


def add_relative(
    strategies: dict[str, dict[str, Any]], bound_s: float, latency_s: Sequence[float] | None = None
) -> None:
    """Add ``reduction_vs_baseline`` (a fraction), ``ratio_to_bound`` (to the strategy's own
    ``bound_s`` where its summary has one: a separate strategy's GPU split; else to ``bound_s``) and
    ``ratio_to_colocated_bound`` (to ``bound_s``, the colocated strategies' bound at equal GPUs).

    Also ``bound_tolerance`` (:func:`below_bound_tolerance` of the judge's ``latency_s`` range and the
    summary's ``window_samples``; 0 without them: any figure under the bound is then flagged) and
    ``below_bound``: True, with ``below_bound_reason``, for a ratio under 1 - ``bound_tolerance``,
    which no schedule reaches in steady state (the busiest resource would have to beat itself). A
    summary over repeats (``repeats.combine_repeats``) gets them for each of its ``runs`` too, is
    flagged when any run is, and gets the spread over its runs (``repeats.add_spread``)."""
    base = strategies.get("baseline", {}).get("step_s")
    for summary in strategies.values():
        summary["reduction_vs_baseline"] = 1.0 - summary["step_s"] / base if base else math.nan
        runs = summary.get("runs") or []
        for run in [*runs, summary]:
            _add_ratios(run, summary.get("bound_s", bound_s), bound_s, latency_s)
        flagged = [(i, run) for i, run in enumerate(runs) if run["below_bound"]]
        if flagged and not summary["below_bound"]:  # the mean is in, one run is not
            i, run = flagged[0]
            summary["below_bound"] = True
            summary["below_bound_reason"] = f"run {i + 1} (seed {run['seed']}): {run['below_bound_reason']}"
        add_spread(summary)


def _add_ratios(
    summary: dict[str, Any], own_bound_s: float, bound_s: float, latency_s: Sequence[float] | None
) -> None:
    """``add_relative``'s ratios and below-bound flag for one summary (a run's or the mean's)."""
    summary["ratio_to_bound"] = summary["step_s"] / own_bound_s
    summary["ratio_to_colocated_bound"] = summary["step_s"] / bound_s
    samples = int(summary.get("window_samples", 0))
    tolerance = below_bound_tolerance(latency_s, samples) if latency_s is not None else 0.0
    summary["bound_tolerance"] = tolerance
    summary["below_bound"] = bool(summary["ratio_to_bound"] < 1.0 - tolerance)
    if summary["below_bound"]:
        summary["below_bound_reason"] = below_bound_reason(summary, tolerance)


def below_bound_reason(summary: dict[str, Any], tolerance: float) -> str:
    """Why a flagged figure cannot be a steady-state step time, and what to do about it."""
    steps = summary.get("measured_steps") or []
    window = f"steps {steps[0]}..{steps[-1]}" if steps else "the measured steps"
    staleness = int(summary.get("window_staleness", max(summary.get("staleness") or [0])))
    longer = (
        "run more --steps"
        if summary.get("steady_state", True)
        else f"the run is too short for it: give --steps {min_steady_steps(staleness)} or more"
    )
    return (
        f"{summary['ratio_to_bound']:.3f}x the bound, below 1 - {tolerance:.3f} (what the busiest "
        f"resource allows, less {BELOW_BOUND_SIGMAS:g} sigma of the window's latency draws): {window} "
        f"are not steady state for staleness {staleness} (work scored before the window or left after "
        f"it); {longer}; if it stays, the bound does not hold for this schedule (the colocated bound "
        "counts the whole rollout makespan, which a schedule filling the long tail can beat)"
    )


def format_table(regime: dict[str, Any], targets: dict[str, dict[str, Any]] | None) -> str:
    """A plain-text table of one regime (recipe columns when ``targets`` is given)."""
    head = (
        f"regime {regime['name']}: {regime['description']}\n"
        f"  judge latency uniform {regime['latency_s'][0]:.2f}-{regime['latency_s'][1]:.2f} s, "
        f"reward work / capacity {regime['reward_work_per_capacity_s']:.1f} s, GPU work "
        f"{regime['gpu_work_s']:.1f} s (rollout {regime.get('gen_s', math.nan):.1f} s), bound "
        f"{regime['bound_s']:.1f} s per step (recipe seconds)"
    )
    split = regime.get("gpu_split")
    if split:
        terms = split["terms_s"]
        head += (
            f"\n  separate strategies: {split['rollout']} rollout + {split['trainer']} trainer GPUs of "
            f"{split['total']}, bound max(rollout work {terms['rollout_s']:.1f}, trainer "
            f"{terms['trainer_s']:.1f}, reward {terms['reward_s']:.1f}) = {split['bound_s']:.1f} s "
            f"(weight sync {split['weight_sync_s']:g} s)"
        )
    columns = [
        "strategy",
        "GPUs",
        "step s",
        "vs baseline",
        "x bound",
        "x colocated bound",
        "blocked s",
        "GPU busy",
        "rollout idle",
        "service busy",
        "CPU busy, busiest",
        "stale",
    ]
    repeated = any(int(s.get("repeats", 1)) > 1 for s in regime["strategies"].values())
    if repeated:  # the spread beside each figure: every run's ratio, and (max - min) / mean
        columns[5:5] = ["x bound, runs", "spread"]
    if targets:
        columns += ["recipe step s", "recipe vs base"]
    rows = [columns]
    for name, s in regime["strategies"].items():
        row = [
            name,
            str(s.get("gpus", "")),
            f"{s['step_s']:.1f}",
            "-"
            if name == "baseline" or math.isnan(s["reduction_vs_baseline"])
            else f"{-s['reduction_vs_baseline'] * 100:+.1f}%",
            f"{s['ratio_to_bound']:.3f}"
            + ("!" if s.get("below_bound") else "")
            + ("" if s.get("steady_state", True) else "~"),
            f"{s.get('ratio_to_colocated_bound', math.nan):.3f}",
            f"{s['reward_blocked_s']:.1f}",
            f"{s['gpu_busy_fraction'] * 100:.0f}%",
            f"{s.get('rollout_idle_fraction', math.nan) * 100:.0f}%",
            f"{s['service_busy_fraction'] * 100:.0f}%",
            _cpu_cell(s),
            str(max(s.get("staleness") or [0])),
        ]
        if repeated:
            ratios = s.get("ratio_to_bound_runs") or [s["ratio_to_bound"]]
            row[5:5] = [
                " ".join(f"{r:.3f}" for r in ratios),
                f"{s.get('relative_spread', math.nan) * 100:.1f}%",
            ]
        if targets:
            target = targets.get(name)
            row += (
                [
                    f"{target['step_s']:.1f}",
                    "-" if name == "baseline" else f"{-target['reduction'] * 100:+.1f}%",
                ]
                if target
                else ["", ""]
            )
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = [
        "  "
        + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    notes = (
        [
            f"  ! {name}: {s['below_bound_reason']}"
            for name, s in regime["strategies"].items()
            if s.get("below_bound")
        ]
        + [
            f"  ~ {name}: steps {s['measured_steps'][0]}..{s['measured_steps'][-1]} are short of a steady "
            f"window for staleness {s['window_staleness']} (needs --steps "
            f"{min_steady_steps(s['window_staleness'])} or more)"
            for name, s in regime["strategies"].items()
            if not s.get("steady_state", True)
        ]
        + [
            f"  * {name}: {_cpu_flags(s)}: the harness's own CPU cost, 1/time-scale times heavier in "
            "recipe seconds than in a real run, may be in this figure; rerun with a larger --time-scale"
            for name, s in regime["strategies"].items()
            if _cpu_flags(s)
        ]
    )
    return "\n".join([head, *lines, *notes])


def _cpu_cell(summary: dict[str, Any]) -> str:
    """The machine's CPU busy share and the busiest process's share of one core, then how much slower
    the CPUs ran than in the run's median figure where that passed :data:`HOST_SLOWED_SHARE`
    (:mod:`~async_reward_bench.host_speed`); ``*`` if the figure is flagged (:func:`_cpu_flags`)."""
    machine, busiest = summary.get("cpu_busy_fraction"), summary.get("busiest_process_cpu")
    cells = [f"{x * 100:.0f}%" if x is not None else "-" for x in (machine, busiest)]
    if _host_slowed(summary):
        cells.append(f"slower {float(summary['host_slowdown']) * 100:.0f}%")
    return " ".join(cells) + ("*" if _cpu_flags(summary) else "")


def _cpu_flags(summary: dict[str, Any]) -> str:
    """Why the harness's CPU may weigh in a figure: saturated CPUs, a slowed host, or both (``""``)."""
    return " and ".join(why for why in (_saturation(summary), _host_slowed(summary)) if why)


def _host_slowed(summary: dict[str, Any]) -> str:
    """How much slower the CPUs did the probe's work than in the run's median figure, where that
    passed :data:`HOST_SLOWED_SHARE`, or ``""``."""
    slowdown = float(summary.get("host_slowdown") or 0.0)
    if slowdown <= HOST_SLOWED_SHARE:
        return ""
    return (
        f"the CPUs did the same work {slowdown * 100:.0f} % slower than in this run's median figure "
        f"(over {HOST_SLOWED_SHARE * 100:.0f} %)"
    )


def _saturation(summary: dict[str, Any]) -> str:
    """Why a run's CPUs count as saturated (:mod:`~async_reward_bench.cpu_use`), or ``""``."""
    machine, busiest = summary.get("cpu_busy_fraction"), summary.get("busiest_process_cpu")
    why = []
    if machine is not None and machine > CPU_SATURATED_SHARE:
        why.append(f"the CPUs were {machine * 100:.0f} % busy (over {CPU_SATURATED_SHARE * 100:.0f} %)")
    if busiest is not None and busiest > PROCESS_SATURATED_SHARE:
        why.append(
            f"{summary.get('busiest_process', 'one process')} used {busiest * 100:.0f} % of a core (over "
            f"{PROCESS_SATURATED_SHARE * 100:.0f} %)"
        )
    return " and ".join(why)


def busy_start_warning(busy_before: float | None, cpus: int) -> str:
    """The warning a run prints before it starts when other work keeps the machine busy (``""``
    when it does not, or when the share could not be read)."""
    if busy_before is None or busy_before <= BUSY_BEFORE_START_SHARE:
        return ""
    return (
        f"WARNING: the machine is busy: other work used {busy_before * 100:.0f} % of its {cpus} CPUs just "
        f"before the start (over {BUSY_BEFORE_START_SHARE * 100:.0f} %). Its figures will carry that work "
        "(the harness's CPU counts 1/time-scale times heavier than in a real run): stop it, or read the "
        "figures flagged * as the machine's, not the schedules'"
    )


def busy_machine_warnings(results: dict[str, Any]) -> list[str]:
    """The warnings printed under a run's verdict: the machine busy before the start, every figure
    measured with the CPUs saturated, and every figure measured while the CPUs ran slower than in the
    run's median figure (``*`` in its table), named; empty on a machine quiet and steady enough."""
    lines = []
    start = busy_start_warning(results.get("cpu_busy_before_start"), int(results.get("cpus", 0)))
    if start:
        lines.append(start)
    saturated = [
        f"{regime_name}/{name}"
        for regime_name, regime in results.get("regimes", {}).items()
        for name, summary in regime.get("strategies", {}).items()
        if _saturation(summary)
    ]
    if saturated:
        total = sum(len(regime.get("strategies", {})) for regime in results.get("regimes", {}).values())
        lines.append(
            f"WARNING: {len(saturated)} of {total} figures ran on saturated CPUs ({', '.join(saturated)}; "
            "* in the tables): they include the harness's own CPU cost, not only the schedule's; rerun on a "
            "quiet machine or with a larger --time-scale"
        )
    slowed = slowed_figures(results.get("regimes", {}))
    if slowed:
        total = sum(len(regime.get("strategies", {})) for regime in results.get("regimes", {}).values())
        named = ", ".join(f"{name} {share * 100:.0f} %" for name, share in slowed.items())
        lines.append(
            f"WARNING: {len(slowed)} of {total} figures ran on CPUs that did the same work more than "
            f"{HOST_SLOWED_SHARE * 100:.0f} % slower than in this run's median figure ({named}; * in the "
            "tables): the host slowed (another guest, a lower clock), and the harness's CPU weighs "
            "1/time-scale times heavier in the figures; rerun them, or use a larger --time-scale"
        )
    return lines
