"""Does ``PipelinedRewardLoopManager`` keep a bounded reward service busy, and is submit instant?

Everything is real: a local Ray cluster, our Ray reward workers running the ``llm_judge`` manager,
HTTP over loopback to the local judge server (``ThreadedDevServer``) with a configured latency
distribution and capacity (max concurrent requests; overflow queues).

Measures:
1. ``submit``: wall time of ``submit`` for 1024 prompts x 5 responses (median of a few; each
   ticket is cancelled right after).
2. ``one_ticket``: N samples at latency uniform(lo, hi) ms and capacity C, submit to last sample,
   against the capacity bound N * mean_latency / C (ratio; 1.0 is ideal).
3. ``two_tickets``: two tickets of N submitted back to back (one-step off-policy): time until both
   are done against twice the bound, and when ticket 1 finished (older tickets get slots first, so
   ticket 1 should finish near the single-ticket bound while ticket 2 only fills idle slots).

Two reference points besides the capacity bound: the server's own seeded latency draws divided by
capacity, and the makespan of an ideal zero-overhead greedy scheduler over those draws (the tail
of the last requests on few slots is inherent to any client that cannot see latencies in advance).

By default ~12% more samples are in flight than the server serves at once (``--oversubscribe``):
the server queues the extra requests (overflow=queue), so a slot freed by a response is taken at
once instead of idling while our client turns that response into the next request.

Run: ``python benchmarks/pipeline_capacity.py [--quick] [--workers 1] [--oversubscribe 1.125]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def compose_config(tokenizer_dir: Path, judge_url: str, concurrency: int, workers: int) -> Any:
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            config_name="ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}"]
        )
    with open_dict(config):
        config.reward.reward_manager.name = "llm_judge"
        config.reward.num_workers = workers
        config.reward.async_reward = {
            "judge": {"base_url": judge_url + "/v1"},
            "limits": {"max_concurrency": concurrency},
            "timeout_s": 60.0,
        }
    return config


_PROMPT_IDS = iter(range(10**9))


def make_batch(tokenizer: Any, prompts: int, group: int = 5) -> Any:
    """A rollout-shaped DataProto: ``prompts`` x ``group`` responses, every prompt unique (no request
    is shared in flight by the judge's de-duplication), every fifth response wrong."""
    from async_reward.testing import rollout_batch

    prompt_ids = [next(_PROMPT_IDS) for _ in range(prompts)]
    return rollout_batch(
        tokenizer,
        [f"What is 2 + 3? #{prompt_id}" for prompt_id in prompt_ids for _ in range(group)],
        [f"The answer is {7 if g == 4 else 5} ({g})" for _ in prompt_ids for g in range(group)],
        ["5"] * (prompts * group),
        uids=[f"uid-{prompt_id}" for prompt_id in prompt_ids for _ in range(group)],
        data_source="bench",
        prompt_length=32,
        response_length=32,
    )


def greedy_bounds(seed: int, lo: float, hi: float, count: int, capacity: int) -> tuple[float, float]:
    """The server's own latency draws for its first ``count`` requests after a reset (it reseeds),
    as (work / capacity, makespan of an ideal greedy FIFO scheduler with zero overhead).

    The second is the best any non-clairvoyant client can do with those draws: it includes the
    tail (the last requests finishing on few slots) that the plain capacity bound ignores.
    """
    import heapq
    import random

    rng = random.Random(seed)
    latencies = []
    for _ in range(count):
        rng.random()  # the fault draw the server makes first
        latencies.append(rng.uniform(lo, hi) / 1000.0)
    slots = [0.0] * capacity
    for latency in latencies:
        heapq.heappush(slots, heapq.heappop(slots) + latency)
    return sum(latencies) / capacity, max(slots)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from async_reward.legacy import PipelinedRewardLoopManager
    from async_reward.testing import build_tiny_tokenizer
    from async_reward.tools.devserver import DevServerConfig, ThreadedDevServer
    from async_reward.wiring.integration import init_local_ray

    lo, hi = args.latency_ms
    mean_latency_s = (lo + hi) / 2000.0
    ideal_s = args.samples * mean_latency_s / args.capacity
    workdir = Path(tempfile.mkdtemp(prefix="pipeline_capacity_"))
    tokenizer = build_tiny_tokenizer(workdir / "tokenizer")
    server = ThreadedDevServer(DevServerConfig(seed=args.seed))
    server.start()
    started_ray = init_local_ray(num_cpus=max(4, args.workers + 2))
    config = compose_config(workdir / "tokenizer", server.url, args.concurrency, args.workers)
    manager = PipelinedRewardLoopManager(config, num_workers=args.workers, max_concurrency=args.concurrency)
    results: dict[str, Any] = {
        "config": {
            "samples": args.samples,
            "capacity": args.capacity,
            "latency_ms": [lo, hi],
            "workers": args.workers,
            "concurrency_per_worker": args.concurrency,
            "in_flight_total": args.concurrency * args.workers,
            "ideal_one_ticket_s": ideal_s,
        }
    }
    work_1, greedy_1 = greedy_bounds(args.seed, lo, hi, args.samples, args.capacity)
    work_2, greedy_2 = greedy_bounds(args.seed, lo, hi, 2 * args.samples, args.capacity)
    results["bounds"] = {
        "one_ticket": {"drawn_work_s": work_1, "greedy_zero_overhead_s": greedy_1},
        "two_tickets": {"drawn_work_s": work_2, "greedy_zero_overhead_s": greedy_2},
    }
    try:
        # 1. submit latency (1024 prompts x 5), the server slow so cancelled work stays small
        server.update_config(latency_ms=[1000.0, 1000.0], capacity=None)
        big = make_batch(tokenizer, args.submit_prompts)
        timings = []
        for _ in range(args.submit_repeats):
            started = time.perf_counter()
            ticket = manager.submit(big)
            timings.append(time.perf_counter() - started)
            manager.cancel(ticket)
        results["submit"] = {
            "samples": len(big),
            "median_ms": statistics.median(timings) * 1000,
            "all_ms": [t * 1000 for t in timings],
        }
        time.sleep(1.5)  # let the cancelled requests drain out of the server

        server.update_config(latency_ms=[lo, hi], capacity=args.capacity, overflow="queue")
        prompts = args.samples // 5
        # warm-up: connections, code paths (not measured)
        manager.compute_rm_score(make_batch(tokenizer, max(2, args.capacity // 5)))

        # 2. one ticket
        runs = []
        for _ in range(args.repeats):
            batch = make_batch(tokenizer, prompts)
            server.reset()
            wall_started, started = time.time(), time.perf_counter()
            ticket = manager.submit(batch)
            manager.get_chunk(ticket, len(batch))
            elapsed = time.perf_counter() - started
            metrics = manager.ticket_metrics(ticket)
            stats = server.stats()
            runs.append(
                {
                    "elapsed_s": elapsed,
                    "ratio": elapsed / ideal_s,
                    "vs_greedy": elapsed / greedy_1,
                    "max_in_flight": stats["max_in_flight"],
                    "first_request_after_s": min(stats["request_times"]) - wall_started,
                    "status_ok": metrics["reward/status_ok"],
                }
            )
        results["one_ticket"] = {"runs": runs, "median_ratio": statistics.median(r["ratio"] for r in runs)}

        # 3. two tickets back to back
        runs = []
        for _ in range(args.repeats):
            first, second = make_batch(tokenizer, prompts), make_batch(tokenizer, prompts)
            server.reset()
            started = time.perf_counter()
            t1, t2 = manager.submit(first), manager.submit(second)
            manager.get_chunk(t1, len(first))
            first_s = time.perf_counter() - started
            manager.get_chunk(t2, len(second))
            pair_s = time.perf_counter() - started
            runs.append(
                {
                    "pair_s": pair_s,
                    "pair_ratio": pair_s / (2 * ideal_s),
                    "pair_vs_greedy": pair_s / greedy_2,
                    "ticket1_s": first_s,
                    "ticket1_ratio": first_s / ideal_s,
                    "ticket2_submit_to_done_s": manager.ticket_metrics(t2)["timing_s/reward_submit_to_done"],
                }
            )
        results["two_tickets"] = {
            "runs": runs,
            "median_pair_ratio": statistics.median(r["pair_ratio"] for r in runs),
            "median_ticket1_ratio": statistics.median(r["ticket1_ratio"] for r in runs),
        }
    finally:
        manager.close()
        server.stop()
        if started_ray:
            ray.shutdown()
    return results


def print_table(results: dict[str, Any]) -> None:
    cfg = results["config"]
    print(
        f"\nPipelinedRewardLoopManager, llm_judge over HTTP: {cfg['workers']} worker(s) x "
        f"{cfg['concurrency_per_worker']} concurrent, server capacity {cfg['capacity']}, "
        f"latency uniform {cfg['latency_ms'][0]:.0f}-{cfg['latency_ms'][1]:.0f} ms"
    )
    rows = [
        (
            f"submit, {results['submit']['samples']} samples (median)",
            f"{results['submit']['median_ms']:.1f} ms",
            "",
        ),
    ]
    ideal = cfg["ideal_one_ticket_s"]
    bounds = results["bounds"]
    rows.append(
        (
            "bound: drawn work / capacity",
            f"{bounds['one_ticket']['drawn_work_s']:.2f} s / {bounds['two_tickets']['drawn_work_s']:.2f} s",
            "",
        )
    )
    rows.append(
        (
            "bound: greedy, zero overhead",
            f"{bounds['one_ticket']['greedy_zero_overhead_s']:.2f} s / "
            f"{bounds['two_tickets']['greedy_zero_overhead_s']:.2f} s",
            "",
        )
    )
    for run in results["one_ticket"]["runs"]:
        rows.append(
            (
                f"one ticket, {cfg['samples']} samples",
                f"{run['elapsed_s']:.2f} s (ideal {ideal:.2f})",
                f"{run['ratio']:.3f}  (vs greedy {run['vs_greedy']:.3f}; "
                f"1st request +{run['first_request_after_s'] * 1000:.0f} ms)",
            )
        )
    for run in results["two_tickets"]["runs"]:
        rows.append(
            (
                "two tickets, pair",
                f"{run['pair_s']:.2f} s (ideal {2 * ideal:.2f})",
                f"{run['pair_ratio']:.3f}  (vs greedy {run['pair_vs_greedy']:.3f})",
            )
        )
        rows.append(
            (
                "two tickets, ticket 1 done",
                f"{run['ticket1_s']:.2f} s (ideal {ideal:.2f})",
                f"{run['ticket1_ratio']:.3f}",
            )
        )
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'time':<24} ratio")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:<24} {ratio}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (160 samples, 1 repeat)")
    parser.add_argument("--samples", type=int, default=640, help="samples per ticket (multiple of 5)")
    parser.add_argument("--capacity", type=int, default=32, help="server capacity (concurrent requests)")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=[10.0, 400.0], metavar=("LO", "HI"))
    parser.add_argument("--workers", type=int, default=1, help="reward worker actors")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="samples in flight per worker (default: ceil(capacity * oversubscribe / workers))",
    )
    parser.add_argument(
        "--oversubscribe",
        type=float,
        default=1.125,
        help="total in flight / capacity; > 1 keeps a request queued at the server (overflow=queue) so "
        "no slot idles while our client turns a response into the next request",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--submit-prompts", type=int, default=1024)
    parser.add_argument("--submit-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=ROOT / "bench_out" / "pipeline_capacity.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats, args.submit_repeats = 160, 1, 3
    if args.concurrency is None:
        args.concurrency = math.ceil(args.capacity * args.oversubscribe / args.workers)
    results = run(args)
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
