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


def run_of(staleness: list[int], step_s: list[float]) -> list[Any]:
    """Step records of a run whose step k trained a batch ``staleness[k]`` versions old and took
    ``step_s[k]`` seconds (8 samples a step)."""
    from async_reward.training.schedule import StepRecord, TimelineEvent

    records, clock = [], 0.0
    for k, (stale, took) in enumerate(zip(staleness, step_s, strict=True)):
        records.append(
            StepRecord(
                step=k,
                mode="both",
                start=clock,
                end=clock + took,
                policy_version=k - stale,
                trained_version=k,
                num_samples=8,
                chunk_sizes=[8],
                reward_blocked_s=0.0,
                events=[TimelineEvent("update", clock, clock + took, k)],
            )
        )
        clock += took
    return records


@pytest.mark.parametrize(
    ("steps", "scheduled", "reached", "measured", "steady"),
    [
        (10, 0, 0, [2, 3, 4, 5, 6, 7, 8], True),  # the rule for 0 and 1 is unchanged
        (10, 1, 1, [2, 3, 4, 5, 6, 7, 8], True),
        (4, 1, 1, [2], True),
        (8, 2, 2, [3, 4, 5], True),  # the 8-step run at staleness 2: was steps 2..6
        (6, 2, 2, [3], True),
        (12, 3, 3, [4, 5, 6, 7, 8], True),
        (10, 1, 3, [4, 5, 6], True),  # a run ahead of its schedule (verl's separate mode): what it reached
        (10, 1, 5, [5], False),  # too short for staleness 5 (12 steps): the window of staleness 4
        (3, 1, 1, [1, 2], False),  # the tiny tests' short-run fallback, marked
    ],
)
def test_the_steady_window_skips_the_fill_up_and_drain_of_the_strategys_staleness(
    steps, scheduled, reached, measured, steady
):
    """Fill-up steps last 3 s and drain steps 0.5 s, steady ones 1 s: a window that holds only
    steady steps averages exactly 1 s (here 100 recipe seconds at a time scale of 0.01)."""
    from async_reward_bench.report import summarize

    staleness = [min(k, reached) for k in range(steps)]
    fill, drain = max(2, reached + 1), max(1, reached)
    step_s = [3.0 if k < fill else 0.5 if k >= steps - drain else 1.0 for k in range(steps)]
    summary = summarize(run_of(staleness, step_s), time_scale=0.01, staleness=scheduled)
    assert summary["measured_steps"] == measured
    assert summary["window_staleness"] == reached and summary["steady_state"] is steady
    assert summary["window_samples"] == 8 * len(measured)
    if steady:
        assert summary["step_s"] == pytest.approx(100.0)


def test_scheduled_staleness_and_the_fewest_steps_it_needs():
    from async_reward_bench.steady_state import min_steady_steps, scheduled_staleness

    assert [scheduled_staleness(s) for s in ("baseline", "mini_batch", "both", "recipe_style")] == [
        0,
        0,
        1,
        1,
    ]
    assert [scheduled_staleness(s) for s in ("v1_sync", "v1_pipelined_both", "v1_pipelined_both_fill")] == [
        0,
        1,
        2,
    ]
    assert [scheduled_staleness(f"v1_pipelined_both_stale{s}") for s in (2, 3)] == [2, 3]
    assert min_steady_steps(3) == 8
    assert scheduled_staleness("v1_colocate_async") == scheduled_staleness("v1_separate_async") == 1
    assert [min_steady_steps(s) for s in range(5)] == [4, 4, 6, 8, 10]


def test_a_run_too_short_for_a_staleness_2_strategy_is_refused(tmp_path, capsys):
    from async_reward_bench import speedup

    argv = ["--strategies", "both", "v1_pipelined_both_fill", "--steps", "5", "--out", str(tmp_path)]
    assert speedup.main(argv) == 2
    err = capsys.readouterr().err
    assert "--steps 5 leaves no steady-state step for v1_pipelined_both_fill (staleness 2)" in err
    assert "give --steps 6 or more" in err and "both (" not in err
    assert not (tmp_path / "pipeline_speedup.json").exists()
    speedup.BenchConfig(strategies=("v1_pipelined_both_fill",), steps=6).validate()  # 6 is enough
    speedup.BenchConfig(strategies=("both",), steps=3).validate()  # staleness 1 keeps its fallback


