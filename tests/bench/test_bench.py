"""The pipeline speedup benchmark end to end, shrunk (real Ray workers, our and verl's reward workers,
real ``llm_judge`` over HTTP, calibrated waits, verl's own v1 trainer code), plus its pure parts. No
speed asserts and no comparison of two measured times: only that every strategy ran, wrote sane
numbers and pictures, that pipelining showed its structure (counts and orders that hold at any
load), and that a broken judge or a disabled pipeline fails the quick verdict through the path
``make bench`` takes, the latter under a CPU hog."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_reward_bench import speedup
from async_reward_bench.calibration import RECIPE_SERVICE, load_medians, recipe_targets
from async_reward_bench.report import measured_steps, probe_lag_ms, service_busy_fraction
from async_reward_bench.scenarios import regime_latency, regime_stages

OURS = ["baseline", "mini_batch", "one_step_off", "both", "recipe_style"]
V1 = ["v1_sync", "v1_colocate_async", "v1_pipelined_both", "v1_separate_async", "v1_decoupled"]
TINY = ["--steps", "3", "--time-scale", "0.002", "--prompts", "16", "--capacity", "4", "--no-progress"]
STRUCTURAL = {
    "staleness_by_schedule",
    "rollout_overlaps_scoring",
    "updates_overlap_scoring",
    "reward_wait_share",
}


#: A process spinning on the CPU at the lowest priority: on a quiet machine it takes every idle cycle
#: (the load a busy CI machine puts on the benchmark), in ``make test`` it yields to the other tests
#: instead of taking two cores from them.
CPU_HOG = "import os\nos.nice(19)\nwhile True:\n    pass"


@contextlib.contextmanager
def cpu_hogs(count: int = 2) -> Iterator[None]:
    """``count`` processes spinning on the CPU, as a busy CI machine would; killed on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", CPU_HOG]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=30)


