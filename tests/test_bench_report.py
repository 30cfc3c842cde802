"""The benchmark's summaries on constructed runs: the below-bound flag, the steady-state window per
staleness, the refusal of runs too short for it, and the spread over repeats. Pure functions of
step records and summaries: no timing, so nothing here depends on the machine's load."""

from __future__ import annotations

import math
from typing import Any

import pytest

from async_reward_bench.report import add_relative, below_bound_tolerance, format_table

BOUND = 410.0
LATENCY = (1.0, 40.0)  # the recipe's judge, uniform 1-40 s


def regime(strategies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One regime's results as ``speedup.run_benchmark`` writes them, around ``strategies``."""
    return {
        "name": "recipe",
        "description": "the recipe's judge latency, reward-bound",
        "latency_s": list(LATENCY),
        "reward_work_per_capacity_s": BOUND,
        "gpu_work_s": 237.6,
        "gen_s": 39.8,
        "bound_s": BOUND,
        "strategies": strategies,
    }


def figure(step_s: float, staleness: list[int], measured: list[int], samples: int = 640) -> dict[str, Any]:
    """A strategy's summary with what the table and the flag read."""
    return {
        "step_s": step_s,
        "reward_blocked_s": 10.0,
        "gpu_busy_fraction": 0.6,
        "rollout_idle_fraction": 0.4,
        "service_busy_fraction": 0.99,
        "staleness": staleness,
        "measured_steps": measured,
        "window_samples": samples * len(measured),
    }


def test_the_tolerance_is_three_sigma_of_the_windows_mean_latency():
    cv = 39 / (math.sqrt(12) * 20.5)  # uniform 1-40 s: standard deviation over mean
    assert below_bound_tolerance(LATENCY, 4480) == pytest.approx(3 * cv / math.sqrt(4480))
    assert below_bound_tolerance(LATENCY, 4480) == pytest.approx(0.0246, abs=1e-4)  # full run, 7 x 640
    assert below_bound_tolerance((0.1, 4.0), 960) == pytest.approx(0.0532, abs=1e-4)  # any regime's scale
    assert below_bound_tolerance(LATENCY, 0) == 0.0


def test_a_figure_below_what_the_busiest_resource_allows_is_flagged_in_json_and_table():
    """The issue's 0.960x for ``v1_pipelined_both_fill`` (staleness 2) in an 8-step run: a window of 5
    steps x 640 requests allows 2.9 % below the bound by chance, not 4 %."""
    strategies = {
        "baseline": figure(585.0, [0] * 8, [2, 3, 4, 5, 6]),
        "both": figure(0.98 * BOUND, [0] + [1] * 7, [2, 3, 4, 5, 6]),
        "v1_pipelined_both_fill": figure(0.96 * BOUND, [0, 1] + [2] * 6, [2, 3, 4, 5, 6]),
    }
    add_relative(strategies, BOUND, LATENCY)
    flagged = strategies["v1_pipelined_both_fill"]
    assert flagged["below_bound"] is True and flagged["bound_tolerance"] == pytest.approx(0.0291, abs=1e-4)
    reason = flagged["below_bound_reason"]
    assert reason.startswith("0.960x the bound") and "--steps" in reason
    assert "steps 2..6 are not steady state for staleness 2" in reason
    assert strategies["both"]["below_bound"] is False and "below_bound_reason" not in strategies["both"]
    assert strategies["baseline"]["below_bound"] is False
    table = format_table(regime(strategies), None).splitlines()
    row = next(line for line in table if line.lstrip().startswith("v1_pipelined_both_fill"))
    assert "0.960!" in row
    assert not any("0.980!" in line for line in table)
    assert table[-1] == f"  ! v1_pipelined_both_fill: {reason}"


def test_without_the_latency_range_any_figure_under_the_bound_is_flagged():
    strategies = {"both": figure(0.999 * BOUND, [0, 1, 1], [1, 2])}
    add_relative(strategies, BOUND)
    assert strategies["both"]["bound_tolerance"] == 0.0 and strategies["both"]["below_bound"] is True
