"""The pipeline speedup benchmark's pure parts (settings, calibration, regimes, the steady-state window,
the report's figures, the exit code). The benchmark end to end, shrunk, with our legacy strategies
beside verl v1's (a broken judge or a disabled pipeline failing the quick verdict):
tests/legacy/test_bench.py; its v1 strategies alone: tests/bench/test_bench_v1_strategies.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from async_reward_bench import speedup
from async_reward_bench.calibration import RECIPE_SERVICE, load_medians, recipe_targets
from async_reward_bench.report import measured_steps, probe_lag_ms, service_busy_fraction
from async_reward_bench.scenarios import regime_latency, regime_stages

TINY = ["--steps", "3", "--time-scale", "0.002", "--prompts", "16", "--capacity", "4", "--no-progress"]


def assert_a_sane_tiny_run(name: str, summary: dict[str, Any], out_dir: Path) -> None:
    """What every strategy of a :data:`TINY` run in the recipe regime writes (80 samples a step, 4
    updates, 3 steps), whatever the machine's load: sane numbers, every sample scored once and ok,
    and its timeline picture."""
    assert len(summary["step_times_s"]) == 3 and min(summary["step_times_s"]) > 0
    assert summary["step_s"] > 0 and summary["ratio_to_bound"] > 0.5
    assert 0 < summary["service_busy_fraction"] <= 1.0
    assert summary["probe_lag_ms"] >= 0
    assert summary["updates_per_step"] == [4, 4, 4]
    assert summary["reward_status_ok"] == [80, 80, 80]  # every sample scored once, ok
    png = Path(summary["timeline_png"])
    assert png == out_dir / f"timeline_recipe_{name}.png", name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_exit_code_follows_the_outcome(monkeypatch, tmp_path, capsys):
    """FAIL exits 1 under --quick or --check; INCONCLUSIVE (a starved machine) and PASS exit 0."""
    from async_reward_bench import verdict as verdict_module

    def fake_results(outcome: str):
        def run_benchmark(cfg):
            verdict = {
                "outcome": outcome,
                "passed": outcome == "PASS",
                "failed": ["both_at_bound"] if outcome == "FAIL" else [],
                "inconclusive": ["both_at_bound"] if outcome == "INCONCLUSIVE" else [],
                "starved": {"both": 30.0} if outcome == "INCONCLUSIVE" else {},
                "checks": {"rewards_ok": {"rewards": 10, "not_ok": 0, "ok": True}},
                "tolerances": vars(verdict_module.QUICK_TOLERANCES),
            }
            regime = {
                "name": "recipe",
                "description": "d",
                "latency_s": [1.0, 40.0],
                "reward_work_per_capacity_s": 410.0,
                "gpu_work_s": 237.6,
                "bound_s": 410.0,
                "strategies": {},
                "verdict": verdict,
            }
            return {
                "regimes": {"recipe": regime},
                "recipe": {},
                "steady_state": "",
                "wall_time_s": 1.0,
                "setup_s": 0.5,
                "load_average_before": (1.0, 1.0, 1.0),
                "cpus": 2,
            }

        return run_benchmark

    for outcome, quick, check, code in [
        ("FAIL", True, False, 1),
        ("FAIL", False, True, 1),
        ("FAIL", False, False, 0),
        ("INCONCLUSIVE", True, True, 0),
        ("PASS", True, False, 0),
    ]:
        monkeypatch.setattr(speedup, "run_benchmark", fake_results(outcome))
        argv = [*(["--quick"] if quick else []), *(["--check"] if check else []), "--out", str(tmp_path)]
        assert speedup.main(argv) == code, (outcome, quick, check)
        assert capsys.readouterr().out.strip().startswith(f"async-reward bench: {outcome}")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--prompts", "6", "--mini-batches", "4"], "cannot be split"),
        (["--judge-fault", "nonsense"], "KIND=RATE"),
        (["--judge-fault", "teapot=0.5"], "unknown fault kinds"),
        (["--rollout-slots", "0"], "rollout slots"),
    ],
)
def test_bad_settings_exit_2_without_running(tmp_path, capsys, argv, error):
    assert speedup.main([*argv, "--out", str(tmp_path)]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "pipeline_speedup.json").exists()


def test_calibration_and_recipe_targets():
    medians = load_medians()
    base = medians["gsm8k_qwen2_7b_base"]
    assert (base.gen_s, base.old_log_prob_s, base.ref_s, base.update_actor_s) == (39.8, 45.2, 36.3, 116.3)
    assert base.gpu_work_s == pytest.approx(237.6)
    scaled = base.scaled(0.01)
    assert scaled.gen_s == pytest.approx(0.398) and scaled.steps == base.steps and scaled.run == base.run
    assert RECIPE_SERVICE.work_per_capacity_s == pytest.approx(410.0)
    targets = recipe_targets(medians)
    assert targets["baseline"]["step_s"] == 585.7
    assert targets["mini_batch"]["reduction"] == pytest.approx(0.130, abs=1e-3)
    assert targets["one_step_off"]["reduction"] == pytest.approx(0.275, abs=1e-3)
    assert targets["both"]["ratio_to_bound"] == pytest.approx(1.036, abs=1e-3)


def test_regime_latency_sets_the_service_load():
    cfg = speedup.BenchConfig()
    samples = cfg.prompts * cfg.group_size
    stages = load_medians()["gsm8k_qwen2_7b_base"]
    assert cfg.regimes == ("recipe", "balanced", "gpu_bound", "long_tail", "long_tail_fast")  # the README's
    for name, ratio in (("balanced", 1.0), ("gpu_bound", 0.5), ("long_tail", 1.0), ("long_tail_fast", 0.1)):
        regime = speedup.REGIMES[name]
        gpu = regime_stages(regime, stages).gpu_work_s
        lo, hi = regime_latency(regime, samples, cfg.capacity, gpu)
        assert hi / lo == pytest.approx(40.0)
        assert samples * (lo + hi) / 2 / cfg.capacity == pytest.approx(ratio * gpu)
    assert regime_latency(speedup.REGIMES["recipe"], samples, cfg.capacity, stages.gpu_work_s) == (1.0, 40.0)


@pytest.mark.parametrize(
    ("steps", "measured"), [(1, [0]), (2, [1]), (3, [1, 2]), (4, [2]), (5, [2, 3]), (7, [2, 3, 4, 5])]
)
def test_steady_state_window(steps, measured):
    class Record:
        def __init__(self, step: int) -> None:
            self.step = step

    assert [r.step for r in measured_steps([Record(i) for i in range(steps)])] == measured  # type: ignore[arg-type]


def test_service_busy_fraction_integrates_held_samples():
    samples = [(0.0, 4, 6), (1.0, 2, 2), (3.0, 0, 0)]
    # Window [0.5, 4]: 4 slots busy for 0.5 s, 2 for 2 s, 0 for 1 s, out of 4 slots x 3.5 s.
    assert service_busy_fraction(samples, 0.5, 4.0, capacity=4) == pytest.approx((2 + 4) / 14)
    assert math.isnan(service_busy_fraction([], 0.0, 1.0, capacity=4))


def test_probe_lag_is_the_mean_delay_beyond_the_sampling_interval():
    samples = [(t, 0, 0) for t in (0.0, 0.051, 0.102, 0.170, 0.220)]  # 50 ms rounds, one 18 ms late
    assert probe_lag_ms(samples, 0.0, 1.0, 0.05) == pytest.approx((0.220 / 4 - 0.05) * 1000)
    assert math.isnan(probe_lag_ms(samples[:1], 0.0, 1.0, 0.05))


def test_schedule_facts_read_leads_from_events_and_ticket_times():
    """An off-policy step 0 whose next batch went out 2.49 s before batch 0 was scored, and whose
    update came 0.6 s after; step 1's source held its batch 0.5 s first (recipe-style admission)."""
    from async_reward.training.schedule import StepRecord, TimelineEvent
    from async_reward_bench.structure import schedule_facts

    def step(n: int, events: list[tuple[str, float, float, int]], blocked: float, **metrics: float):
        return StepRecord(
            step=n,
            mode="one_step_off",
            start=events[0][1],
            end=events[-1][2],
            policy_version=0,
            trained_version=n,
            num_samples=8,
            chunk_sizes=[8],
            reward_blocked_s=blocked,
            events=[TimelineEvent(*event) for event in events],
            metrics=metrics,
        )

    records = [
        step(
            0,
            [
                ("rollout", 0.0, 1.0, 0),
                ("submit", 1.0, 1.01, 0),
                ("prepare", 1.01, 2.0, 0),
                ("rollout", 2.0, 3.0, 1),
                ("submit", 3.0, 3.01, 1),
                ("reward_wait", 3.01, 6.0, 0),
                ("update", 6.1, 7.0, 0),
            ],
            blocked=2.99,
            **{"timing_s/reward_submit_to_done": 4.5},  # scored by 1.0 + 4.5 = 5.5
        ),
        step(
            1,
            [("prepare", 7.0, 8.0, 1), ("reward_wait", 8.0, 9.0, 1), ("update", 9.0, 9.5, 1)],
            blocked=1.0,
            **{"timing_s/reward_submit_to_done": 5.0, "timing_s/reward_held": 0.5},  # scored by 8.5
        ),
    ]
    facts = schedule_facts(records, time_scale=0.01)
    assert facts["rollout_lead_s"][0] == pytest.approx((5.5 - 3.01) / 0.01)
    assert math.isnan(facts["rollout_lead_s"][1])  # no batch after the last one
    assert facts["update_lead_s"] == pytest.approx([(5.5 - 6.1) / 0.01, (8.5 - 9.0) / 0.01])
    assert facts["reward_waits_per_step"] == [1.0, 1.0]
    assert facts["reward_wait_share"] == pytest.approx([2.99 / 4.5, 1.0 / 5.5])
    no_ticket = schedule_facts([step(0, [("update", 0.0, 1.0, 0)], blocked=0.0)], time_scale=1.0)
    assert math.isnan(no_ticket["update_lead_s"][0]) and math.isnan(no_ticket["reward_wait_share"][0])


