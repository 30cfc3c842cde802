"""``Dispatcher``: moves samples between the driver and the worker actors, on the background loop.

It assigns each new ticket to the live workers (whole groups, balanced), long-polls every worker
for results and records them in the ticket states, re-sends a dead worker's samples to the living,
and rebalances at the tails: a worker about to run out of the oldest ticket's samples takes half of
the longest queue of that ticket elsewhere, so no slot idles (or serves a newer ticket) while the
oldest ticket still waits in another worker's queue.

Shared state (the ticket states, each worker's view) is guarded by the manager's condition; every
method noted "lock held" expects the caller to hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from async_reward.legacy.chunks import split_groups
from async_reward.legacy.pool import BackgroundLoop, WorkerRef, enqueue_rows, kill_workers
from async_reward.legacy.state import TicketState

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)

Assignment = list[tuple[WorkerRef, np.ndarray]]


class Dispatcher:
    """Driver-side traffic with the workers of one ``PipelinedRewardLoopManager``."""

    def __init__(
        self,
        workers: list[WorkerRef],
        cond: threading.Condition,
        tickets: dict[int, TicketState],
        collect_wait_s: float,
    ) -> None:
        self.workers = workers
        self._cond = cond
        self._tickets = tickets
        self._collect_wait_s = collect_wait_s
        self.closed = False
        self._background = BackgroundLoop("async-reward-pipeline")
        for worker in workers:
            self._background.spawn(self._collect_loop(worker))

    # ------------------------------------------------------------------ called by the manager
    def live(self) -> list[WorkerRef]:
        return [w for w in self.workers if w.alive]

    def assign(self, state: TicketState) -> None:
        """Deal a new ticket's groups to the live workers and start shipping (lock held)."""
        live = self.live()
        if not live:
            raise RuntimeError("all reward workers of this PipelinedRewardLoopManager are dead")
        split = split_groups(state.layout, len(live))
        parts = [(w, part) for w, part in zip(live, split, strict=True) if len(part)]
        for worker, part in parts:
            worker.outstanding[state.ticket.seq] = set(part.tolist())
        self._background.spawn(self._ship(state, parts))

    def cancel(self, seq: int) -> None:
        """Forget a ticket's samples on every worker and drop its queued work there (lock held)."""
        for worker in self.live():
            worker.outstanding.pop(seq, None)
            self._background.spawn(_quietly(worker.handle.cancel.remote(seq)))

    def in_flight(self, seq: int) -> int:
        """Samples of a ticket running in workers, as of their last reports (lock held)."""
        return sum(w.in_flight.get(seq, 0) for w in self.live())

    def close(self) -> None:
        """Kill the workers and stop the background loop (lock not held)."""
        with self._cond:
            self.closed = True
            for worker in self.workers:
                worker.alive = False
        kill_workers(self.workers)
        self._background.stop()

    # ------------------------------------------------------------------ background loop
    async def _ship(self, state: TicketState, parts: Assignment) -> None:
        """Send each worker its rows of a ticket. Serialisation runs in a thread (big batches)."""
        loop = asyncio.get_running_loop()
        for worker, part in parts:
            data = state.data
            if data is None or not worker.alive:
                continue  # ticket retired, or the worker died and its share was re-sent
            try:
                ref = await loop.run_in_executor(
                    None, enqueue_rows, worker, state.ticket.seq, data, part, state.ranks
                )
                await asyncio.wrap_future(ref.future())
            except RayActorError as exc:
                self._on_worker_death(worker, exc)
            except Exception as exc:  # e.g. an unpicklable non-tensor value: fail loudly, don't hang
                with self._cond:
                    state.error = state.error or f"could not send samples to a worker: {exc!r}"
                    self._cond.notify_all()

    async def _collect_loop(self, worker: WorkerRef) -> None:
        while not self.closed and worker.alive:
            try:
                ref = worker.handle.collect.remote(self._collect_wait_s)
                report = await asyncio.wrap_future(ref.future())
            except RayActorError as exc:
                self._on_worker_death(worker, exc)
                return
            except Exception as exc:  # a broken worker is treated like a dead one
                logger.exception("collect failed on %s", worker.label)
                self._on_worker_death(worker, exc)
                return
            self._record(worker, report)

    def _record(self, worker: WorkerRef, report: dict[str, Any]) -> None:
        with self._cond:
            worker.in_flight = report.get("in_flight", {})
            results = report.get("results", [])
            for seq, index, payload in results:
                sent = worker.outstanding.get(seq)
                if sent is not None:
                    sent.discard(index)
                    if not sent:
                        del worker.outstanding[seq]
                state = self._tickets.get(seq)
                if state is not None:
                    state.record(index, payload)
            if results:
                self._cond.notify_all()
            move = self._plan_rebalance(worker)
        if move is not None:
            self._background.spawn(self._rebalance(worker, *move))

    def _plan_rebalance(self, thief: WorkerRef) -> tuple[WorkerRef, int, int] | None:
        """(victim, ticket seq, samples) to move to ``thief``, or None (lock held).

        Only the oldest ticket with samples waiting in another worker is considered. ``thief``
        qualifies when fewer samples of that ticket (or older) wait in it than it runs at once, and
        it either has a free slot or would otherwise start a newer ticket's sample next; it then takes
        half the difference to the longest queue of that ticket. Waiting samples are estimated as
        sent and not reported back minus running, which (unlike a worker's own count) includes
        samples still on their way to it.
        """
        if thief.stealing or not thief.alive or self.closed:
            return None
        others = [w for w in self.live() if w is not thief]
        seqs = [s for w in others for s in w.outstanding if s in self._tickets and _waiting(w, s) > 0]
        if not seqs:
            return None
        seq = min(seqs)
        mine = sum(_waiting(thief, s) for s in thief.outstanding if s <= seq)
        newer = sum(_waiting(thief, s) for s in thief.outstanding if s > seq)
        free_slot = sum(thief.in_flight.values()) < thief.capacity
        if mine >= thief.capacity or not (free_slot or newer):
            return None
        victim = max(others, key=lambda w: _waiting(w, seq))
        count = (_waiting(victim, seq) - mine + 1) // 2
        if count < 1:
            return None
        thief.stealing = True
        return victim, seq, count

    async def _rebalance(self, thief: WorkerRef, victim: WorkerRef, seq: int, count: int) -> None:
        try:
            try:
                taken = await asyncio.wrap_future(victim.handle.steal.remote(seq, count).future())
            except RayActorError as exc:
                # The steal may have run and its reply been lost: only a death re-sends the samples.
                self._on_worker_death(victim, exc)
                return
            if not taken:
                return
            part = np.array(sorted(taken), dtype=np.int64)
            with self._cond:
                state = self._tickets.get(seq)
                if state is None:
                    return  # cancelled meanwhile; the samples were dropped with it
                held = victim.outstanding.get(seq, set())
                held.difference_update(part.tolist())
                if not held:
                    victim.outstanding.pop(seq, None)
                target = thief if thief.alive else next(iter(self.live()), None)
                if target is None:
                    self._fail(state, part, "all reward workers died")
                    return
                target.outstanding.setdefault(seq, set()).update(part.tolist())
            await self._ship(state, [(target, part)])
        finally:
            thief.stealing = False

    def _on_worker_death(self, worker: WorkerRef, exc: BaseException) -> None:
        """Re-send a dead worker's unfinished samples to live workers; with none left, fail them."""
        resend: list[tuple[TicketState, Assignment]] = []
        with self._cond:
            if not worker.alive or self.closed:
                worker.alive = False
                return
            worker.alive = False
            # RayActorError also means "unavailable for the moment" (ActorUnavailableError): kill the
            # actor so a worker we re-send from can never keep scoring the same samples.
            with contextlib.suppress(Exception):
                ray.kill(worker.handle, no_restart=True)
            orphans, worker.outstanding, worker.in_flight = worker.outstanding, {}, {}
            live = self.live()
            logger.warning(
                "reward worker %s died (%s); re-sending %d samples to %d live workers",
                worker.label,
                type(exc).__name__,
                sum(map(len, orphans.values())),
                len(live),
            )
            for seq, indices in orphans.items():
                state = self._tickets.get(seq)
                if state is None:
                    continue
                todo = np.array(sorted(i for i in indices if not state.book.scored[i]), dtype=np.int64)
                if not len(todo):
                    continue
                if not live:
                    self._fail(
                        state, todo, f"all reward workers died (last: {worker.label}: {type(exc).__name__})"
                    )
                    continue
                # Whole groups, as assign() deals them: a group judged in one call (judge.mode:
                # group) must meet in one worker, and a split would gain nothing otherwise.
                groups = np.unique(state.layout.group_of[todo]).tolist()
                split = [np.intersect1d(p, todo) for p in split_groups(state.layout, len(live), groups)]
                parts = [(w, p) for w, p in zip(live, split, strict=True) if len(p)]
                for target, part in parts:
                    target.outstanding.setdefault(seq, set()).update(part.tolist())
                resend.append((state, parts))
            self._cond.notify_all()
        for state, parts in resend:
            self._background.spawn(self._ship(state, parts))

    def _fail(self, state: TicketState, indices: np.ndarray, reason: str) -> None:
        """Record samples no worker can score as failures (lock held)."""
        for index in indices.tolist():
            state.record(index, state.failure_payload(reason))
        self._cond.notify_all()


def _waiting(worker: WorkerRef, seq: int) -> int:
    """Samples of ticket ``seq`` waiting for a slot in ``worker`` (estimate; lock held)."""
    return max(0, len(worker.outstanding.get(seq, ())) - worker.in_flight.get(seq, 0))


async def _quietly(ref: Any) -> None:
    """Await a fire-and-forget call, so a dead worker's error is not reported as unhandled."""
    with contextlib.suppress(Exception):
        await asyncio.wrap_future(ref.future())
