"""Learning parity's verdict: per-mode statistics over seeds, the noise rule, the table and the plot.

Pure functions of the runs ``async_reward_bench.toy.parity`` records (one dict per mode and seed with its
accuracy curve and times), so the verdict can be checked without training anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["format_summary", "plot_parity", "summarize_parity"]


def _stats(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    std = float(array.std(ddof=1)) if len(array) > 1 else 0.0
    return {"mean": float(array.mean()), "std": std, "min": float(array.min()), "max": float(array.max())}


def summarize_parity(runs: list[dict[str, Any]], modes: tuple[str, ...], tolerance: float) -> dict[str, Any]:
    """Per mode: final and mean-over-curve accuracy, total and step time (mean/std/min/max over seeds);
    per non-reference mode: the difference from the reference and whether it is within noise.

    Within noise: ``|difference of means| <= max(2 x the larger seed std of the two modes, tolerance)``.
    """
    per_mode: dict[str, Any] = {}
    for mode in modes:
        mine = [run for run in runs if run["mode"] == mode]
        per_mode[mode] = {
            key: _stats([run[key] for run in mine])
            for key in ("final_accuracy", "mean_accuracy", "total_time_s", "step_time_s", "reward_blocked_s")
        }
        per_mode[mode]["seeds"] = len(mine)
    reference = modes[0]
    comparisons: dict[str, Any] = {}
    for mode in modes[1:]:
        comparison: dict[str, Any] = {}
        for key in ("final_accuracy", "mean_accuracy"):
            ref, other = per_mode[reference][key], per_mode[mode][key]
            diff = other["mean"] - ref["mean"]
            bound = max(2 * max(ref["std"], other["std"]), tolerance)
            comparison[key] = {"difference": diff, "noise_bound": bound, "within_noise": abs(diff) <= bound}
        ref_t, t = per_mode[reference]["total_time_s"]["mean"], per_mode[mode]["total_time_s"]["mean"]
        comparison["speedup"] = ref_t / t if t > 0 else float("nan")
        comparisons[mode] = comparison
    return {"reference": reference, "modes": per_mode, "comparisons": comparisons}


def format_summary(summary: dict[str, Any]) -> str:
    """The summary table printed at the end of a run."""
    lines = [
        f"{'mode':<14}{'seeds':>6}{'final acc':>18}{'mean acc':>18}{'time/run s':>16}{'step s':>9}",
    ]
    for mode, s in summary["modes"].items():
        fa, ma, tt, st = s["final_accuracy"], s["mean_accuracy"], s["total_time_s"], s["step_time_s"]
        lines.append(
            f"{mode:<14}{s['seeds']:>6}{fa['mean']:>11.3f} ± {fa['std']:.3f}"
            f"{ma['mean']:>11.3f} ± {ma['std']:.3f}{tt['mean']:>9.1f} ± {tt['std']:<4.1f}{st['mean']:>9.3f}"
        )
    for mode, c in summary["comparisons"].items():
        for key in ("final_accuracy", "mean_accuracy"):
            v = c[key]
            verdict = "within noise" if v["within_noise"] else "NOT within noise"
            lines.append(
                f"{mode} vs {summary['reference']}, {key}: {v['difference']:+.3f} "
                f"(bound ±{v['noise_bound']:.3f}) -> {verdict}"
            )
        lines.append(f"{mode} vs {summary['reference']}: {c['speedup']:.2f}x faster in wall time")
    if min(s["seeds"] for s in summary["modes"].values()) < 2:
        lines.append("(one seed: no spread to measure noise with; the verdicts use the tolerance alone)")
    return "\n".join(lines)


def plot_parity(path: Path, runs: list[dict[str, Any]], modes: tuple[str, ...], title: str) -> None:
    """Two panels: accuracy against step and against wall time; mean line and ±1 std band per mode
    (seeds' own curves faint), wall time averaged over seeds at each evaluation step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, mode in enumerate(modes):
        color = f"C{i}"
        mine = [run for run in runs if run["mode"] == mode]
        steps = np.array([p["step"] for p in mine[0]["curve"]])
        acc = np.array([[p["accuracy"] for p in run["curve"]] for run in mine])
        wall = np.array([[p["wall_s"] for p in run["curve"]] for run in mine])
        mean, std = acc.mean(axis=0), acc.std(axis=0, ddof=1) if len(mine) > 1 else np.zeros(acc.shape[1])
        for run_acc, run_wall in zip(acc, wall, strict=True):
            by_step.plot(steps, run_acc, color=color, alpha=0.25, lw=0.8)
            by_time.plot(run_wall, run_acc, color=color, alpha=0.25, lw=0.8)
        label = f"{mode} (n={len(mine)})"
        by_step.plot(steps, mean, color=color, lw=2, label=label)
        by_step.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
        t = wall.mean(axis=0)
        by_time.plot(t, mean, color=color, lw=2, label=label)
        by_time.fill_between(t, mean - std, mean + std, color=color, alpha=0.2)
    by_step.set_xlabel("training step")
    by_time.set_xlabel("wall time (s)")
    by_step.set_ylabel("greedy accuracy (all problems)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