def test_the_default_run_is_the_readme_performance_table():
    """``async-reward bench`` with no options runs the README table's rows over its five columns, long
    enough for a steady window of several steps at every staleness those rows reach (verl's
    ``colocate_async`` up to 4 with the fast reward), one run, with the GC pauses held off as
    always; ``--quick`` stays ``make bench``'s short run, and every other strategy runs on request."""
    import re

    from async_reward_bench.scenarios import DEFAULT_STRATEGIES, OFFERED_STRATEGIES, V1_STRATEGIES
    from async_reward_bench.steady_state import scheduled_staleness, steady_window

    parser = speedup.configure_parser(__import__("argparse").ArgumentParser())
    cfg = speedup.config_from_args(parser.parse_args([]))
    cfg.validate()
    rows = ("v1_pipelined_both", "v1_pipelined_both_stale2", "v1_colocate_async")
    assert cfg.strategies == DEFAULT_STRATEGIES == rows and set(rows) <= set(
        V1_STRATEGIES
    )  # no legacy needed
    assert cfg.regimes == ("recipe", "balanced", "gpu_bound", "long_tail", "long_tail_fast")
    assert (cfg.steps, cfg.repeats, cfg.time_scale, cfg.seed, cfg.prompts, cfg.capacity) == (
        12,
        1,
        0.02,
        0,
        128,
        32,
    )
    for strategy in rows:  # the staleness each schedule is set up for, and the most colocate_async reaches
        for staleness in {scheduled_staleness(strategy), 4 if strategy == "v1_colocate_async" else 0}:
            first, stop = steady_window(cfg.steps, staleness) or (0, 0)
            assert stop - first >= 3, (strategy, staleness)
    assert steady_window(cfg.steps, 2) == (3, 10)
    # The README's table: these rows, these columns, and the command that reproduces it.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    performance = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    table = [line for line in performance.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows) and table[0].count("|") == 2 + len(cfg.regimes)
    assert "`async-reward bench`" in performance and re.search(r"no options", performance)
    quick = speedup.config_from_args(parser.parse_args(["--quick"]))
    assert (quick.regimes, quick.steps, quick.time_scale, quick.checks) == (("recipe",), 6, 1 / 300, "quick")
    assert quick.strategies[-1] == "v1_pipelined_both"
    every = speedup.config_from_args(parser.parse_args(["--strategies", *OFFERED_STRATEGIES]))
    assert every.strategies == OFFERED_STRATEGIES and len(every.strategies) > len(rows)


def test_repeats_need_a_judge_this_process_can_reseed(tmp_path, capsys):
    argv = ["--repeats", "2", "--server", "process", "--out", str(tmp_path)]
    assert speedup.main(argv) == 2
    assert "--server thread" in capsys.readouterr().err
    assert speedup.main(["--repeats", "0", "--out", str(tmp_path)]) == 2
