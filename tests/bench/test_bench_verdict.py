"""The benchmark's verdict, on constructed results: right in both directions.

A healthy run passes (also when it beats the recipe); a run with pipelining disabled, a broken
reward path, or a service of the wrong capacity fails; a run that missed only while starved of CPU
is inconclusive, never a pass, unless its schedule's structure shows the pipeline was not working:
that fails at any load. The numbers of ``healthy()`` are those of a real quick run.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from async_reward_bench.calibration import load_medians, recipe_targets
from async_reward_bench.report import add_relative
from async_reward_bench.verdict import FULL_TOLERANCES, QUICK_TOLERANCES, judge, summary_line

SAMPLES = 320
MINI_BATCHES = 4
BOUND = 410.0
TARGETS = recipe_targets(load_medians())


NAN = math.nan
#: The schedule's structure per strategy in a real quick run on a quiet machine (recipe seconds, 6
#: steps; ``structure.schedule_facts``): staleness, reward waits per step, leads of the next batch's
#: submission and of the first update over the moment the batch's last reward was scored, and the
#: share of that scoring time the trainer spent blocked.
HEALTHY_STRUCTURE: dict[str, dict[str, list[float]]] = {
    "baseline": {
        "staleness": [0, 0, 0, 0, 0, 0],
        "reward_waits_per_step": [1] * 6,
        "rollout_lead_s": [-164, -161, -162, -160, -161, NAN],
        "update_lead_s": [-4, -3, -4, -3, -4, -4],
        "reward_wait_share": [0.81, 0.81, 0.83, 0.81, 0.82, 0.83],
    },
    "mini_batch": {
        "staleness": [0, 0, 0, 0, 0, 0],
        "reward_waits_per_step": [4] * 6,
        "rollout_lead_s": [-71, -71, -71, -71, -71, NAN],
        "update_lead_s": [288, 296, 319, 284, 314, 327],
        "reward_wait_share": [0.6, 0.59, 0.62, 0.59, 0.61, 0.64],
    },
    "one_step_off": {
        "staleness": [0, 1, 1, 1, 1, 1],
        "reward_waits_per_step": [1] * 6,
        "rollout_lead_s": [339, 133, 206, 161, 186, NAN],
        "update_lead_s": [-7, -8, -4, -7, -5, -4],
        "reward_wait_share": [0.73, 0.24, 0.3, 0.26, 0.3, 0.33],
    },
    "both": {
        "staleness": [0, 1, 1, 1, 1, 1],
        "reward_waits_per_step": [4] * 6,
        "rollout_lead_s": [335, 236, 293, 259, 257, NAN],
        "update_lead_s": [316, 231, 290, 257, 255, 324],
        "reward_wait_share": [0.54, 0.21, 0.27, 0.25, 0.24, 0.35],
    },
    "recipe_style": {
        "staleness": [0, 1, 1, 1, 1, 1],
        "reward_waits_per_step": [4] * 6,
        "rollout_lead_s": [314, 282, 314, 275, 298, NAN],
        "update_lead_s": [291, 282, 314, 274, 297, 324],
        "reward_wait_share": [0.5, 0.26, 0.29, 0.27, 0.28, 0.31],
    },
}


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
            "updates_per_step": [MINI_BATCHES] * 6,
            **copy.deepcopy(HEALTHY_STRUCTURE[name]),
        }
        for name, step in steps.items()
    }


def disabled() -> dict[str, dict[str, Any]]:
    """What ``--disable-pipeline`` gives: every strategy runs the baseline schedule."""
    run = healthy()
    for name in run:
        run[name].update(copy.deepcopy(HEALTHY_STRUCTURE["baseline"]))
        run[name]["step_s"] = run["baseline"]["step_s"] * 1.002
    return run


def verdict_of(
    strategies: dict[str, dict[str, Any]],
    tolerances: Any = QUICK_TOLERANCES,
    latency_s: tuple[float, float] | None = None,
) -> dict[str, Any]:
    strategies = copy.deepcopy(strategies)
    add_relative(strategies, BOUND, latency_s)
    return judge(strategies, TARGETS, SAMPLES, tolerances, cpus=2, mini_batches=MINI_BATCHES)


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


STRUCTURAL = {
    "staleness_by_schedule",
    "rollout_overlaps_scoring",
    "updates_overlap_scoring",
    "reward_wait_share",
}


def test_pipeline_disabled_fails_even_with_rewards_all_ok():
    verdict = verdict_of(disabled())
    assert verdict["outcome"] == "FAIL"
    assert set(verdict["failed"]) == {
        "mini_batch_reduction",
        "one_step_off_reduction",
        "both_reduction",
        "both_at_bound",
        *STRUCTURAL,
    }
    checks = verdict["checks"]
    assert set(checks["staleness_by_schedule"]["wrong"]) == {"one_step_off", "both", "recipe_style"}
    assert checks["rollout_overlaps_scoring"]["failing"] == ["one_step_off", "both", "recipe_style"]
    assert checks["updates_overlap_scoring"]["failing"] == ["mini_batch", "both", "recipe_style"]
    assert set(checks["updates_overlap_scoring"]["wrong_counts"]) == {"mini_batch", "both", "recipe_style"}
    assert checks["reward_wait_share"]["ratio_to_baseline"]["both"] == pytest.approx(1.0)
    line = summary_line(verdict)
    assert line.startswith("FAIL (") and "pipeline not working: wrong staleness in one_step_off" in line


@pytest.mark.parametrize(
    ("lag_ms", "load"), [(50.0, 2.9), (0.8, 17.6), (50.0, 17.6)], ids=["probe lag", "load", "both"]
)
def test_pipeline_disabled_fails_on_a_starved_machine_too(lag_ms, load):
    """The speed checks turn inconclusive on a starved run; the structural ones still fail it."""
    run = disabled()
    for summary in run.values():
        summary.update(probe_lag_ms=lag_ms, load_average_1min=load)
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL"
    assert set(verdict["failed"]) == STRUCTURAL
    assert set(verdict["inconclusive"]) == {
        "mini_batch_reduction",
        "one_step_off_reduction",
        "both_reduction",
        "both_at_bound",
    }
    assert summary_line(verdict).startswith("FAIL (staleness_by_schedule, rollout_overlaps_scoring")


def test_a_healthy_run_shows_its_structure():
    checks = verdict_of(healthy())["checks"]
    assert all(checks[name]["ok"] for name in STRUCTURAL), checks
    assert checks["rollout_overlaps_scoring"]["lowest_lead_s"]["one_step_off"] == 133
    ratio = checks["reward_wait_share"]["ratio_to_baseline"]["both"]
    assert ratio == pytest.approx(0.25 / 0.82)  # the medians of steps 1-5
    assert summary_line(verdict_of(healthy())).endswith("schedules overlap scoring as designed")


def test_a_step_without_overlap_passes_when_the_steps_overlap_on_average():
    """After a step the CPU stretched, the service may have caught up: one step shows no lead."""
    run = healthy()
    run["one_step_off"]["rollout_lead_s"][2] = -30.0
    run["both"]["update_lead_s"][3] = -20.0
    assert verdict_of(run)["outcome"] == "PASS"


def test_a_reward_source_whose_submit_blocks_fails_the_overlaps():
    """Right staleness and counts, but each batch was scored before anything could overlap it."""
    run = healthy()
    for name in ("mini_batch", "one_step_off", "both", "recipe_style"):
        run[name]["rollout_lead_s"] = [-40.0] * 5 + [NAN]
        run[name]["update_lead_s"] = [-90.0] * 6
        run[name]["reward_wait_share"] = [0.0] * 6  # nothing left to wait for
    verdict = verdict_of(run)
    assert set(verdict["failed"]) == {"rollout_overlaps_scoring", "updates_overlap_scoring"}


@pytest.mark.parametrize(
    ("strategy", "key", "value", "check"),
    [
        ("one_step_off", "staleness", [0, 0, 1, 1, 1, 1], "staleness_by_schedule"),
        ("mini_batch", "staleness", [0, 1, 1, 1, 1, 1], "staleness_by_schedule"),
        ("baseline", "staleness", [], "staleness_by_schedule"),
        ("both", "reward_waits_per_step", [4, 4, 1, 4, 4, 4], "updates_overlap_scoring"),
        ("mini_batch", "updates_per_step", [4, 4, 4, 3, 4, 4], "updates_overlap_scoring"),
        ("both", "update_lead_s", [300, 200, NAN, 100, 100, 100], "updates_overlap_scoring"),
        ("recipe_style", "rollout_lead_s", [300, 200], "rollout_overlaps_scoring"),
        ("one_step_off", "reward_wait_share", [0.8] * 6, "reward_wait_share"),
        ("both", "reward_wait_share", [], "reward_wait_share"),
    ],
)
def test_each_structural_fact_is_checked(strategy, key, value, check):
    """Wrong or missing facts fail (a NaN or a short list is no evidence of overlap)."""
    run = healthy()
    run[strategy][key] = value
    verdict = verdict_of(run)
    assert verdict["failed"] == [check]


def test_structure_is_judged_against_the_intended_schedule():
    """A strategy's mode comes from what it should run: a baseline row passes as baseline."""
    run = {name: healthy()["baseline"] for name in ("baseline", "as_baseline")}
    modes = {"baseline": "baseline", "as_baseline": "baseline"}
    strategies = copy.deepcopy(run)
    add_relative(strategies, BOUND)
    checks = judge(strategies, TARGETS, SAMPLES, QUICK_TOLERANCES, 2, modes, MINI_BATCHES)["checks"]
    assert checks["staleness_by_schedule"]["ok"] and "rollout_overlaps_scoring" not in checks
    modes["as_baseline"] = "one_step_off"
    checks = judge(strategies, TARGETS, SAMPLES, QUICK_TOLERANCES, 2, modes, MINI_BATCHES)["checks"]
    assert not checks["staleness_by_schedule"]["ok"] and not checks["rollout_overlaps_scoring"]["ok"]