def test_a_window_short_of_steady_state_is_marked_in_the_table():
    strategies = {"both": figure(1.02 * BOUND, [0, 1, 1], [1, 2])}
    strategies["both"].update(steady_state=False, window_staleness=1)
    add_relative(strategies, BOUND, LATENCY)
    table = format_table(regime(strategies), None).splitlines()
    assert "1.020~" in table[-2]
    assert (
        table[-1]
        == "  ~ both: steps 1..2 are short of a steady window for staleness 1 (needs --steps 4 or more)"
    )


def test_repeats_give_the_mean_with_every_run_and_the_spread_beside_it():
    from async_reward_bench.repeats import combine_repeats

    runs = [figure(420.0, [0, 1, 1, 1, 1], [2, 3]), figure(428.4, [0, 1, 1, 1, 1], [2, 3])]
    runs[0].update(probe_lag_ms=0.8, reward_status_ok=[640] * 5)
    runs[1].update(probe_lag_ms=3.0, reward_status_ok=[640] * 5)
    strategies = {"both": combine_repeats(runs, [0, 1])}
    add_relative(strategies, BOUND, LATENCY)
    both = strategies["both"]
    assert both["repeats"] == 2 and both["seeds"] == [0, 1] and [r["seed"] for r in both["runs"]] == [0, 1]
    assert both["step_s"] == pytest.approx(424.2) and both["step_s_runs"] == [420.0, 428.4]
    assert both["spread_s"] == pytest.approx(8.4) and both["relative_spread"] == pytest.approx(8.4 / 424.2)
    assert both["ratio_to_bound_runs"] == pytest.approx([420.0 / BOUND, 428.4 / BOUND])
    assert both["probe_lag_ms"] == 3.0  # the more starved run's: the verdict must see it
    assert both["window_samples"] == 2 * 2 * 640 and both["below_bound"] is False
    header, row = format_table(regime(strategies), None).splitlines()[-2:]
    assert "x bound, runs" in header and "spread" in header
    assert "1.024 1.045" in row and "2.0%" in row


def test_one_run_below_the_bound_flags_the_mean_figure_too():
    from async_reward_bench.repeats import combine_repeats

    runs = [figure(0.95 * BOUND, [0, 1, 1, 1, 1], [2, 3]), figure(1.06 * BOUND, [0, 1, 1, 1, 1], [2, 3])]
    strategies = {"both": combine_repeats(runs, [7, 8])}
    add_relative(strategies, BOUND, LATENCY)
    both = strategies["both"]
    assert both["ratio_to_bound"] == pytest.approx(1.005) and both["below_bound"] is True
    assert both["below_bound_reason"].startswith("run 1 (seed 7): 0.950x the bound")
    assert both["runs"][0]["below_bound"] is True and both["runs"][1]["below_bound"] is False


def test_repeats_need_one_seed_per_run():
    from async_reward_bench.repeats import combine_repeats

    with pytest.raises(ValueError, match="one run per seed"):
        combine_repeats([figure(400.0, [0], [0])], [0, 1])


def test_colocate_async_held_to_staleness_2_is_verls_own_replay_buffer_at_3_versions_dropless(
    tokenizer_dir, tokenizer
):
    """``v1_colocate_async_stale2`` is verl's ``colocate_async`` with verl's own settings (a trajectory
    spans at most 3 versions; ``wait``: a prompt at the limit is waited for, never dropped), read by
    verl's replay buffer as built by verl's trainer, not a setting of the harness's."""
    import numpy as np

    from async_reward_bench.backend import BatchFactory
    from async_reward_bench.environment import _v1_trainer_config
    from async_reward_bench.settings import BenchConfig
    from async_reward_bench.tag_store import TagStore
    from async_reward_bench.v1_trainer import V1Harness, build_v1_trainer

    cfg = BenchConfig(prompts=4, group_size=2, mini_batches=2)
    harness = V1Harness(
        stages=None,
        factory=BatchFactory(tokenizer, cfg.prompts, cfg.group_size),
        durations=lambda number, samples: np.zeros(samples),
        agent_loop=None,
        store=TagStore(),
        reward_loop_manager=None,
        time_scale=1.0,
    )
    buffers = {}
    for strategy in ("v1_colocate_async", "v1_colocate_async_stale2"):
        config = _v1_trainer_config(cfg, tokenizer_dir, "http://127.0.0.1:9", strategy)
        assert config.trainer.v1.trainer_mode == "colocate_async"
        buffers[strategy] = build_v1_trainer(config, harness, strategy).replay_buffer
    limited = buffers["v1_colocate_async_stale2"]
    assert (limited.max_off_policy_threshold, limited.max_off_policy_strategy) == (3, "wait")
    assert buffers["v1_colocate_async"].max_off_policy_threshold == 8  # verl's default: up to staleness 7