def test_tiny_benchmark_of_every_strategy_writes_sane_results(ray_cluster, tmp_path, capsys, monkeypatch):
    """Ours and verl v1's schedules through the real reward path; the verdict's outcome on this
    loaded machine is not asserted (the verdict has its own tests), its presence and shape are."""
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())  # said once per process: this test's lines
    argv = [
        *TINY,
        "--regimes",
        "recipe",
        "--checks",
        "quick",
        "--strategies",
        *OURS,
        *V1,
        "--weight-sync-s",  # only v1_separate_async pushes weights outside its calibrated rollout
        "200",
        "--out",
        str(tmp_path),
    ]
    assert speedup.main(argv) == 0  # no --quick/--check: the verdict does not set the exit code

    results = json.loads((tmp_path / "pipeline_speedup.json").read_text())
    assert list(results["regimes"]) == ["recipe"]
    regime = results["regimes"]["recipe"]
    assert regime["bound_s"] == pytest.approx(410.0)  # 80 samples x 20.5 s / 4 slots: the recipe's share
    assert list(regime["strategies"]) == OURS + V1
    for name, summary in regime["strategies"].items():
        assert len(summary["step_times_s"]) == 3 and min(summary["step_times_s"]) > 0
        assert summary["step_s"] > 0 and summary["ratio_to_bound"] > 0.5
        assert 0 < summary["service_busy_fraction"] <= 1.0
        assert summary["probe_lag_ms"] >= 0
        assert summary["updates_per_step"] == [4, 4, 4]
        assert summary["reward_status_ok"] == [80, 80, 80]  # every sample scored once, ok
        png = Path(summary["timeline_png"])
        assert png == tmp_path / f"timeline_recipe_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    strategies = regime["strategies"]
    for name in OURS:
        assert strategies[name]["staleness"] == (
            [0, 0, 0] if name in ("baseline", "mini_batch") else [0, 1, 1]
        )
        assert "scored_during_rollout" not in strategies[name]
    assert strategies["v1_sync"]["staleness"] == [0, 0, 0]
    assert max(strategies["v1_colocate_async"]["staleness"]) >= 1  # it trains on batches rolled out ahead
    # our v1 trainer mode, schedule both: one-step off (staleness 1 after the first step); its 4
    # updates a step are checked with every strategy's above
    assert strategies["v1_pipelined_both"]["staleness"] == [0, 1, 1]
    # verl's separate_async on 1 standalone rollout GPU + 7 trainer GPUs (the best split of 8: the
    # generation work is a small share): each step trains a batch (197.8 s x 8/7) and pushes weights
    # (200 s, generation paused), so it is trainer-bound at 426.1 s, above the service's 410 s.
    split = regime["gpu_split"]
    assert (split["total"], split["rollout"], split["trainer"], split["weight_sync_s"]) == (8, 1, 7, 200.0)
    assert split["bound_s"] == pytest.approx(197.8 * 8 / 7 + 200) == split["terms_s"]["trainer_s"]
    assert split["rollout_work_s"] < 0.5 * 39.8  # the mean response, not the longest
    separate = strategies["v1_separate_async"]
    assert separate["gpus"] == "1+7" and strategies["both"]["gpus"] == "8"
    assert separate["bound_s"] == split["bound_s"] and "bound_s" not in strategies["v1_colocate_async"]
    assert separate["ratio_to_bound"] == pytest.approx(separate["step_s"] / split["bound_s"])
    assert separate["ratio_to_colocated_bound"] == pytest.approx(separate["step_s"] / 410.0)
    assert separate["step_s"] >= 0.99 * split["bound_s"]  # the sync is paid: a busy CPU only adds
    assert separate["rollout_idle_fraction"] >= 0.95 * 200 / separate["step_s"]  # paused for it
    assert 0 < separate["gpu_busy_fraction"] <= 1 and 0 < separate["trainer_busy_fraction"] <= 1
    assert separate["staleness"][0] == 0 and 1 <= max(separate["staleness"]) <= 8  # verl's threshold
    # Our decoupled mode on the same split and bound; its prompt ledger balanced every step (16
    # prompts trained a step, none lost, none dropped by backpressure).
    decoupled = strategies["v1_decoupled"]
    assert decoupled["gpus"] == "1+7" and decoupled["bound_s"] == split["bound_s"]
    assert decoupled["step_s"] >= 0.99 * split["bound_s"]
    mode = decoupled["mode_metrics"]
    assert mode["ledger/trained"] == [16, 32, 48] and mode["ledger/unaccounted"] == [0, 0, 0]
    assert mode["reward_queue/dropped_samples"] == [0, 0, 0] and mode["ledger/evicted"] == [0, 0, 0]
    assert max(decoupled["staleness"]) <= 8
    assert "mode_metrics" in separate and not separate["mode_metrics"]  # verl's mode has none of ours
    for name in ("both", "v1_colocate_async"):  # colocated: idle only when neither generating nor training
        summary = strategies[name]
        assert summary["rollout_idle_fraction"] == pytest.approx(1 - summary["gpu_stage_fraction"])
    # How much v1's scoring overlapped its generation tail (at this tiny scale, often nothing: the
    # whole rollout lasts 80 ms; test_bench_v1_model shows the per-sample scoring itself).
    assert 0 <= strategies["v1_sync"]["scored_during_rollout"] <= 1
    # No comparison of two measured times here (a loaded machine flipped baseline's reward-blocked
    # time against both's): that pipelining blocks less is asserted through its structure below
    # (both waits 4 times a step for a chunk and updates after each; baseline once, after the whole
    # batch), which holds at any load; the speed-up is the benchmark's own verdict, which calls
    # itself inconclusive on a busy machine.
    verdict = regime["verdict"]
    assert verdict["outcome"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert set(verdict["checks"]) == {
        "rewards_ok",
        "no_strategy_below_bound",
        "figures_in_steady_state",
        "mini_batch_reduction",
        "one_step_off_reduction",
        "both_reduction",
        "both_at_bound",
        *STRUCTURAL,
    }
    assert verdict["checks"]["rewards_ok"]["ok"]  # the v1 rows are not judged, ours all scored ok
    # Of the structural checks, only the causal parts are asserted on this live run: the staleness
    # each schedule makes, and the mini-batch strategies' counts (4 reward waits and 4 updates a
    # step). The leads and the wait share are measured times (a starved CPU can stretch one step's
    # prepare past its scoring, or baseline's share below 1): the checks built on them are tested on
    # recorded step events (test_bench_verdict.py, test_schedule_facts_... below), and that an update
    # starts while its batch is still being scored is proven with the judge held (test_trainer.py).
    checks = verdict["checks"]
    assert checks["staleness_by_schedule"]["ok"], checks["staleness_by_schedule"]
    overlapping = checks["updates_overlap_scoring"]
    assert overlapping["strategies"] == ["mini_batch", "both", "recipe_style"]
    assert (overlapping["mini_batches"], overlapping["wrong_counts"]) == (4, {}), overlapping
    assert strategies["both"]["reward_waits_per_step"] == [4, 4, 4]
    assert strategies["baseline"]["reward_waits_per_step"] == [1, 1, 1]
    # By causality, not timing: baseline updates only after its last chunk, so after its last reward.
    assert max(strategies["baseline"]["update_lead_s"]) < 0
    printed = capsys.readouterr().out.strip().splitlines()
    # the start lines our verl plugin says while the strategies are built (e.g. the v1 seams it
    # implies under verl's own modes), then the report
    out = "\n".join(line for line in printed if not line.startswith("async_reward: ")).strip().splitlines()
    assert any(line.startswith("async_reward: verl v1 with an async-reward manager") for line in printed)
    # the v1 mode (the schedule to use) first, against legacy "both" of this run, then the verdict
    assert out[0].startswith("async-reward bench: v1 mode (trainer.v1.trainer_mode=pipelined")
    assert "the legacy trainer's both (same run)" in out[0]
    assert out[1].startswith(f"async-reward bench: {verdict['outcome']}")
    assert any("v1_colocate_async" in line for line in out) and out[-1].startswith("wall time")


def test_a_judge_that_fails_everything_fails_the_quick_verdict(ray_cluster, tmp_path, capsys):
    """The real path, with every judge call answered 400: the steps take their usual time, the
    rewards are all ``error``, and ``--quick`` (what ``make bench`` runs) exits 1 saying why."""
    argv = ["--quick", *TINY, "--strategies", "baseline", "--num-workers", "1", "--judge-fault", "400=1"]
    assert speedup.main([*argv, "--no-plots", "--out", str(tmp_path)]) == 1
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first.startswith("async-reward bench: FAIL (rewards_ok)")
    assert "240 of 240 rewards not ok" in first  # 3 steps x 80 samples
    verdict = json.loads((tmp_path / "pipeline_speedup.json").read_text())["regimes"]["recipe"]["verdict"]
    assert verdict["checks"]["rewards_ok"]["not_ok_by_strategy"] == {"baseline": 240}


def test_a_disabled_pipeline_fails_the_quick_verdict_under_a_cpu_hog(
    ray_cluster, tmp_path, capsys, monkeypatch
):
    """``async-reward bench --quick --disable-pipeline`` with two processes hogging the CPU while the
    steps run (started once the environment is up, to keep the test short): the speed checks can be
    inconclusive at such a load, but the schedule's structure fails it, and the command exits 1."""
    from async_reward.tools import cli
    from async_reward_bench import environment

    real_environment = environment.bench_environment

    @contextlib.contextmanager
    def hogged_environment(cfg: speedup.BenchConfig) -> Iterator[dict[str, Any]]:
        with real_environment(cfg) as env, cpu_hogs(2):
            yield env

    monkeypatch.setattr(environment, "bench_environment", hogged_environment)
    argv = ["bench", "--quick", *TINY, "--strategies", "both", "--num-workers", "1", "--disable-pipeline"]
    code = cli.main([*argv, "--no-plots", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    results = json.loads((tmp_path / "pipeline_speedup.json").read_text())
    assert results["config"]["pipeline"] is False
    verdict = results["regimes"]["recipe"]["verdict"]
    assert code == 1 and verdict["outcome"] == "FAIL", verdict
    assert {"staleness_by_schedule", "rollout_overlaps_scoring", "updates_overlap_scoring"} <= set(
        verdict["failed"]
    )
    checks = verdict["checks"]
    assert checks["staleness_by_schedule"]["wrong"] == {"both": {"seen": [0, 0, 0], "expected": [0, 1, 1]}}
    assert checks["rollout_overlaps_scoring"]["mean_lead_s"]["both"] < 0
    assert checks["updates_overlap_scoring"]["wrong_counts"]["both"]["reward_waits"] == [1, 1, 1]
    assert out[0].startswith("async-reward bench: FAIL (") and "staleness_by_schedule" in out[0]
    assert "pipeline not working: wrong staleness in both" in out[0]
    assert any("PIPELINE DISABLED" in line for line in out)


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
    assert cfg.regimes == ("recipe", "balanced", "gpu_bound", "long_tail")  # long_tail_fast on request
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


def test_repeats_run_each_strategy_with_its_own_seed_and_report_the_spread(ray_cluster, tmp_path, capsys):
    """``--repeats 2`` on the real path: two runs of each strategy (ours and a v1 one), seeds 0 and
    1, each run whole in the JSON, the mean figure with both runs' ratios and the spread beside it,
    and the verdict's reward count over both runs. No figure is compared with another."""
    argv = [*TINY, "--regimes", "recipe", "--strategies", "both", "v1_sync", "--repeats", "2"]
    assert speedup.main([*argv, "--num-workers", "1", "--no-plots", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "pipeline_speedup.json").read_text())
    assert results["config"]["repeats"] == 2
    for name, summary in results["regimes"]["recipe"]["strategies"].items():
        assert summary["repeats"] == 2 and summary["seeds"] == [0, 1], name
        runs = summary["runs"]
        assert [run["seed"] for run in runs] == [0, 1]
        for run in runs:
            assert run["reward_status_ok"] == [80, 80, 80] and run["step_s"] > 0
            assert run["ratio_to_bound"] == pytest.approx(run["step_s"] / 410.0)
        steps = [run["step_s"] for run in runs]
        assert summary["step_s"] == pytest.approx(sum(steps) / 2) and summary["step_s_runs"] == steps
        assert summary["spread_s"] == pytest.approx(max(steps) - min(steps))
        assert summary["relative_spread"] == pytest.approx(summary["spread_s"] / summary["step_s"])
        assert summary["ratio_to_bound_runs"] == [run["ratio_to_bound"] for run in runs]
        assert summary["window_samples"] == sum(run["window_samples"] for run in runs)
    verdict = results["regimes"]["recipe"]["verdict"]
    assert verdict["checks"]["rewards_ok"]["rewards"] == 2 * 3 * 80  # both's two runs
    out = capsys.readouterr().out
    assert "2 runs of each (seeds 0..1)" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("strategy"))
    assert "x bound, runs" in header and "spread" in header


def test_repeats_need_a_judge_this_process_can_reseed(tmp_path, capsys):
    argv = ["--repeats", "2", "--server", "process", "--out", str(tmp_path)]
    assert speedup.main(argv) == 2
    assert "--server thread" in capsys.readouterr().err
    assert speedup.main(["--repeats", "0", "--out", str(tmp_path)]) == 2


def test_make_bench_opens_with_the_v1_mode_against_legacy_both_of_the_same_run():
    """``make bench`` (``--quick``) runs the v1 mode's "both" beside the legacy strategies, and its
    first line is the v1 mode: the schedule the README says to use, against the bound and legacy "both"."""
    from async_reward_bench.settings import QUICK

    assert "v1_pipelined_both" in QUICK["strategies"] and "both" in QUICK["strategies"]
    strategies = {"both": {"step_s": 420.0, "ratio_to_bound": 1.0244}, "v1_pipelined_both": {}}
    strategies["v1_pipelined_both"] = {"step_s": 424.2, "ratio_to_bound": 1.0346}
    line = speedup.v1_mode_headline(strategies)
    assert line.startswith("v1 mode (trainer.v1.trainer_mode=pipelined")
    assert "1.035x the critical-path bound" in line and "1.010x the legacy trainer's both" in line
    del strategies["both"]
    assert "legacy" not in speedup.v1_mode_headline(strategies)
    assert speedup.v1_mode_headline({"both": {"step_s": 1.0, "ratio_to_bound": 1.0}}) == ""
