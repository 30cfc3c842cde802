"""The speed-up benchmark's v1 strategies on their own, end to end and shrunk: the legacy trainer's
reward manager is not built for them (so they run where ``async_reward.legacy`` was deleted,
docs/package_structure.md), the run writes sane numbers, and with none of our legacy strategies there
is no verdict. Ours beside them: tests/legacy/test_bench.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from async_reward_bench import speedup
from tests.bench.test_bench import TINY


def test_v1_strategies_run_without_the_legacy_reward_manager(ray_cluster, tmp_path, capsys, monkeypatch):
    from async_reward_bench import environment

    real_environment = environment.bench_environment
    seen: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def watched_environment(cfg: speedup.BenchConfig) -> Iterator[dict[str, Any]]:
        with real_environment(cfg) as env:
            seen.append(env)
            yield env

    monkeypatch.setattr(environment, "bench_environment", watched_environment)
    argv = [*TINY, "--regimes", "recipe", "--strategies", "v1_pipelined_both", "--num-workers", "1"]
    assert speedup.main([*argv, "--no-plots", "--out", str(tmp_path)]) == 0

    (env,) = seen
    assert "manager" not in env  # no PipelinedRewardLoopManager, no async_reward.legacy needed
    assert list(env["actors"]) == ["v1 reward worker 0"]
    regime = json.loads((tmp_path / "pipeline_speedup.json").read_text())["regimes"]["recipe"]
    assert list(regime["strategies"]) == ["v1_pipelined_both"] and "verdict" not in regime
    summary = regime["strategies"]["v1_pipelined_both"]
    assert len(summary["step_times_s"]) == 3 and min(summary["step_times_s"]) > 0
    assert summary["reward_status_ok"] == [80, 80, 80]  # every sample scored once, ok
    assert summary["updates_per_step"] == [4, 4, 4] and summary["staleness"] == [0, 1, 1]
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("async-reward bench: ")]
    assert out[0].startswith("async-reward bench: v1 mode (trainer.v1.trainer_mode=pipelined")
    assert "legacy" not in out[0]  # no legacy "both" ran to compare it with
    assert out[1].startswith("async-reward bench: no verdict (it judges our strategies")
