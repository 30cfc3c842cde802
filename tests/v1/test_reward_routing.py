"""Least-loaded routing of sessions to reward workers (``RewardAgentLoopWorker._compute_score``).

verl's own ``_compute_score`` runs (it builds the one-session ``DataProto`` and calls
``compute_score.remote`` on ``random.choice(self.reward_loop_worker_handles)``); the reward workers
are small stand-ins for Ray actor handles whose ``compute_score.remote`` records each call, because
what is under test is only which worker verl's call reaches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from async_reward.v1.agent_loop import RewardAgentLoopWorker


class _ComputeScore:
    def __init__(self, owner: RecordingRewardWorker) -> None:
        self.owner = owner

    async def remote(self, data: Any) -> dict[str, Any]:
        self.owner.scored += 1
        self.owner.in_flight += 1
        try:
            await self.owner.release.wait()
        finally:
            self.owner.in_flight -= 1
        return {"reward_score": 1.0, "reward_extra_info": {"worker": self.owner.name}}


class RecordingRewardWorker:
    """A reward worker handle: answers once ``release`` is set (at once for a fast one)."""

    def __init__(self, name: str, fast: bool) -> None:
        self.name = name
        self.release = asyncio.Event()
        if fast:
            self.release.set()
        self.scored = self.in_flight = 0
        self.compute_score = _ComputeScore(self)


def agent_loop_worker(handles: list[Any]) -> RewardAgentLoopWorker:
    """Our worker with only what verl's ``_compute_score`` reads (no LLM server, no processor)."""
    worker = RewardAgentLoopWorker.__new__(RewardAgentLoopWorker)
    worker.processor = None
    worker.mm_processor_kwargs = None
    worker.reward_loop_worker_handles = handles
    return worker


def session() -> AgentLoopOutput:
    return AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3], response_mask=[1], metrics=AgentLoopMetrics())


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_busy_reward_worker_gets_no_session_while_another_is_free() -> None:
    """verl draws a worker at random, so about half of these sessions would queue behind the stuck
    one; least-loaded routing sends it one (the first, on a tie) and every later one to the free one."""

    async def run() -> tuple[RecordingRewardWorker, RecordingRewardWorker, list[AgentLoopOutput]]:
        stuck, free = RecordingRewardWorker("stuck", fast=False), RecordingRewardWorker("free", fast=True)
        worker = agent_loop_worker([stuck, free])
        outputs = [session() for _ in range(30)]
        tasks = []
        for output in outputs:  # sessions finish generating one after another
            tasks.append(asyncio.create_task(worker._compute_score([output], {"uid": "u"})))
            await _settle()
        assert worker.reward_loop_worker_handles == [stuck, free]  # outside a session: both, unchanged
        stuck.release.set()
        await asyncio.gather(*tasks)
        return stuck, free, outputs

    stuck, free, outputs = asyncio.run(run())
    assert (stuck.scored, free.scored) == (1, 29)
    workers = [o.extra_fields["reward_extra_info"]["worker"] for o in outputs]
    assert workers.count("stuck") == 1 and all(o.reward_score == 1.0 for o in outputs)


def test_sessions_arriving_together_are_spread_evenly_and_a_scored_one_is_not_sent_again() -> None:
    async def run() -> tuple[list[RecordingRewardWorker], AgentLoopOutput]:
        handles = [RecordingRewardWorker(f"w{i}", fast=False) for i in range(3)]
        worker = agent_loop_worker(handles)
        tasks = [asyncio.create_task(worker._compute_score([session()], {"uid": "u"})) for _ in range(12)]
        await _settle()
        assert [h.in_flight for h in handles] == [4, 4, 4]
        for handle in handles:
            handle.release.set()
        await asyncio.gather(*tasks)
        scored = session()
        scored.reward_score = 0.5  # verl's later _compute_score call of the same session is a no-op
        await worker._compute_score([scored], {"uid": "u"})
        return handles, scored

    handles, scored = asyncio.run(run())
    assert [h.scored for h in handles] == [4, 4, 4] and scored.reward_score == 0.5
