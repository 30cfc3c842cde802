"""Job-wide admission (``limits.admission: job``) against per-worker admission, same run.

Two reward workers are two Ray actor processes, each building ``llm_judge`` from a verl config as
verl's ``RewardLoopWorker`` does and scoring its own samples with ``run_single`` (what
``compute_score_batch`` does), against the local judge server over loopback HTTP. The load is uneven
on purpose, 3 : 1 (a step's tail, where most of what is left sits at one worker): that is where a
per-worker split idles. Limits are the same job-wide figures in both modes: ``worker`` splits them
(``max_concurrency`` halved, RPM halved per worker), ``job`` holds them in one queue.

Scenarios:

1. ``round_trip``: one worker, one call at a time, a judge with no latency: the extra wall time per
   sample of the job's queue (two actor calls, one of them awaited) against the worker's own.
2. ``throughput``: one worker, 64 calls at a time, no latency: samples per second, local against
   the job's queue (what the broker actor's CPU costs when calls are cheap).
3. ``capacity``: the judge serves 8 requests at once, 100 ms each; 96 + 32 samples. Figure: the
   judge's busy share (service time / (capacity x wall time)) and the wall time against the ideal
   (samples x latency / capacity).
4. ``rpm``: 1200 requests per minute for the job, no latency; 96 + 32 samples. Figure: the share of
   the budget used (requests / (budget x wall time)) and the wall time against the ideal.

Run: ``python benchmarks/job_admission.py [--json bench_out/job_admission.json]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = str(Path(__file__).parent)
sys.path.insert(0, BENCHMARKS)

from manager_throughput import compose_config, make_config  # noqa: E402

HEAVY, LIGHT = 96, 32
CAPACITY, LATENCY_S = 8, 0.1
RPM = 1200.0


def _worker_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class ScoringWorker:
        """One reward worker process: ``llm_judge`` built from the config, scoring its samples."""

        def __init__(self, config: Any, tokenizer_dir: str) -> None:
            sys.path.insert(0, BENCHMARKS)  # for manager_throughput's helpers, in this process too
            from transformers import AutoTokenizer
            from verl.trainer.ppo.reward import load_reward_manager

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
            self.manager = load_reward_manager(config, self.tokenizer)

        async def score(self, samples: int) -> tuple[float, list[str]]:
            from manager_throughput import make_batch, run_worker

            elapsed, outputs = await run_worker(self.manager, make_batch(self.tokenizer, samples))
            return elapsed, [str(output["reward_extra_info"]["status"]) for output in outputs]

    return ScoringWorker


def run_pair(config: Any, tokenizer_dir: Path, loads: list[int]) -> dict[str, Any]:
    """Start one worker per entry of ``loads`` (warmed up), then score them all at once; wall time."""
    import ray

    worker = _worker_class()
    workers = [worker.remote(config, str(tokenizer_dir)) for _ in loads]
    ray.get([w.score.remote(2) for w in workers])  # warm-up: sessions, the broker
    start = time.perf_counter()
    results = ray.get([w.score.remote(n) for w, n in zip(workers, loads, strict=True)])
    wall = time.perf_counter() - start
    statuses = [status for _, batch in results for status in batch]
    for w in workers:
        ray.kill(w)
    return {"wall_s": wall, "ok": statuses.count("ok"), "samples": len(statuses)}


def judge_config(base: Any, url: str, admission: str, workers: int, **limits: Any) -> Any:
    settings = {
        "judge": {"base_url": url + "/v1"},
        "timeout_s": 60.0,
        "limits": {"admission": admission, **limits},
    }
    # The workers run_pair starts, as verl's reward.num_workers (the budgets are split over them).
    return make_config(base, "llm_judge", async_reward=settings, reward={"num_workers": workers})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=300, help="samples of the round-trip scenario")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    import ray

    from async_reward.testing import build_tiny_tokenizer
    from async_reward.tools.devserver import ServerProcess
    from async_reward.wiring.integration import ray_runtime_env

    workdir = Path(tempfile.mkdtemp(prefix="async-reward-job-admission-"))
    tokenizer_dir = workdir / "tokenizer"
    build_tiny_tokenizer(tokenizer_dir)
    base = compose_config(tokenizer_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env=ray_runtime_env({}))
    results: dict[str, Any] = {}
    try:
        with ServerProcess("--port", "0", "--seed", "0") as server:
            for mode in ("worker", "job"):
                one_at_a_time = judge_config(base, server.url, mode, 1, max_concurrency=1)
                results[f"round_trip/{mode}"] = run_pair(one_at_a_time, tokenizer_dir, [args.samples])
                wide = judge_config(base, server.url, mode, 1, max_concurrency=64)
                results[f"throughput/{mode}"] = run_pair(wide, tokenizer_dir, [2000])
        latency_ms = str(int(LATENCY_S * 1000))
        with ServerProcess(
            "--port", "0", "--seed", "0", "--capacity", str(CAPACITY), "--latency-ms", latency_ms, latency_ms
        ) as server:
            for mode, per_call in (("worker", CAPACITY // 2), ("job", CAPACITY)):
                config = judge_config(base, server.url, mode, 2, max_concurrency=per_call)
                server.reset()
                run = run_pair(config, tokenizer_dir, [HEAVY, LIGHT])
                run["max_in_flight"] = server.stats()["max_in_flight_total"]
                results[f"capacity/{mode}"] = run
        with ServerProcess("--port", "0", "--seed", "0") as server:
            for mode in ("worker", "job"):
                config = judge_config(base, server.url, mode, 2, max_concurrency=64, requests_per_minute=RPM)
                results[f"rpm/{mode}"] = run_pair(config, tokenizer_dir, [HEAVY, LIGHT])
    finally:
        ray.shutdown()

    total = HEAVY + LIGHT
    ideal = {"capacity": total * LATENCY_S / CAPACITY, "rpm": total / (RPM / 60)}
    print("| scenario | admission | wall s | figure |")
    print("|---|---|---|---|")
    for key, run in results.items():
        scenario, mode = key.split("/")
        if run["ok"] != run["samples"]:
            raise SystemExit(f"{key}: {run['samples'] - run['ok']} samples not ok")
        if scenario == "round_trip":
            figure = f"{1000 * run['wall_s'] / run['samples']:.2f} ms per sample, one at a time"
        elif scenario == "throughput":
            figure = f"{run['samples'] / run['wall_s']:.0f} samples/s, 64 at a time"
        else:
            busy = ideal[scenario] / run["wall_s"]
            run["busy_share"] = busy
            what = "judge busy" if scenario == "capacity" else "RPM budget used"
            against = run["wall_s"] / ideal[scenario]
            figure = f"{what} {100 * busy:.0f} %, {against:.2f}x the ideal {ideal[scenario]:.1f} s"
        print(f"| {scenario} | {mode} | {run['wall_s']:.2f} | {figure} |")
    for scenario in ("round_trip", "throughput", "capacity", "rpm"):
        ratio = results[f"{scenario}/job"]["wall_s"] / results[f"{scenario}/worker"]["wall_s"]
        results[f"{scenario}/job_over_worker"] = ratio
        print(f"{scenario}: job / worker wall time {ratio:.3f}")
    per_sample_ms = (
        1000 * (results["round_trip/job"]["wall_s"] - results["round_trip/worker"]["wall_s"]) / args.samples
    )
    results["round_trip_cost_ms"] = per_sample_ms
    print(f"cost of the job's queue per attempt, one at a time: {per_sample_ms:.2f} ms")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
