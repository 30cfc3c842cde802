"""The benchmark's verdict: does the pipeline deliver the recipe's speed-up on a working reward path?

What a run (``--quick`` included) must prove, in the recipe regime, and how each claim is checked:

1. **The reward path works** (``rewards_ok``): every step of every strategy got exactly one ``ok``
   reward per sample. A judge that fails, times out or answers unparsably fails this, whatever the
   timings say (failed requests can even make steps *faster*).
2. **Nothing beats the bound** (``no_strategy_below_bound``): every strategy's step is at least
   ``bound_floor`` x the critical-path bound max(GPU work, reward work / capacity). No schedule can
   go faster than the GPU work or the service's throughput; a run that does measured something else
   (a service with more capacity than configured, latencies not applied, rewards not awaited).
3. **Pipelining pays** (``<strategy>_reduction``): each pipelined strategy cuts the step time versus
   the baseline by at least the recipe's reduction minus ``reduction_margin_points``. Being faster than
   the recipe is not a failure (one-sided). A run with pipelining disabled cuts nothing and fails.
4. **"both" reaches the bound** (``both_at_bound``): its step is at most ``bound_ceiling`` x the bound.
5. **The schedules are pipelined** (``staleness_by_schedule``, ``rollout_overlaps_scoring``,
   ``updates_overlap_scoring``, ``reward_wait_share``; :mod:`async_reward_bench.structure`): the
   order of each strategy's events against the moment its batch's last reward was scored shows the
   overlap its schedule promises (batch k+1 generated while batch k is scored, updates on the first
   chunks while the last are scored, one version stale), and the off-policy strategies spend a
   clearly smaller share of each batch's scoring blocked on it than the baseline.
6. **Every figure is a steady-state one** (``figures_in_steady_state``): no strategy's summary is
   flagged ``below_bound`` by ``report.add_relative`` (a ratio to the bound under 1 less the
   window's statistical tolerance). Such a figure is not broken code (that is check 2's floor) but a
   window that is not steady state for the strategy's staleness: the speed checks cannot be read
   from it, so the run is *inconclusive* (rerun with more ``--steps``), never a pass.

Checks 1, 2 and 5 hold on any machine: a busy CPU makes steps slower, never faster, does not change a
reward's status, and lengthens the real reward path against the calibrated GPU waits, which only
widens the overlaps a pipeline shows; a disabled pipeline shows none at any load. Checks 3 and 4 are
about speed, and a time-scaled run on a CPU that other work starves cannot show it: the reward path's
real CPU time (HTTP, Ray, our managers) is not scaled down with the calibrated waits, so at 1/300 a
millisecond of CPU the run waits for costs 0.3 s of recipe time. Each strategy's run records how
starved it may have been: the lag of the in-flight sampler's rounds through the judge's event loop
(``probe_lag_ms``, see ``report.probe_lag_ms``) and the machine's load average. A speed check that
misses on a run over ``max_probe_lag_ms`` or ``max_load_per_cpu`` is *inconclusive*, not failed.
Neither signal is sharp (our Ray workers can be starved while the probe is not), which is why a
disabled or broken pipeline must fail checks 1, 2 or 5, which never turn inconclusive.

Outcomes: ``FAIL`` (a check failed on a run that could show it), ``INCONCLUSIVE`` (only starved runs
missed, or a figure is flagged below the bound: rerun on a quieter machine, or longer), ``PASS``.
The tolerances come from the spread of repeated runs (see :data:`QUICK_TOLERANCES` and
:data:`FULL_TOLERANCES`), so a healthy machine passes and a broken run fails by a wide margin.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from async_reward_bench.scenarios import OUR_STRATEGIES
from async_reward_bench.structure import STRUCTURAL_CHECKS, structural_checks

__all__ = ["FULL_TOLERANCES", "PIPELINED", "QUICK_TOLERANCES", "Tolerances", "judge", "summary_line"]

#: Strategies whose reduction is checked against the recipe's (the recipe measured these).
PIPELINED: tuple[str, ...] = ("mini_batch", "one_step_off", "both")


@dataclass(frozen=True)
class Tolerances:
    """How far a healthy run may sit from its targets."""

    reduction_margin_points: float
    """A pipelined strategy's reduction versus baseline may fall this many points short of the recipe's."""
    bound_ceiling: float
    """Largest acceptable ratio of "both"'s step to the critical-path bound."""
    bound_floor: float
    """Smallest acceptable ratio of any strategy's step to the bound (below it, the run is broken)."""
    max_probe_lag_ms: float
    """Above this probe lag a run was short of CPU: a speed check it misses is inconclusive."""
    max_load_per_cpu: float = 2.5
    """Above this 1-minute load average per CPU (a quick run alone makes about 1.5) the machine was
    busy with other work: a speed check a run then misses is inconclusive."""


