"""The benchmark's verdict, on constructed results: right in both directions.

A healthy run passes (also when it beats the recipe); a run with pipelining disabled, a broken
reward path, or a service of the wrong capacity fails; a run that missed only while starved of CPU
is inconclusive, never a pass. The numbers of ``healthy()`` are those of a real quick run.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from async_reward.benchmark.calibration import load_medians, recipe_targets
from async_reward.benchmark.report import add_relative
from async_reward.benchmark.verdict import FULL_TOLERANCES, QUICK_TOLERANCES, judge, summary_line

SAMPLES = 320
BOUND = 410.0
TARGETS = recipe_targets(load_medians())


def healthy() -> dict[str, dict[str, Any]]:
    """A quick run on a quiet machine (steps in recipe seconds, 6 steps, 1 ms probe lag)."""
    steps = {
        "baseline": 607.4,
        "mini_batch": 516.9,
        "one_step_off": 422.8,
        "both": 420.7,
        "recipe_style": 447.2,
    }
    return {
        name: {
            "step_s": step,
            "reward_status_ok": [SAMPLES] * 6,
            "probe_lag_ms": 0.8,
            "load_average_1min": 2.9,
        }
        for name, step in steps.items()
    }


def verdict_of(strategies: dict[str, dict[str, Any]], tolerances: Any = QUICK_TOLERANCES) -> dict[str, Any]:
    strategies = copy.deepcopy(strategies)
    add_relative(strategies, BOUND)
    return judge(strategies, TARGETS, SAMPLES, tolerances, cpus=2)


def test_a_healthy_run_passes_and_says_so_in_one_line():
    verdict = verdict_of(healthy())
    assert verdict["outcome"] == "PASS" and verdict["passed"], verdict
    line = summary_line(verdict)
    assert line.startswith("PASS: both at 1.026x the critical-path bound")
    assert "one_step_off -30.4% (recipe -27.5%)" in line and "9600 rewards, all ok" in line
    assert "\n" not in line


def test_being_faster_than_the_recipe_is_not_a_failure():
    run = healthy()
    run["both"]["step_s"] = run["one_step_off"]["step_s"] = 412.0  # -32 %, recipe -27.5 %
    run["mini_batch"]["step_s"] = 480.0  # -21 %, recipe -13 %
    assert verdict_of(run)["outcome"] == "PASS"


def test_pipeline_disabled_fails_even_with_rewards_all_ok():
    run = healthy()
    for name in ("mini_batch", "one_step_off", "both", "recipe_style"):
        run[name]["step_s"] = run["baseline"]["step_s"] * 1.002  # every strategy runs verl's order
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL"
    assert set(verdict["failed"]) == {
        "mini_batch_reduction",
        "one_step_off_reduction",
        "both_reduction",
        "both_at_bound",
    }
    assert summary_line(verdict).startswith("FAIL (")


def test_one_strategy_short_of_the_recipe_by_more_than_the_margin_fails():
    run = healthy()
    run["one_step_off"]["step_s"] = 607.4 * (1 - 0.275 + 0.06)  # 6 points short of the recipe's 27.5 %
    assert verdict_of(run)["failed"] == ["one_step_off_reduction"]


@pytest.mark.parametrize(
    ("ok_per_step", "why"),
    [
        (0, "a judge that fails every request"),
        (SAMPLES - 3, "three samples failed"),
        (SAMPLES + 1, "counted twice"),
    ],
)
def test_a_broken_reward_path_fails_whatever_the_timings(ok_per_step, why):
    run = healthy()
    run["both"]["reward_status_ok"] = [SAMPLES] * 5 + [ok_per_step]
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL" and verdict["failed"] == ["rewards_ok"], why
    assert verdict["checks"]["rewards_ok"]["not_ok"] == abs(SAMPLES - ok_per_step)
    assert "rewards not ok" in summary_line(verdict)


def test_missing_reward_counts_fail():
    run = healthy()
    run["baseline"]["reward_status_ok"] = [math.nan] * 6  # a source that reported no statuses
    assert verdict_of(run)["failed"] == ["rewards_ok"]


def test_a_service_with_more_capacity_than_configured_is_faster_than_possible():
    run = healthy()
    for summary in run.values():  # twice the slots: the reward work halves, steps shrink toward GPU work
        summary["step_s"] *= 0.6
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL" and "no_strategy_below_bound" in verdict["failed"]
    assert "faster than possible" in summary_line(verdict)


def test_a_service_with_less_capacity_than_configured_misses_the_bound():
    run = healthy()
    for summary in run.values():
        summary["step_s"] *= 1.5
    assert "both_at_bound" in verdict_of(run)["failed"]


def test_a_starved_run_is_inconclusive_not_failed_nor_passed():
    run = healthy()
    run["mini_batch"].update(step_s=727.0, probe_lag_ms=23.0)  # slower than baseline: CPU-starved
    verdict = verdict_of(run)
    assert verdict["outcome"] == "INCONCLUSIVE" and not verdict["passed"]
    assert verdict["inconclusive"] == ["mini_batch_reduction"] and list(verdict["starved"]) == ["mini_batch"]
    assert "probe lag 23.0 ms" in verdict["starved"]["mini_batch"]
    assert "INCONCLUSIVE" in summary_line(verdict) and "rerun" in summary_line(verdict)


def test_starvation_never_excuses_what_cpu_load_cannot_cause():
    run = healthy()
    for summary in run.values():
        summary["probe_lag_ms"] = 50.0
    run["both"]["reward_status_ok"] = [0] * 6  # statuses do not depend on load
    run["one_step_off"]["step_s"] = 300.0  # nor does a step faster than the bound
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL"
    assert set(verdict["failed"]) == {"rewards_ok", "no_strategy_below_bound"}


def test_a_busy_machine_makes_a_miss_inconclusive_too():
    run = healthy()
    run["both"].update(step_s=520.0, load_average_1min=17.6)  # other engineers' jobs: load 17.6 on 2 CPUs
    verdict = verdict_of(run)
    assert verdict["outcome"] == "INCONCLUSIVE" and "load average 17.6 on 2 CPUs" in summary_line(verdict)


def test_a_starved_strategy_that_still_met_its_checks_passes():
    run = healthy()
    run["recipe_style"]["probe_lag_ms"] = 40.0
    assert verdict_of(run)["outcome"] == "PASS"


def test_full_run_tolerances_are_tighter():
    assert FULL_TOLERANCES.bound_ceiling < QUICK_TOLERANCES.bound_ceiling
    assert FULL_TOLERANCES.reduction_margin_points <= QUICK_TOLERANCES.reduction_margin_points


def test_checks_needing_a_strategy_left_out_are_not_made():
    run = {k: v for k, v in healthy().items() if k in ("baseline", "both")}
    verdict = verdict_of(run)
    assert set(verdict["checks"]) == {
        "rewards_ok",
        "no_strategy_below_bound",
        "both_reduction",
        "both_at_bound",
    }
    assert verdict["outcome"] == "PASS"
