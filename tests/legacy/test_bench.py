"""The pipeline speedup benchmark end to end with our legacy strategies (they run on the legacy
trainer's ``PipelinedRewardLoopManager``), shrunk (real Ray workers, our and verl's reward workers,
real ``llm_judge`` over HTTP, calibrated waits, verl's own v1 trainer code). No
speed asserts and no comparison of two measured times: only that every strategy ran, wrote sane
numbers and pictures, that pipelining showed its structure (counts and orders that hold at any
load), and that a broken judge or a disabled pipeline fails the quick verdict through the path
``make bench`` takes, the latter under a CPU hog."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from async_reward_bench import speedup
from tests.bench.test_bench import TINY, assert_a_sane_tiny_run

OURS = ["baseline", "mini_batch", "one_step_off", "both", "recipe_style"]
#: The v1 mode beside our legacy strategies: the first line compares it with legacy ``both`` of the same
#: run. verl's v1 strategies and our ``decoupled`` mode: tests/bench/test_bench_v1_strategies.py.
V1 = ["v1_pipelined_both"]
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


def test_tiny_benchmark_of_every_legacy_strategy_writes_sane_results(ray_cluster, tmp_path, capsys):
    """Our legacy schedules and the v1 mode through the real reward path; the verdict's outcome on this
    loaded machine is not asserted (the verdict has its own tests), its presence and shape are."""
    argv = [
        *TINY,
        "--regimes",
        "recipe",
        "--checks",
        "quick",
        "--strategies",
        *OURS,
        *V1,
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
        assert_a_sane_tiny_run(name, summary, tmp_path)
    strategies = regime["strategies"]
    for name in OURS:
        assert strategies[name]["staleness"] == (
            [0, 0, 0] if name in ("baseline", "mini_batch") else [0, 1, 1]
        )
        assert "scored_during_rollout" not in strategies[name]
    # our v1 trainer mode, schedule both: one-step off (staleness 1 after the first step); its 4
    # updates a step are checked with every strategy's above
    assert strategies["v1_pipelined_both"]["staleness"] == [0, 1, 1]
    both = strategies["both"]  # colocated: idle only when neither generating nor training
    assert both["rollout_idle_fraction"] == pytest.approx(1 - both["gpu_stage_fraction"])
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
    # the start lines our verl plugin says while the strategies are built, then the report
    out = "\n".join(line for line in printed if not line.startswith("async_reward: ")).strip().splitlines()
    # the v1 mode (the schedule to use) first, against legacy "both" of this run, then the verdict
    assert out[0].startswith("async-reward bench: v1 mode (trainer.v1.trainer_mode=pipelined")
    assert "the legacy trainer's both (same run)" in out[0]
    assert out[1].startswith(f"async-reward bench: {verdict['outcome']}")
    assert any("v1_pipelined_both" in line for line in out) and out[-1].startswith("wall time")


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