#: ``--quick`` (64 x 5 samples, capacity 16, scale 1/300, 3 measured steps); see the docs (benchmarks) for the
#: runs these come from.
QUICK_TOLERANCES = Tolerances(
    reduction_margin_points=5.0, bound_ceiling=1.08, bound_floor=0.95, max_probe_lag_ms=1.5
)
#: Full run (128 x 5, capacity 32, scale 1/100, 7 measured steps): seven runs put "both" at
#: 1.007-1.033x the bound; 4.5 ms of probe lag is the quick run's 1.5 ms in recipe time.
FULL_TOLERANCES = Tolerances(
    reduction_margin_points=4.0, bound_ceiling=1.05, bound_floor=0.96, max_probe_lag_ms=4.5
)


def judge(
    strategies: dict[str, dict[str, Any]],
    targets: dict[str, dict[str, Any]],
    samples_per_step: int,
    tolerances: Tolerances,
    cpus: int = 1,
    modes: dict[str, str] | None = None,
    mini_batches: int | None = None,
) -> dict[str, Any]:
    """Check one regime's summaries (``report.summarize`` + ``add_relative``) against the recipe.

    ``modes`` maps each strategy to the schedule it is meant to run (default: ``OUR_STRATEGIES``),
    ``mini_batches`` is the updates per step the mini-batch strategies must make (None: not checked).
    Returns ``{"outcome": "PASS" | "FAIL" | "INCONCLUSIVE", "passed": bool, "failed": [...],
    "inconclusive": [...], "starved": {strategy: why}, "checks": {name: {..., "ok": bool}},
    "tolerances": {...}}``. Checks that need a strategy the run left out are not made.
    """
    checks: dict[str, dict[str, Any]] = {}
    not_ok: dict[str, int] = {}
    total = 0
    for name, summary in strategies.items():
        counts = [c for run in summary.get("runs") or [summary] for c in run.get("reward_status_ok", [])]
        for count in counts:  # every repeat's steps
            total += samples_per_step
            ok = int(count) if isinstance(count, (int, float)) and math.isfinite(count) else 0
            if ok != samples_per_step:  # fewer: failures; more: a sample counted twice
                not_ok[name] = not_ok.get(name, 0) + abs(samples_per_step - ok)
    checks["rewards_ok"] = {
        "rewards": total,
        "not_ok": sum(not_ok.values()),
        "not_ok_by_strategy": not_ok,
        "ok": total > 0 and not not_ok,
    }
    if strategies:
        lowest = min(strategies, key=lambda name: strategies[name]["ratio_to_bound"])
        ratio = strategies[lowest]["ratio_to_bound"]
        checks["no_strategy_below_bound"] = {
            "lowest": lowest,
            "ratio": ratio,
            "floor": tolerances.bound_floor,
            "ok": bool(ratio >= tolerances.bound_floor),
        }
    for name in PIPELINED:
        if name not in strategies or name not in targets or "baseline" not in strategies:
            continue
        ours = strategies[name]["reduction_vs_baseline"] * 100
        recipe = targets[name]["reduction"] * 100
        needed = recipe - tolerances.reduction_margin_points
        checks[f"{name}_reduction"] = {
            "ours_pct": ours,
            "recipe_pct": recipe,
            "needed_pct": needed,
            "timed": ["baseline", name],
            "ok": bool(ours >= needed),
        }
    if "both" in strategies:
        ratio = strategies["both"]["ratio_to_bound"]
        checks["both_at_bound"] = {
            "ours": ratio,
            "ceiling": tolerances.bound_ceiling,
            "recipe": targets.get("both", {}).get("ratio_to_bound", math.nan),
            "timed": ["both"],
            "ok": bool(ratio <= tolerances.bound_ceiling),
        }
    flagged = {name: s["below_bound_reason"] for name, s in strategies.items() if s.get("below_bound")}
    checks["figures_in_steady_state"] = {"below_bound": flagged, "ok": not flagged}
    checks.update(structural_checks(strategies, OUR_STRATEGIES if modes is None else modes, mini_batches))
    starved: dict[str, str] = {}
    for name, s in strategies.items():
        lag, load = float(s.get("probe_lag_ms", math.nan)), float(s.get("load_average_1min", math.nan))
        if lag > tolerances.max_probe_lag_ms or load > tolerances.max_load_per_cpu * cpus:
            starved[name] = f"probe lag {lag:.1f} ms, load average {load:.1f} on {cpus} CPUs"
    failed, inconclusive = [], []
    for name, check in checks.items():
        if check["ok"]:
            continue
        if name == "figures_in_steady_state" or any(timed in starved for timed in check.get("timed", ())):
            check["inconclusive"] = True
            inconclusive.append(name)
        else:
            failed.append(name)
    outcome = "FAIL" if failed else "INCONCLUSIVE" if inconclusive else "PASS"
    return {
        "outcome": outcome,
        "passed": outcome == "PASS",
        "failed": failed,
        "inconclusive": inconclusive,
        "starved": starved,
        "checks": checks,
        "tolerances": asdict(tolerances),
    }


