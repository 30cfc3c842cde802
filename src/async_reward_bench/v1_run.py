"""One run of a verl v1 strategy in the speed-up benchmark (see ``benchmark.v1_trainer``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from async_reward_bench.calibration import StageMedians
from async_reward_bench.generation import rollout_durations
from async_reward_bench.scenarios import V1_STRATEGIES, Regime
from async_reward_bench.tag_store import TagStore, serving_replay_buffer
from async_reward_bench.timeline import InFlightSampler
from async_reward_bench.v1_agent_loop import V1AgentLoop
from async_reward_bench.v1_trainer import V1Harness, build_v1_trainer, run_v1_steps

if TYPE_CHECKING:
    from async_reward_bench.gpu_split import GpuSplit
    from async_reward_bench.settings import BenchConfig

__all__ = ["run_v1_strategy", "scored_during_rollout", "wait_until_idle"]

#: Modules of our trainer modes that read TransferQueue's tags themselves (besides verl's replay buffer).
_TAG_READERS: dict[str, tuple[str, ...]] = {
    "decoupled": ("async_reward.v1.decoupled.trainer", "async_reward.v1.decoupled.replay_buffer"),
}


def run_v1_strategy(
    env: dict[str, Any],
    cfg: BenchConfig,
    regime: Regime,
    stages: StageMedians,
    strategy: str,
    tag: int,
    bar: Any,
    split: GpuSplit | None = None,
    judge_wake_sleep_s: float | None = None,
) -> dict[str, Any]:
    """Run ``cfg.steps`` steps of verl's v1 trainer in ``V1_STRATEGIES[strategy]`` mode.

    ``stages`` are the regime's time-scaled medians, on the strategy's GPUs (for a separate mode,
    ``split.stages`` of them: generation on the rollout GPUs, training on the trainer GPUs); ``split``
    gives a separate mode its config and its weight-sync pause. Returns ``{"records", "samples", "origin"}``
    like our strategies' runs. ``judge_wake_sleep_s`` (recipe seconds) puts the judge on the training
    GPUs (``colocated_judge``): nothing is scored while generating, the trainer scores each sampled
    batch at once, waking and putting the judge to sleep around it. Whatever is still generating or
    scoring when the last step ends (a ``colocate_async`` run keeps a batch in flight) is dropped,
    and the judge drains before the next run starts.
    """
    server, factory = env["server"], env["factory"]
    factory.tag = tag
    server.reset()
    store = TagStore()
    rewards = env["v1_rewards"]
    agent_loop = V1AgentLoop(
        rewards.reward_loop_worker_handles,
        store,
        full_speed_slots=cfg.rollout_slots or cfg.prompts * cfg.group_size,
        seed=cfg.seed,
        # our pipelined mode's agent loop writes each trajectory when generated, scores it after
        write_when_generated=V1_STRATEGIES[strategy] == "pipelined",
        # our decoupled mode's agent loop keeps each group's progress on its prompt tag
        write_progress=V1_STRATEGIES[strategy] == "decoupled",
        score_when_generated=judge_wake_sleep_s is None,
    ).start()

    def durations(number: int, samples: int) -> np.ndarray:
        rng = np.random.default_rng([cfg.seed, tag, number])
        return rollout_durations(samples, stages.gen_s, regime.gen_sigma, rng)

    harness = V1Harness(
        stages=stages,
        factory=factory,
        durations=durations,
        agent_loop=agent_loop,
        store=store,
        reward_loop_manager=rewards,
        time_scale=cfg.time_scale,
        weight_sync_s=(split.weight_sync_s if split is not None else 0.0) * cfg.time_scale,
        judge_wake_sleep_s=None if judge_wake_sleep_s is None else judge_wake_sleep_s * cfg.time_scale,
        judge_timeout_s=max(60.0, 20 * stages.step_s),
    )
    config = env["v1_config"](strategy, split) if split is not None else env["v1_config"](strategy)
    trainer = build_v1_trainer(config, harness, strategy)
    _bound_the_wait(trainer.replay_buffer, agent_loop, max(60.0, 20 * stages.step_s))
    if V1_STRATEGIES[strategy] == "pipelined":  # ours waits in its own loop: bounded the same way
        trainer.pipeline_config.chunk_timeout_s = max(60.0, 20 * stages.step_s)
    sampler = InFlightSampler(server.stats, cfg.sample_interval_real).start()
    origin = time.perf_counter()
    records = []
    try:
        with serving_replay_buffer(store, *_TAG_READERS.get(V1_STRATEGIES[strategy], ())):
            for record in run_v1_steps(trainer, cfg.steps):
                records.append(record)
                bar.update(1)
    finally:
        samples = sampler.stop()
        agent_loop.close()
        wait_until_idle(server)
    return {
        "records": records,
        "samples": samples,
        "origin": origin,
        "scored_during_rollout": scored_during_rollout(agent_loop.events),
        "agent_loop_events": agent_loop.events,
    }


def scored_during_rollout(events: list[tuple[float, str, int]]) -> float:
    """Fraction of the samples scored before their batch's last sample finished generating: how
    much of the scoring v1's per-sample reward overlapped with the generation tail (ours: none, a
    batch is scored once its rollout returns)."""
    last_generated: dict[int, float] = {}
    for at, kind, batch in events:
        if kind == "generated":
            last_generated[batch] = max(at, last_generated.get(batch, at))
    scored = [(at, batch) for at, kind, batch in events if kind == "scored" and batch in last_generated]
    if not scored:
        return float("nan")
    return sum(at < last_generated[batch] for at, batch in scored) / len(scored)


def _bound_the_wait(replay_buffer: Any, agent_loop: V1AgentLoop, limit_s: float) -> None:
    """Make verl's replay buffer raise instead of polling forever (verl #7155: ``sample()`` waits
    for ever on a group stuck ``running``) or after the agent loop died; a benchmark must end.
    Wraps, on this instance only, ``sample`` (which starts the clock) and the poll sleep every
    waiting ``sample()`` calls."""
    sample, poll = replay_buffer.sample, replay_buffer._wait_for_next_poll
    deadline = [float("inf")]

    def timed_sample(*args: Any, **kwargs: Any) -> Any:
        deadline[0] = time.monotonic() + limit_s
        return sample(*args, **kwargs)

    def bounded_poll(partition_id: str, last_debug_time: float) -> float:
        agent_loop.check()
        if time.monotonic() > deadline[0]:
            raise TimeoutError(f"verl's replay buffer waited over {limit_s:.0f} s for a batch")
        return float(poll(partition_id, last_debug_time))

    replay_buffer.sample = timed_sample
    replay_buffer._wait_for_next_poll = bounded_poll


def wait_until_idle(server: Any, timeout: float = 120.0) -> None:
    """Wait until the judge serves and queues nothing (requests left by a run finish or fail)."""
    deadline = time.monotonic() + timeout
    while server.stats()["in_flight_total"] and time.monotonic() < deadline:
        time.sleep(0.05)
