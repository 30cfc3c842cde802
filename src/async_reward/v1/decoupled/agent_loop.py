"""The decoupled mode's agent loop: each group publishes how far it got, and a failed group is not scored.

verl's ``AgentLoopWorkerTQ`` tags a prompt ``running`` when its sessions start and ``finished`` (or
``failure``) once every session is generated *and scored*; to the trainer a group in scoring looks
like a group in generation, so it keeps its place in verl's prompt window. This worker (a subclass of
our :class:`~async_reward.v1.agent_loop.RewardAgentLoopWorker`, so group post-processing, ``exclude``
and least-loaded routing to reward workers stay as they are) adds to the prompt's tag, as each
session moves on (see :mod:`async_reward.v1.decoupled.window`):

* ``gen_done`` / ``gen_n``: sessions out of generation / all; ``gen_version``: the oldest policy
  version that generated a token of the group (``min_global_steps`` of verl's partial-rollout client);
* ``unscored``: sessions generated and waiting for (or in) scoring: the group's reward backlog;
* ``failure_reason``: ``generation_error`` (a session raised before its output), ``reward_error``
  (its scoring raised, ``on_failure: raise``).

TransferQueue merges a tag write into the key's tag by read-modify-write, which is not atomic: all
sessions of a group run in this worker's event loop, so each group's writes are serialised by a
lock and always carry the group's current counts (the last write has the latest).

A group one of whose sessions failed will be evicted by the trainer whatever its other sessions
score, so its sessions that reach scoring afterwards are not scored (``decoupled/skipped_scoring``):
no judge call is spent on a group that cannot be trained. A sibling already in scoring finishes.
Those skipped sessions, and any session still unscored when its group's task ends (abandoned: its
task cancelled or failed between generation and scoring), left the reward backlog without a score:
the trainer reports them as ``reward_queue/dropped_samples``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
import transfer_queue as tq
from omegaconf import DictConfig

from async_reward.v1.agent_loop import RewardAgentLoopManager, RewardAgentLoopWorker, number_dispatches

__all__ = [
    "DECOUPLED_AGENT_LOOP_MANAGER",
    "DecoupledAgentLoopManager",
    "DecoupledAgentLoopWorker",
    "GroupFailedError",
]

logger = logging.getLogger(__name__)

#: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` the mode runs.
DECOUPLED_AGENT_LOOP_MANAGER = "async_reward.v1.decoupled.agent_loop.DecoupledAgentLoopManager"


class GroupFailedError(RuntimeError):
    """A session not scored because a sibling already failed (its group will be evicted)."""


@dataclass
class _GroupProgress:
    """One training group's sessions, as far as this worker has seen them."""

    size: int
    generated: set[int] = field(default_factory=set)
    """Sessions out of generation (with an output, or failed there)."""
    unscored: set[int] = field(default_factory=set)
    """Sessions with an output, not yet through scoring."""
    version: int | None = None
    failure_reason: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def tag(self) -> dict[str, Any]:
        tag: dict[str, Any] = {
            "gen_done": len(self.generated),
            "gen_n": self.size,
            "unscored": len(self.unscored),
        }
        if self.version is not None:
            tag["gen_version"] = self.version
        if self.failure_reason is not None:
            tag["failure_reason"] = self.failure_reason
        return tag


