"""Plumbing of the pipelined manager: the worker actors it owns and its background asyncio loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from omegaconf import DictConfig
from ray.exceptions import RayActorError
from verl import DataProto

from async_reward.legacy.worker import PipelineRewardWorker

__all__ = ["BackgroundLoop", "WorkerRef", "enqueue_rows", "kill_workers", "start_workers", "wait_until_ready"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerRef:
    """The driver's view of one worker actor."""

    label: str
    """The actor's unique Ray name (verl's own workers are ``reward_loop_worker_{i}``: no clash)."""
    handle: Any
    alive: bool = True
    outstanding: dict[int, set[int]] = field(default_factory=dict)
    """ticket seq -> indices sent to this worker and not reported back: re-sent if it dies."""
    capacity: int = 1
    """Samples the worker runs at once."""
    in_flight: dict[int, int] = field(default_factory=dict)
    """ticket seq -> samples running in the worker, as of its last report."""
    stealing: bool = False
    """A rebalancing move towards this worker is under way."""


def start_workers(
    config: DictConfig,
    count: int,
    *,
    name_prefix: str,
    max_concurrency: int | None,
    options: dict[str, Any] | None,
    ready_timeout_s: float,
    reward_router_address: str | None = None,
) -> list[WorkerRef]:
    """Start ``count`` worker actors and wait until each has built its reward manager
    (``reward_router_address``: verl's router in front of a reward model served in the job).

    Raises whatever a worker's constructor raised (bad config, unknown manager), after killing all.
    """
    # Ray's max_concurrency bounds concurrent *method calls* (collect, enqueue, cancel), not samples.
    actor_options = {"max_concurrency": 64, **(options or {})}
    actor_cls = ray.remote(PipelineRewardWorker)
    workers = []
    for i in range(count):
        label = f"{name_prefix}_{i}"
        handle = actor_cls.options(name=label, **actor_options).remote(
            config, max_concurrency, reward_router_address
        )
        workers.append(WorkerRef(label=label, handle=handle))
    return wait_until_ready(workers, ready_timeout_s)


def wait_until_ready(workers: list[WorkerRef], ready_timeout_s: float) -> list[WorkerRef]:
    """Wait until each worker has built its reward manager and record the capacity it reports.

    Raises whatever a worker's constructor raised (or Ray's timeout), after killing all of them.
    """
    try:
        replies = ray.get([w.handle.ready.remote() for w in workers], timeout=ready_timeout_s)
    except BaseException:
        kill_workers(workers)
        raise
    for worker, reply in zip(workers, replies, strict=True):
        worker.capacity = int(reply["capacity"])
    return workers


def kill_workers(workers: list[WorkerRef], wait_s: float = 30.0) -> None:
    """Kill the actors and return once each is gone (or ``wait_s`` passes).

    ``ray.kill`` only sends the request: a call made just after it can still reach the live process.
    Waiting here makes "closed" mean "no actor of ours left" for the caller.
    """
    for worker in workers:
        worker.alive = False
        try:
            ray.kill(worker.handle, no_restart=True)
        except Exception:  # already gone
            logger.debug("killing %s failed", worker.label, exc_info=True)
    deadline = time.monotonic() + wait_s
    for worker in workers:
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                ray.get(worker.handle.__ray_ready__.remote(), timeout=remaining)
            except RayActorError:
                break  # dead, as asked
            except Exception:  # timed out or unreachable: give up waiting, the kill stands
                logger.debug("waiting for %s to die failed", worker.label, exc_info=True)
                break
            time.sleep(0.05)  # still answering: the kill has not landed yet


def enqueue_rows(worker: WorkerRef, seq: int, data: DataProto, part: np.ndarray, ranks: np.ndarray) -> Any:
    """Slice rows ``part`` out of a ticket's data and submit them to ``worker``; returns the ObjectRef.

    Runs in a thread: serialising a large batch must not stall the loop collecting results.
    """
    contiguous = bool(np.all(np.diff(part) == 1))
    rows = data.slice(int(part[0]), int(part[-1]) + 1) if contiguous else data.select_idxs(part)
    return worker.handle.enqueue.remote(seq, part.tolist(), rows, ranks[part].tolist())


class BackgroundLoop:
    """An asyncio loop in a daemon thread; coroutines are handed to it from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task on the loop (callable from any thread)."""
        if threading.current_thread() is self._thread:
            self._track(coro)
        else:
            self.loop.call_soon_threadsafe(self._track, coro)

    def _track(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel every task, stop the loop and join the thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in self._tasks if not t.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout_s)
        except concurrent.futures.TimeoutError:
            logger.warning("pipeline tasks did not stop within %.1f s", timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()
