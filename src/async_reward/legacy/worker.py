"""``PipelineRewardWorker``: a Ray actor scoring samples of several tickets, oldest ticket first.

Why not verl's ``RewardLoopWorker``: its ``compute_score_batch`` returns nothing until the whole batch
is scored (all-or-nothing), and calling it once per sample costs about a millisecond of driver time
per sample. This actor takes whole slices of a batch at once (``enqueue``), decides itself which
sample starts next, and hands results back in bulk through a long-poll (``collect``).

Ordering is ours, not a semaphore's: samples wait in a heap keyed by (ticket number, rank), and a
sample starts only while fewer than the manager's concurrency cap
(``reward.async_reward.limits.max_concurrency``) are running. So the ticket the trainer needs next
always gets the free slots first, and a newer ticket only fills slots the older one cannot use.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import Counter
from typing import Any

from omegaconf import DictConfig

__all__ = ["PipelineRewardWorker", "ResultTuple"]

#: ``(ticket_seq, index, payload)``; payload has ``reward_score`` and ``reward_extra_info`` or, when
#: ``run_single`` raised, ``error``; always ``run_s`` (seconds from start to result in this worker).
ResultTuple = tuple[int, int, dict[str, Any]]


class PipelineRewardWorker:
    """One reward worker process holding one reward manager built exactly as verl builds it."""

    def __init__(
        self, config: DictConfig, max_concurrency: int | None = None, reward_router_address: str | None = None
    ) -> None:
        from verl.trainer.ppo.reward import load_reward_manager
        from verl.utils import hf_tokenizer
        from verl.utils.fs import copy_to_local

        import async_reward  # noqa: F401  (registers our managers here, even without the Ray setup hook)
        from async_reward.config import load_config
        from async_reward.judge.in_job.settings import in_job_judge, routed_workers
        from async_reward.managers.base import AsyncRewardManager

        model = config.actor_rollout_ref.model
        tokenizer_path = model.get("tokenizer_path") or model.path
        self.tokenizer = hf_tokenizer(copy_to_local(tokenizer_path), trust_remote_code=True)
        # A reward model served in the job: the manager gets its router and tokenizer, as verl's
        # RewardLoopWorker hands them over.
        model_tokenizer = None
        if reward_router_address is not None and in_job_judge(config):
            model_path = copy_to_local(config.reward.reward_model.model_path)
            model_tokenizer = hf_tokenizer(model_path, trust_remote_code=True)
        from async_reward.judge.group.placement import whole_groups

        # Samples reach the manager through run_single, never /classify, and in whole groups.
        with routed_workers(), whole_groups():
            self.manager = load_reward_manager(
                config,
                self.tokenizer,
                reward_router_address=reward_router_address,
                reward_model_tokenizer=model_tokenizer,
            )
        if isinstance(self.manager, AsyncRewardManager):
            self.manager.driven_by_pipeline = True  # scoring here is the pipelined trainer's own
        # The manager's own limits: llm_judge's default follows a judge served in the job.
        settings = (
            self.manager.settings if isinstance(self.manager, AsyncRewardManager) else load_config(config)
        )
        self.capacity = int(max_concurrency or settings.limits.max_concurrency)
        if self.capacity < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.capacity}")
        group = getattr(self.manager, "group", None)
        if group is not None and self.capacity < group.size:
            from async_reward._core.errors import ConfigError

            # A waiting member holds its slot: fewer slots than members would never complete a group.
            raise ConfigError(
                f"the pipelined reward worker runs {self.capacity} samples at once, fewer than a group's "
                f"{group.size} members, which judge.mode=group must hold together",
                key="reward.async_reward.limits.max_concurrency",
                fix=f"set it (or the pipeline's max_concurrency) to at least {group.size}",
            )
        self._heap: list[tuple[int, int, int]] = []  # (ticket_seq, rank, index)
        self._waiting: dict[tuple[int, int], tuple[Any, int, int]] = {}  # (seq, index) -> (data, row, rank)
        self._waiting_per_ticket: Counter[int] = Counter()
        self._running: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._ready: list[ResultTuple] = []
        self._ready_event: asyncio.Event | None = None
        self._done_total = 0
        self._cancelled: set[int] = set()

    # ------------------------------------------------------------------ remote API
    async def ready(self) -> dict[str, Any]:
        """Answers once the actor is built (construction errors surface here)."""
        return {"capacity": self.capacity, "manager": type(self.manager).__name__}

    async def enqueue(
        self, ticket_seq: int, indices: list[int], data: Any, ranks: list[int] | None = None
    ) -> int:
        """Queue samples ``indices`` of ticket ``ticket_seq``; row ``j`` of ``data`` is sample
        ``indices[j]``. ``ranks`` orders samples within the ticket (default: ``indices``).
        Returns at once with the number of samples queued (a sample already queued or running here is
        not added twice)."""
        if ticket_seq in self._cancelled:
            return 0  # a cancel can overtake the enqueue it cancels (they come from different threads)
        queued = 0
        for row, index in enumerate(indices):
            key = (ticket_seq, index)
            if key in self._waiting or key in self._running:
                continue
            rank = ranks[row] if ranks is not None else index
            self._waiting[key] = (data, row, rank)
            self._waiting_per_ticket[ticket_seq] += 1
            heapq.heappush(self._heap, (ticket_seq, rank, index))
            queued += 1
        self._pump()
        return queued

    async def collect(self, max_wait_s: float = 1.0) -> dict[str, Any]:
        """Long-poll: wait until a result is ready (or ``max_wait_s`` passes), return all ready ones.

        Returns ``{"results": [ResultTuple, ...], "in_flight": {seq: n}, "queued": {seq: n}}``.
        """
        event = self._event()
        if not self._ready:
            event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=max_wait_s)
        results, self._ready = self._ready, []
        event.clear()
        return {"results": results, **self._counts()}

    async def cancel(self, ticket_seq: int) -> int:
        """Drop the queued samples of a ticket and cancel its running ones; returns how many."""
        self._cancelled.add(ticket_seq)
        dropped = self._waiting_per_ticket.pop(ticket_seq, 0)
        for key in [k for k in self._waiting if k[0] == ticket_seq]:
            del self._waiting[key]  # its heap entry is skipped when popped
        # Removed here, not in the task: a task cancelled before it first runs never enters its body.
        running = [self._running.pop(key) for key in [k for k in self._running if k[0] == ticket_seq]]
        for task in running:
            task.cancel()
        self._ready = [r for r in self._ready if r[0] != ticket_seq]
        self._pump()
        return dropped + len(running)

    async def steal(self, ticket_seq: int, max_samples: int) -> list[int]:
        """Give up to ``max_samples`` queued samples of a ticket (the ones this worker would start
        last) to the driver, which moves them to a worker about to run out of that ticket's work.
        None with ``judge.mode: group``: a group's members must meet in this worker."""
        if getattr(self.manager, "group", None) is not None:
            return []
        mine = sorted(
            ((rank, key) for key, (_, _, rank) in self._waiting.items() if key[0] == ticket_seq), reverse=True
        )[: max(0, max_samples)]
        for _, key in mine:
            del self._waiting[key]  # its heap entry is skipped when popped
            self._waiting_per_ticket[ticket_seq] -= 1
        return [index for _, (_, index) in mine]

    async def stats(self) -> dict[str, Any]:
        """Capacity, totals and per-ticket counts of this worker."""
        return {
            "capacity": self.capacity,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "done_total": self._done_total,
            **self._counts(),
        }

    # ------------------------------------------------------------------ internals
    def _event(self) -> asyncio.Event:
        # Created on first use, inside the actor's event loop.
        if self._ready_event is None:
            self._ready_event = asyncio.Event()
        return self._ready_event

    def _counts(self) -> dict[str, dict[int, int]]:
        running = Counter(seq for seq, _ in self._running)
        return {
            "in_flight": dict(running),
            "queued": {s: n for s, n in self._waiting_per_ticket.items() if n},
        }

    def _pump(self) -> None:
        """Start queued samples, oldest ticket first, while a slot is free."""
        while self._heap and len(self._running) < self.capacity:
            seq, _rank, index = heapq.heappop(self._heap)
            entry = self._waiting.pop((seq, index), None)
            if entry is None:
                continue  # cancelled
            self._waiting_per_ticket[seq] -= 1
            data, row, _ = entry
            self._running[(seq, index)] = asyncio.get_running_loop().create_task(
                self._score(seq, index, data, row)
            )

    async def _score(self, seq: int, index: int, data: Any, row: int) -> None:
        """Score one sample and post its result; every sample taken gets a result or an error payload
        (posted in ``finally``), unless its ticket was cancelled, whatever the manager raised: a user
        function's ``KeyboardInterrupt`` or stray ``CancelledError`` must not leave the driver waiting
        for a sample nobody scores."""
        from async_reward._core.deadline import as_user_code_error, describe_error

        started = time.monotonic()
        payload: dict[str, Any] | None = None
        try:
            output = await self.manager.run_single(data[row : row + 1])
            payload = {
                "reward_score": output["reward_score"],
                # Not copied: the score (a ScoredFloat) holds this very dict, and pickle sends one.
                "reward_extra_info": output.get("reward_extra_info") or {},
            }
        except Exception as exc:  # surfaced by the driver as an error of the ticket, never swallowed
            payload = {"error": describe_error(exc)}
        except BaseException as exc:
            replacement = as_user_code_error(exc)
            if replacement is None:
                raise  # this task is really being cancelled (its ticket, or the actor)
            payload = {"error": describe_error(replacement)}
        finally:
            self._running.pop((seq, index), None)
            if payload is None and seq not in self._cancelled:
                payload = {"error": "scoring stopped before the sample had a result (cancelled)"}
            if payload is not None:
                payload["run_s"] = time.monotonic() - started
                self._done_total += 1
                self._ready.append((seq, index, payload))
                self._event().set()
            self._pump()
