"""Throughput of one reward worker: our managers versus verl's own ``rate_limited``, same run.

What one ``RewardLoopWorker`` does with a batch is ``asyncio.gather`` over ``run_single`` of every
sample; this script does exactly that in-process for each manager, against the local server over
real loopback HTTP, and reports samples/s, the ratio to verl's ``rate_limited`` measured in the same
run, and our overhead per sample.

Scenarios:
1. ``overhead``: an async user function with no I/O. Pure manager overhead: verl ``rate_limited``
   vs ``async_rate_limited``.
2. ``judge``: a zero-latency local judge over HTTP. verl ``rate_limited`` running a user function
   that calls the judge with aiohttp (as a user would write it) vs our ``llm_judge``.
3. ``capacity``: judge latency 100 ms, server capacity 64: 1024 samples vs the ideal 1024*0.1/64 s.

CPU per sample swings by about 0.2 ms with the garbage collector: a full (generation 2) collection
walks every object of the process, and a process that imported verl, torch and transformers holds
millions, so whether one falls inside a timed batch decides much of its cost, for every manager.
The table reports the full collections per timed batch. ``--freeze-heap`` moves what exists after
each manager's warm-up into the permanent generation (``gc.freeze()``, undone after its
measurement), as a long-running worker that froze its start-up heap would run; it applies to every
manager alike.

Run: ``python benchmarks/manager_throughput.py [--samples 2048] [--json bench_out/manager_throughput.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf, open_dict

USER_FUNCTIONS = '''
import aiohttp

from async_reward.judge.prompts import BUILTIN_TEMPLATES, build_messages

TEMPLATE = BUILTIN_TEMPLATES["correctness"]
_sessions = {}

async def exact_match(data_source, solution_str, ground_truth, extra_info=None):
    return float(str(ground_truth) in solution_str)

async def judge_over_http(data_source, solution_str, ground_truth, extra_info=None, judge_url=None):
    """What a user of verl's rate_limited writes to call an LLM judge: one shared session."""
    import asyncio
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None:
        session = _sessions[loop] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    # The same messages llm_judge sends, so both sides put the same bytes on the wire.
    messages = build_messages(TEMPLATE, prompt="", response=solution_str, ground_truth=str(ground_truth))
    body = {"model": "judge", "messages": messages, "temperature": 0.0, "max_tokens": 512}
    async with session.post(judge_url, json=body) as resp:
        reply = await resp.json()
    text = reply["choices"][0]["message"]["content"]
    return float(text.rsplit("[[", 1)[1].split("]]", 1)[0]) / 10
