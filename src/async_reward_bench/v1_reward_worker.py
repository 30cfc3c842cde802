"""verl's ``RewardLoopWorker``, told which samples to score in bulk rather than one Ray call each.

verl's v1 agent loop scores a sample with ``RewardLoopWorker.compute_score.remote(one_sample_dataproto)``,
as soon as its generation ends. That costs CPU per sample that real time hides and the benchmark's
time scale does not: pickling a one-sample ``DataProto`` alone takes about 2 ms (measured here), and a
Ray call a few hundred microseconds more on each side; at 1/100 that is 0.2-0.3 recipe-seconds per
sample, minutes per 640-sample step, where at real time (8 agent-loop processes, 20-second judge
calls) it is nothing. So this worker gets each batch's rows once (``hold``, when their generation
starts, as verl hands prompts to its agent-loop workers), is told which rows finished generating
(``enqueue``: one call per engine tick, however many finished) and starts each at once, and hands
results back in bulk (``collect``, a long poll). The scoring itself is verl's own ``compute_score``
on the one-sample slice, which runs our manager's ``run_single`` exactly as in verl, one task per
sample, each starting when its sample is generated.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

__all__ = ["HeldBatchRewardWorker", "RewardWorkers", "start_reward_workers"]

#: ``(batch key, row, result or None, error or None)``.
Scored = tuple[str, int, "dict[str, Any] | None", "str | None"]


class HeldBatchRewardWorker(RewardLoopWorker):
    """A ``RewardLoopWorker`` that holds batches and scores the rows it is told to, at once."""

    def __init__(self, config: Any, reward_router_address: Any = None) -> None:
        super().__init__(config, reward_router_address)
        self._held: dict[str, tuple[Any, dict[int, int]]] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        """Per batch key, set once it is held: the agent loop sends a batch without waiting, so a
        row may be enqueued before its batch arrived."""
        self._done: list[Scored] = []
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def hold(self, key: str, data: Any, rows: list[int]) -> int:
        """Keep ``data`` (the batch's ``rows``, in that order) under ``key``; returns the row count."""
        self._held[key] = (data, {row: i for i, row in enumerate(rows)})
        self._arrived.setdefault(key, asyncio.Event()).set()
        return len(rows)

    async def enqueue(self, key: str, rows: list[int]) -> None:
        """Start verl's ``compute_score`` on each of ``rows`` of the batch held under ``key``."""
        for row in rows:
            task = asyncio.get_running_loop().create_task(self._score(key, row))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def collect(self, max_wait_s: float = 1.0) -> list[Scored]:
        """The results finished since the last call, waiting up to ``max_wait_s`` for the first."""
        if not self._done:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), max_wait_s)
        done, self._done = self._done, []
        self._ready.clear()
        return done

    def release(self, key: str) -> None:
        self._held.pop(key, None)
        self._arrived.pop(key, None)

    async def cancel_all(self) -> int:
        """Cancel every scoring in flight and forget held batches; returns how many were cancelled."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._held.clear()
        self._arrived.clear()
        self._done.clear()
        return len(tasks)

    async def _score(self, key: str, row: int) -> None:
        await self._arrived.setdefault(key, asyncio.Event()).wait()
        data, where = self._held[key]
        i = where[row]
        try:
            result: dict[str, Any] | None = dict(await self.compute_score(data[i : i + 1]))
            error = None
        except Exception as exc:  # a raising session: verl's agent loop marks the group failed
            result, error = None, repr(exc)
        self._done.append((key, row, result, error))
        self._ready.set()


@dataclass
class RewardWorkers:
    """What verl's v1 trainer reads of its ``RewardLoopManager``: the workers' handles."""

    reward_loop_worker_handles: list[Any]


def start_reward_workers(config: Any, num_workers: int, warm: Any) -> RewardWorkers:
    """``num_workers`` workers, created as verl's ``RewardLoopManager`` creates its own (one Ray
    actor per ``reward.num_workers``, the verl config as argument), each warmed up on one row of
    ``warm`` so that imports and first connections are not timed."""
    import ray

    workers: list[Any] = [ray.remote(HeldBatchRewardWorker).remote(config, None) for _ in range(num_workers)]
    ray.get([worker.hold.remote("warm-up", warm[0:1], [0]) for worker in workers])
    ray.get([worker.enqueue.remote("warm-up", [0]) for worker in workers])
    for worker in workers:
        done: list[Scored] = []
        for _ in range(60):
            done = ray.get(worker.collect.remote(2.0))
            if done:
                break
        if not done or done[0][3] is not None:
            raise RuntimeError(f"verl's reward worker failed its warm-up: {done or 'no answer in 120 s'}")
        worker.release.remote("warm-up")
    return RewardWorkers(workers)
