"""The speed-up benchmark's v1 strategies on their own, end to end and shrunk (real Ray workers,
verl's reward workers, real ``llm_judge`` over HTTP, calibrated waits, verl's own v1 trainer code): the
legacy trainer's reward manager is not built for them (so they run where ``async_reward.legacy`` was
deleted, docs/package_structure.md), every strategy writes sane numbers and pictures, and with none of
our legacy strategies there is no verdict. No speed asserts and no comparison of two measured times.
Our legacy strategies beside the v1 mode: tests/legacy/test_bench.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from async_reward_bench import speedup
from tests.bench.test_bench import TINY, assert_a_sane_tiny_run

V1 = ["v1_sync", "v1_colocate_async", "v1_pipelined_both", "v1_separate_async", "v1_decoupled"]


def test_v1_strategies_run_without_the_legacy_reward_manager(ray_cluster, tmp_path, capsys, monkeypatch):
    from async_reward._core import start_lines
    from async_reward_bench import environment, host_speed

    real_environment = environment.bench_environment
    seen: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def watched_environment(cfg: speedup.BenchConfig) -> Iterator[dict[str, Any]]:
        with real_environment(cfg) as env:
            seen.append(env)
            yield env

    monkeypatch.setattr(environment, "bench_environment", watched_environment)
    monkeypatch.setattr(start_lines, "_SAID", set())  # said once per process: this test's lines
    monkeypatch.setattr(host_speed, "MIN_SAMPLES", 1)  # a tiny figure lasts seconds, not the ten needed
    argv = [
        *TINY,
        "--regimes",
        "recipe",
        "--strategies",
        *V1,
        "--num-workers",
        "1",
        "--weight-sync-s",  # only v1_separate_async pushes weights outside its calibrated rollout
        "200",
    ]
    assert speedup.main([*argv, "--out", str(tmp_path)]) == 0

    (env,) = seen
    assert "manager" not in env  # no PipelinedRewardLoopManager, no async_reward.legacy needed
    assert list(env["actors"]) == ["v1 reward worker 0"]
    regime = json.loads((tmp_path / "pipeline_speedup.json").read_text())["regimes"]["recipe"]
    assert list(regime["strategies"]) == V1 and "verdict" not in regime
    assert regime["bound_s"] == pytest.approx(410.0)  # 80 samples x 20.5 s / 4 slots: the recipe's share
    strategies = regime["strategies"]
    for name, summary in strategies.items():
        assert_a_sane_tiny_run(name, summary, tmp_path)
    # the host-speed probe ran beside every figure: its cost of the fixed work, and the slowdown
    # against the run's median figure (0 for the median of these five)
    units = {name: summary["cpu_unit_ms"] for name, summary in strategies.items()}
    assert all(0 < unit < 1000 for unit in units.values()), units
    slowdowns = sorted(summary["host_slowdown"] for summary in strategies.values())
    assert slowdowns[2] == 0 and slowdowns[0] <= 0 <= slowdowns[-1], slowdowns
    assert strategies["v1_sync"]["staleness"] == [0, 0, 0]
    assert max(strategies["v1_colocate_async"]["staleness"]) >= 1  # it trains on batches rolled out ahead
    # our v1 trainer mode, schedule both: one-step off (staleness 1 after the first step)
    assert strategies["v1_pipelined_both"]["staleness"] == [0, 1, 1]
    # verl's separate_async on 1 standalone rollout GPU + 7 trainer GPUs (the best split of 8: the
    # generation work is a small share): each step trains a batch (197.8 s x 8/7) and pushes weights
    # (200 s, generation paused), so it is trainer-bound at 426.1 s, above the service's 410 s.
    split = regime["gpu_split"]
    assert (split["total"], split["rollout"], split["trainer"], split["weight_sync_s"]) == (8, 1, 7, 200.0)
    assert split["bound_s"] == pytest.approx(197.8 * 8 / 7 + 200) == split["terms_s"]["trainer_s"]
    assert split["rollout_work_s"] < 0.5 * 39.8  # the mean response, not the longest
    separate = strategies["v1_separate_async"]
    assert separate["gpus"] == "1+7" and strategies["v1_sync"]["gpus"] == "8"
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
    colocated = strategies["v1_colocate_async"]  # idle only when neither generating nor training
    assert colocated["rollout_idle_fraction"] == pytest.approx(1 - colocated["gpu_stage_fraction"])
    # How much v1's scoring overlapped its generation tail (at this tiny scale, often nothing: the
    # whole rollout lasts 80 ms; test_bench_v1_model shows the per-sample scoring itself).
    assert 0 <= strategies["v1_sync"]["scored_during_rollout"] <= 1
    printed = capsys.readouterr().out.splitlines()
    # the start line our verl plugin says while verl's own v1 modes are built (the seams it implies)
    assert any(line.startswith("async_reward: verl v1 with an async-reward manager") for line in printed)
    out = [line for line in printed if line.startswith("async-reward bench: ")]
    assert out[0].startswith("async-reward bench: v1 mode (trainer.v1.trainer_mode=pipelined")
    assert "legacy" not in out[0]  # no legacy "both" ran to compare it with
    assert out[1].startswith("async-reward bench: no verdict (it judges our strategies")