'''


def compose_config(tokenizer_dir: Path) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}"])


def make_config(
    base: Any,
    manager: str,
    *,
    async_reward: dict | None = None,
    reward: dict | None = None,
    function: tuple[str, str] | None = None,
    reward_kwargs: dict | None = None,
) -> Any:
    config = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    with open_dict(config):
        config.reward.reward_manager.name = manager
        config.reward.num_workers = 1
        config.reward.async_reward = async_reward or {}
        for key, value in (reward or {}).items():
            config.reward[key] = value
        if function is not None:
            config.reward.custom_reward_function.path, config.reward.custom_reward_function.name = function
            config.reward.custom_reward_function.reward_kwargs = reward_kwargs or {}
    return config


def make_batch(tokenizer: Any, n: int) -> Any:
    """``n`` one-sample groups asking ``i + 1``; every other answer is wrong."""
    from async_reward.testing import rollout_batch

    answers = [i + 1 if i % 2 == 0 else i + 2 for i in range(n)]
    return rollout_batch(
        tokenizer,
        [f"What is {i} + 1?" for i in range(n)],
        [f"The answer is {answer}" for answer in answers],
        [str(i + 1) for i in range(n)],
        data_source="bench",
        prompt_length=32,
        response_length=32,
    )


async def run_worker(manager: Any, batch: Any) -> tuple[float, list[dict]]:
    """What verl's RewardLoopWorker.compute_score_batch does, timed."""
    items = [batch[i : i + 1] for i in range(len(batch))]
    start = time.perf_counter()
    outputs = await asyncio.gather(*(manager.run_single(item) for item in items))
    return time.perf_counter() - start, outputs


def process_cpu_s() -> float:
    """CPU time of this process (all threads): robust to other load on a shared machine."""
    return time.process_time()


async def _close_user_sessions(manager: Any) -> None:
    """The baseline's user function keeps one aiohttp session per loop; close it as its owner would."""
    fn = getattr(manager, "compute_score", None)
    raw = fn.args[0] if isinstance(fn, functools.partial) and fn.args else None
    for session in getattr(raw, "__globals__", {}).get("_sessions", {}).values():
        await session.close()


def build_manager(config: Any, tokenizer: Any) -> Any:
    from verl.trainer.ppo.reward import load_reward_manager

    return load_reward_manager(config, tokenizer)


def full_collections() -> int:
    """Generation-2 collections of the garbage collector so far."""
    return int(gc.get_stats()[2]["collections"])


async def measure(
    config: Any, tokenizer: Any, batch: Any, repeats: int, *, freeze_heap: bool = False
) -> dict[str, float]:
    manager = build_manager(config, tokenizer)
    await run_worker(manager, batch[: min(64, len(batch))])  # warm-up: sessions, thread pools
    if freeze_heap:
        gc.collect()
        gc.freeze()
    times, cpu = [], []
    outputs: list[dict] = []
    collections_before = full_collections()
    try:
        for _ in range(repeats):
            cpu_start = process_cpu_s()
            elapsed, outputs = await run_worker(manager, batch)
            times.append(elapsed)
            cpu.append(process_cpu_s() - cpu_start)
    finally:
        if freeze_heap:
            gc.unfreeze()
    full_gcs = full_collections() - collections_before
    await _close_user_sessions(manager)
    best = statistics.median(times)
    scores = [float(o["reward_score"]) for o in outputs]
    return {
        "seconds": best,
        "samples_per_s": len(batch) / best,
        "ms_per_sample": 1000 * best / len(batch),
        "mean_score": float(np.mean(scores)),
        "cpu_ms_per_sample": 1000 * statistics.median(cpu) / len(batch),
        "full_gc_per_batch": full_gcs / repeats,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    # verl's rate_limited keeps its limiter in class state, created on first use: reset per scenario.
    from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager

    import async_reward  # noqa: F401  (registers our managers)
    from async_reward.testing import build_tiny_tokenizer
    from async_reward.tools.devserver import ServerProcess

    workdir = Path(tempfile.mkdtemp(prefix="async-reward-bench-"))
    tokenizer = build_tiny_tokenizer(workdir / "tokenizer")
    functions = workdir / "user_functions.py"
    functions.write_text(USER_FUNCTIONS)
    base = compose_config(workdir / "tokenizer")
    batch = make_batch(tokenizer, args.samples)
    concurrency = args.concurrency
    results: dict[str, Any] = {
        "samples": args.samples,
        "concurrency": concurrency,
        "freeze_heap": args.freeze_heap,
    }

    verl_limits = {"max_concurrent": concurrency, "timeout": 60.0}
    ours_limits = {"limits": {"max_concurrency": concurrency}}

    with ServerProcess("--seed", "0") as server:
        scenarios = {
            "overhead": {
                "verl_rate_limited": make_config(
                    base, "rate_limited", reward=verl_limits, function=(str(functions), "exact_match")
                ),
                "async_rate_limited": make_config(
                    base,
                    "async_rate_limited",
                    async_reward=ours_limits,
                    function=(str(functions), "exact_match"),
                ),
            },
            "judge": {
                "verl_rate_limited": make_config(
                    base,
                    "rate_limited",
                    reward=verl_limits,
                    function=(str(functions), "judge_over_http"),
                    reward_kwargs={"judge_url": server.url + "/v1/chat/completions"},
                ),
                "llm_judge": make_config(
                    base, "llm_judge", async_reward={**ours_limits, "judge": {"base_url": server.url + "/v1"}}
                ),
            },
        }
        for scenario, configs in scenarios.items():
            results[scenario] = {}
            for name, config in configs.items():
                RateLimitedRewardManager._class_initialized = False
                results[scenario][name] = await measure(
                    config, tokenizer, batch, args.repeats, freeze_heap=args.freeze_heap
                )
            ours = next(k for k in configs if k != "verl_rate_limited")
            results[scenario]["cpu_ratio_verl_over_ours"] = (
                results[scenario]["verl_rate_limited"]["cpu_ms_per_sample"]
                / results[scenario][ours]["cpu_ms_per_sample"]
            )
            results[scenario]["ratio_vs_verl"] = (
                results[scenario][ours]["samples_per_s"]
                / results[scenario]["verl_rate_limited"]["samples_per_s"]
            )

        # Capacity-bound run: 100 ms per call, 64 concurrent on the server.
        server.update_config(latency_ms=[100.0, 100.0], capacity=64, overflow="queue")
        server.reset()
        # 12.5 % more in flight than the server's capacity (it queues the rest), so a freed server
        # slot never waits while we prepare the next request.
        config = make_config(
            base,
            "llm_judge",
            async_reward={"limits": {"max_concurrency": 72}, "judge": {"base_url": server.url + "/v1"}},
        )
        capacity_batch = make_batch(tokenizer, 1024)
        manager = build_manager(config, tokenizer)
        elapsed, outputs = await run_worker(manager, capacity_batch)
        ideal = 1024 * 0.1 / 64
        results["capacity"] = {
            "seconds": elapsed,
            "ideal_s": ideal,
            "ratio_to_ideal": elapsed / ideal,
            "server_max_in_flight": server.stats()["max_in_flight"],
            "statuses": sorted({o["reward_extra_info"]["status"] for o in outputs}),
        }
        from async_reward._core.http import close_sessions

        await close_sessions()
    return results


def print_table(results: dict[str, Any]) -> None:
    heap = "start-up heap frozen" if results["freeze_heap"] else "heap not frozen"
    print(f"\nOne reward worker, {results['samples']} samples, concurrency {results['concurrency']}, {heap}")
    print(
        f"{'scenario':<10} {'manager':<20} {'samples/s':>10} {'ms/sample':>10}"
        f" {'CPU ms/sample':>14} {'mean score':>10} {'full GCs/batch':>14}"
    )
    for scenario in ("overhead", "judge"):
        for name, row in results[scenario].items():
            if isinstance(row, dict):
                print(
                    f"{scenario:<10} {name:<20} {row['samples_per_s']:>10.0f} {row['ms_per_sample']:>10.3f}"
                    f" {row['cpu_ms_per_sample']:>14.3f} {row['mean_score']:>10.2f}"
                    f" {row['full_gc_per_batch']:>14.1f}"
                )
        print(
            f"{scenario:<10} {'ratio ours / verl':<20} {results[scenario]['ratio_vs_verl']:>10.2f}"
            f" (CPU per sample: verl / ours = {results[scenario]['cpu_ratio_verl_over_ours']:.2f})"
        )
    cap = results["capacity"]
    print(
        f"\ncapacity: 1024 samples, 100 ms, 64 concurrent: {cap['seconds']:.2f} s"
        f" vs ideal {cap['ideal_s']:.2f} s"
        f" = {cap['ratio_to_ideal']:.3f}x (server max in flight {cap['server_max_in_flight']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048, help="samples per measured batch")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrency cap of every manager")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per manager (median reported)")
    parser.add_argument(
        "--freeze-heap",
        action="store_true",
        help="gc.freeze() after each manager's warm-up (undone after it), for every manager alike",
    )
    parser.add_argument("--json", type=Path, default=Path("bench_out/manager_throughput.json"))
    args = parser.parse_args(argv)
    results = asyncio.run(main_async(args))
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nraw numbers: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