class DecoupledAgentLoopWorker(RewardAgentLoopWorker):
    """Our agent-loop worker, publishing each group's generation and scoring progress (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress: dict[str, _GroupProgress] = {}
        self._produced = 0
        self._consumed = 0
        self._skipped = 0
        self._abandoned = 0
        self._score_seconds: list[float] = []

    async def decoupled_stats(self) -> dict[str, Any]:
        """Cumulative sessions generated (``produced``), through scoring (``consumed``), not scored
        for a failed sibling (``skipped``) and left unscored when their group's task ended
        (``abandoned``); the scoring times since the last call (drained)."""
        seconds, self._score_seconds = self._score_seconds, []
        return {
            "produced": self._produced,
            "consumed": self._consumed,
            "skipped": self._skipped,
            "abandoned": self._abandoned,
            "score_seconds": seconds,
        }

    async def _run_prompt(
        self,
        prompt: dict[str, Any],
        sampling_params: dict[str, Any],
        trajectory: dict[str, Any],
        trace: bool = False,
    ) -> None:
        uid = str(prompt["uid"])
        if not trajectory["validate"]:
            try:
                self._progress[uid] = _GroupProgress(self._group_size(prompt, trajectory))
            except Exception:  # verl's _run_prompt reads the same size and fails the group if it cannot
                logger.exception("group %s runs without progress tags: its size is unknown", uid)
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        finally:
            group = self._progress.pop(uid, None)
            if group is not None and group.unscored:  # generated, never through scoring: dropped
                self._abandoned += len(group.unscored)
                logger.warning(
                    "group %s ended with %d generated session(s) never scored", uid, len(group.unscored)
                )

    async def _run_agent_loop(
        self,
        sampling_params: dict[str, Any],
        trajectory: dict[str, Any],
        *,
        agent_name: str,
        trace: bool = True,
        **kwargs: Any,
    ) -> Any:
        uid = str(kwargs.get("uid"))
        try:
            return await super()._run_agent_loop(
                sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs
            )
        except BaseException:
            group = self._progress.get(uid)
            session = int(kwargs["session_id"])
            if group is not None and session not in group.generated:  # it failed in generation
                group.generated.add(session)
                group.failure_reason = group.failure_reason or "generation_error"
                await self._publish(uid, group)
            raise

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        uid, session = str(kwargs["uid"]), int(kwargs["session_id"])
        group = None if validate else self._progress.get(uid)
        if group is not None and session not in group.generated:
            outputs = output if isinstance(output, list) else [output]
            group.generated.add(session)
            if outputs:
                group.unscored.add(session)
                self._produced += 1
            versions = [o.extra_fields.get("min_global_steps") for o in outputs]
            known = [int(v) for v in versions if v is not None]
            if known:
                group.version = min([*known, *([group.version] if group.version is not None else [])])
            await self._publish(uid, group)
        await super()._agent_loop_postprocess(output, validate, **kwargs)

    async def _compute_score(self, outputs: list[Any], kwargs: dict[str, Any]) -> None:
        uid, session = str(kwargs.get("uid")), int(kwargs.get("session_id", -1))
        group = self._progress.get(uid)
        if group is None or session not in group.unscored:  # validation, or already through scoring
            await super()._compute_score(outputs, kwargs)
            return
        if group.failure_reason is not None:
            group.unscored.discard(session)
            self._skipped += 1
            await self._publish(uid, group)
            raise GroupFailedError(
                f"session {session} of group {uid} not scored: the group already failed "
                f"({group.failure_reason}) and will be evicted"
            )
        started, judged = time.monotonic(), bool(outputs) and outputs[-1].reward_score is None
        try:
            await super()._compute_score(outputs, kwargs)
        except Exception:
            group.failure_reason = group.failure_reason or "reward_error"
            raise
        finally:
            group.unscored.discard(session)
            self._consumed += 1
            if judged:
                self._score_seconds.append(time.monotonic() - started)
            await self._publish(uid, group)

    async def _publish(self, uid: str, group: _GroupProgress) -> None:
        """Write the group's progress on its prompt tag (serialised: the merge is read-modify-write)."""
        async with group.lock:
            await tq.async_kv_put(key=uid, partition_id="train", tag=group.tag())


DecoupledAgentLoopWorkerActor: Any = ray.remote(DecoupledAgentLoopWorker)


class DecoupledAgentLoopManager(RewardAgentLoopManager):
    """Our agent-loop manager running :class:`DecoupledAgentLoopWorker` actors.

    Numbers every dispatch (:func:`number_dispatches`: the window's top-ups, refills and a resumed
    run's re-issued prompts alike, in the order they reach generation), and spreads dispatches over
    the workers: verl hands each batch out in ``len(workers)`` chunks starting from the first worker,
    so the mode's small top-ups (often one prompt) would all go to worker 0; here each dispatch
    starts where the last one ended.
    """

    def __init__(
        self,
        config: DictConfig,
        llm_client: Any,
        teacher_client: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        self.agent_loop_workers_class = DecoupledAgentLoopWorkerActor
        self._next_worker = 0
        self._next_dispatch = 0

    def generate_sequences(self, prompts: Any) -> None:
        self._next_dispatch = number_dispatches(prompts, self._next_dispatch)
        workers = list(self.agent_loop_workers)
        chunks = list(prompts.chunk(len(workers)))
        start = self._next_worker % len(workers)
        order = workers[start:] + workers[:start]
        self._next_worker = (start + len(chunks)) % len(workers)
        ray.get(
            [worker.generate_sequences.remote(chunk) for worker, chunk in zip(order, chunks, strict=False)]
        )

    def decoupled_stats(self) -> dict[str, Any]:
        """Every worker's :meth:`DecoupledAgentLoopWorker.decoupled_stats`, summed."""
        counts = ("produced", "consumed", "skipped", "abandoned")
        total: dict[str, Any] = {**dict.fromkeys(counts, 0), "score_seconds": []}
        for stats in ray.get([worker.decoupled_stats.remote() for worker in self.agent_loop_workers]):
            for key in counts:
                total[key] += int(stats[key])
            total["score_seconds"].extend(stats["score_seconds"])
        return total