def test_a_run_of_one_step_makes_no_ordering_checks():
    run = healthy()
    for summary in run.values():
        for key in ("staleness", "reward_waits_per_step", "rollout_lead_s", "update_lead_s"):
            summary[key] = summary[key][:1]
        summary["reward_status_ok"] = [SAMPLES]
        summary["updates_per_step"] = [MINI_BATCHES]
    checks = verdict_of(run)["checks"]
    assert checks["staleness_by_schedule"]["ok"]
    assert not {"rollout_overlaps_scoring", "updates_overlap_scoring", "reward_wait_share"} & set(checks)


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


def test_a_figure_below_the_bound_is_inconclusive_never_a_pass():
    """0.97x the bound: above the floor that calls the code broken (0.95), yet faster than a judge
    busy all the time allows: the window was not steady state, so nothing can be read from it."""
    run = healthy()
    run["one_step_off"]["step_s"] = 0.97 * BOUND  # a reduction of 34 % still meets the recipe's
    verdict = verdict_of(run)
    assert verdict["outcome"] == "INCONCLUSIVE" and not verdict["passed"], verdict
    assert verdict["inconclusive"] == ["figures_in_steady_state"] and not verdict["failed"]
    reason = verdict["checks"]["figures_in_steady_state"]["below_bound"]["one_step_off"]
    assert reason.startswith("0.970x the bound") and "not steady state for staleness 1" in reason
    line = summary_line(verdict)
    assert line.startswith("INCONCLUSIVE (one_step_off below the bound: not a steady-state figure")
    assert "--steps" in line and "CPU was too busy" not in line