def summary_line(verdict: dict[str, Any]) -> str:
    """One line: the outcome, "both" against the bound, each reduction against the recipe's, rewards."""
    checks, tol = verdict["checks"], verdict["tolerances"]
    outcome = verdict["outcome"]
    head = outcome
    if outcome == "FAIL":
        head += f" ({', '.join(verdict['failed'])})"
    elif outcome == "INCONCLUSIVE":
        said = []
        starved_misses = [name for name in verdict["inconclusive"] if name != "figures_in_steady_state"]
        if starved_misses:
            why = "; ".join(f"{name}: {reason}" for name, reason in verdict["starved"].items())
            said.append(
                f"{', '.join(starved_misses)} missed while the CPU was too busy to time the "
                f"pipeline ({why}; allowed {tol['max_probe_lag_ms']:g} ms, {tol['max_load_per_cpu']:g} per "
                "CPU); rerun when the machine is quieter"
            )
        below = checks.get("figures_in_steady_state", {}).get("below_bound", {})
        if below:
            said.append(
                f"{', '.join(below)} below the bound: not a steady-state figure (see the table's notes); "
                "rerun with more --steps"
            )
        head += f" ({'; '.join(said)})"
    parts = []
    if "both_at_bound" in checks:
        parts.append(
            f"both at {checks['both_at_bound']['ours']:.3f}x the critical-path bound "
            f"(allowed {tol['bound_floor']:.2f}-{tol['bound_ceiling']:.2f}x)"
        )
    reductions = [
        f"{name} {-check['ours_pct']:+.1f}% (recipe {-check['recipe_pct']:+.1f}%)"
        for name in PIPELINED
        if (check := checks.get(f"{name}_reduction")) is not None
    ]
    if reductions:
        parts.append(
            "step vs baseline: "
            + ", ".join(reductions)
            + f", each at most {tol['reduction_margin_points']:g} points short of the recipe"
        )
    rewards = checks["rewards_ok"]
    parts.append(
        f"{rewards['rewards']} rewards, all ok"
        if rewards["ok"]
        else f"{rewards['not_ok']} of {rewards['rewards']} rewards not ok"
    )
    lowest = checks.get("no_strategy_below_bound")
    if lowest is not None and not lowest["ok"]:
        parts.append(f"{lowest['lowest']} at {lowest['ratio']:.3f}x the bound: faster than possible")
    parts.append(_structure_phrase(checks))
    return f"{head}: " + "; ".join(part for part in parts if part)


def _structure_phrase(checks: dict[str, dict[str, Any]]) -> str:
    """What the structural checks saw, in a few words (empty when none was made)."""
    made = [name for name in STRUCTURAL_CHECKS if name in checks]
    if not made:
        return ""
    if all(checks[name]["ok"] for name in made):
        return "schedules overlap scoring as designed"
    said = []
    if not (check := checks.get("staleness_by_schedule", {"ok": True}))["ok"]:
        said.append(f"wrong staleness in {', '.join(check['wrong'])}")
    if not (check := checks.get("rollout_overlaps_scoring", {"ok": True}))["ok"]:
        said.append(f"next batch not rolled out during scoring in {', '.join(check['failing'])}")
    if not (check := checks.get("updates_overlap_scoring", {"ok": True}))["ok"]:
        said.append(f"no updates during scoring in {', '.join(check['failing'])}")
    if not (check := checks.get("reward_wait_share", {"ok": True}))["ok"]:
        ratios = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in check["ratio_to_baseline"].items())
        said.append(f"share of scoring spent blocked vs baseline's: {ratios} (max {check['ceiling']:g}x)")
    return "pipeline not working: " + "; ".join(said)
