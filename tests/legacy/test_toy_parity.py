"""The toy parity benchmark (``async_reward_bench.toy.parity``) end to end, small: its rewards come from
the legacy ``PipelinedRewardLoopManager`` (Ray workers, the dev server's judge over HTTP)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def test_quick_parity_run_writes_json_and_png(ray_cluster: None, server: Any, tmp_path: Path) -> None:
    from async_reward_bench.toy.parity import ParityConfig, format_summary, run_parity

    server.update_config(latency_ms=[5.0, 20.0])
    cfg = ParityConfig(
        seeds=(0,),
        steps=3,
        prompts=4,
        group_size=4,
        mini_batches=2,
        max_operand=4,
        eval_every=2,
        num_workers=1,
        worker_concurrency=16,
        server_url=server.url,
        out_dir=tmp_path,
        progress=False,
    )
    results = run_parity(cfg)
    saved = json.loads((tmp_path / "toy_grpo.json").read_text())
    assert (tmp_path / "toy_grpo.png").stat().st_size > 10_000
    assert {run["mode"] for run in saved["runs"]} == {"baseline", "both"}
    for run in saved["runs"]:
        assert [p["step"] for p in run["curve"]] == [0, 2, 3]
        assert run["total_time_s"] > 0 and 0 <= run["final_accuracy"] <= 1
        assert run["optimizer_steps"] == 6
    assert server.stats()["requests_total"] > 0  # the rewards really went through the judge
    assert "both vs baseline" in format_summary(results["summary"])