def test_a_figure_within_the_windows_latency_spread_of_the_bound_passes():
    """960 requests in the window (3 steps x 320): 3 sigma of their mean latency is 5.3 % of it, so
    0.97x the bound is within what the draws allow, and nothing is flagged."""
    run = healthy()
    for summary in run.values():
        summary["window_samples"] = 3 * SAMPLES
    run["one_step_off"]["step_s"] = 0.97 * BOUND
    verdict = verdict_of(run, latency_s=(1.0, 40.0))
    assert verdict["outcome"] == "PASS", verdict
    assert verdict["checks"]["figures_in_steady_state"] == {"below_bound": {}, "ok": True}


def test_a_flagged_figure_under_the_floor_still_fails():
    run = healthy()
    run["both"]["step_s"] = 0.9 * BOUND
    verdict = verdict_of(run)
    assert verdict["outcome"] == "FAIL" and verdict["failed"] == ["no_strategy_below_bound"]
    assert verdict["inconclusive"] == ["figures_in_steady_state"]


def test_the_rewards_of_every_repeat_are_counted():
    from async_reward_bench.repeats import combine_repeats

    run = healthy()
    second = copy.deepcopy(run["both"])
    second["reward_status_ok"] = [SAMPLES] * 5 + [SAMPLES - 2]  # the second run lost two samples
    run["both"] = combine_repeats([run["both"], second], [0, 1])
    verdict = verdict_of(run)
    assert verdict["failed"] == ["rewards_ok"] and verdict["checks"]["rewards_ok"]["rewards"] == 9600 + 1920
    assert verdict["checks"]["rewards_ok"]["not_ok_by_strategy"] == {"both": 2}


def test_full_run_tolerances_are_tighter():
    assert FULL_TOLERANCES.bound_ceiling < QUICK_TOLERANCES.bound_ceiling
    assert FULL_TOLERANCES.reduction_margin_points <= QUICK_TOLERANCES.reduction_margin_points


def test_checks_needing_a_strategy_left_out_are_not_made():
    run = {k: v for k, v in healthy().items() if k in ("baseline", "both")}
    verdict = verdict_of(run)
    assert set(verdict["checks"]) == {
        "rewards_ok",
        "no_strategy_below_bound",
        "figures_in_steady_state",
        "both_reduction",
        "both_at_bound",
        *STRUCTURAL,
    }
    assert verdict["checks"]["updates_overlap_scoring"]["strategies"] == ["both"]
    assert verdict["outcome"] == "PASS"
