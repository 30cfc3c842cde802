"""The pipeline speedup benchmark end to end, in its quick mode shrunk further (a smoke test: real Ray
workers, real ``llm_judge`` over HTTP, calibrated waits), plus its pure parts. No tight speed asserts:
only that every strategy ran, wrote sane numbers and pictures, and that pipelining blocked less."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from async_reward.benchmark import speedup
from async_reward.benchmark.calibration import RECIPE_SERVICE, load_medians, recipe_targets
from async_reward.benchmark.report import measured_steps, service_busy_fraction

STRATEGIES = ["baseline", "mini_batch", "one_step_off", "both", "recipe_style"]


def test_quick_benchmark_writes_sane_results(ray_cluster, tmp_path, capsys):
    argv = ["--quick", "--steps", "3", "--time-scale", "0.002", "--prompts", "16", "--capacity", "4"]
    assert speedup.main([*argv, "--no-progress", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "pipeline_speedup.json").read_text())
    assert list(results["regimes"]) == ["recipe"]
    regime = results["regimes"]["recipe"]
    assert regime["bound_s"] == pytest.approx(410.0)  # 80 samples x 20.5 s / 4 slots: the recipe's share
    assert list(regime["strategies"]) == STRATEGIES
    for name, summary in regime["strategies"].items():
        assert len(summary["step_times_s"]) == 3 and min(summary["step_times_s"]) > 0
        assert summary["step_s"] > 0 and summary["ratio_to_bound"] > 0.5
        assert 0 < summary["service_busy_fraction"] <= 1.0
        assert summary["updates_per_step"] == [4, 4, 4]
        assert summary["reward_status_ok"] == [80, 80, 80]
        assert summary["staleness"] == ([0, 0, 0] if name in ("baseline", "mini_batch") else [0, 1, 1])
        png = Path(summary["timeline_png"])
        assert png == tmp_path / f"timeline_recipe_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    strategies = regime["strategies"]
    assert strategies["baseline"]["reward_blocked_s"] > strategies["both"]["reward_blocked_s"]
    assert strategies["baseline"]["step_s"] > strategies["both"]["step_s"]
    assert math.isnan(strategies["baseline"]["reduction_vs_baseline"]) is False
    assert set(regime["acceptance"]) >= {"both_within_1.02x_bound", "all_ok"}
    out = capsys.readouterr().out
    assert "regime recipe" in out and "recipe_style" in out and "acceptance:" in out


def test_bad_settings_exit_2_without_running(tmp_path, capsys):
    assert speedup.main(["--prompts", "6", "--mini-batches", "4", "--out", str(tmp_path)]) == 2
    assert "cannot be split" in capsys.readouterr().err
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
    gpu = load_medians()["gsm8k_qwen2_7b_base"].gpu_work_s
    for name, ratio in (("balanced", 1.0), ("gpu_bound", 0.5)):
        lo, hi = speedup.regime_latency(speedup.REGIMES[name], cfg, gpu)
        assert hi / lo == pytest.approx(40.0)
        assert cfg.prompts * cfg.group_size * (lo + hi) / 2 / cfg.capacity == pytest.approx(ratio * gpu)
    assert speedup.regime_latency(speedup.REGIMES["recipe"], cfg, gpu) == (1.0, 40.0)


@pytest.mark.parametrize(
    ("steps", "measured"), [(1, [0]), (2, [1]), (3, [1, 2]), (4, [1, 2]), (5, [2, 3]), (7, [2, 3, 4, 5])]
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
