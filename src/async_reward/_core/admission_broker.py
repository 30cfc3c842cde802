"""The job's admission queue as a Ray actor (``limits.admission: job``): see
:mod:`async_reward._core.job_admission` for the whole design, what can go wrong and what happens.

:class:`AdmissionBroker` runs an ordinary :class:`~async_reward._core.limits.Admission` over the whole
limits and hands out leases (one per admitted attempt); it learns from heartbeats which callers are
alive and which leases they hold, so it can take back a dead caller's calls and, when it replaces a
dead broker, count the calls that one admitted before it grants any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from typing import Any

from async_reward._core.limits import Admission, LimitSettings, Priority, TokenReservation

__all__ = ["GRACE_HEARTBEATS", "HEARTBEAT_S", "SILENT_HEARTBEATS", "AdmissionBroker", "caller_of"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
"""Seconds between two heartbeats of a caller with calls waiting or admitted."""
SILENT_HEARTBEATS = 6
"""Heartbeats a caller may miss before the broker takes it for dead (30 s by default); a broker that
answers no heartbeat for twice as long (60 s) is taken for stalled by its callers, and killed."""
GRACE_HEARTBEATS = 3
"""Heartbeats a broker that replaces a dead one waits before its first grant (15 s by default): the
live callers' heartbeats report the leases the dead one granted, so they are counted first."""
_ENDED_KEPT = 100_000
"""Lease ids remembered as ended (released, or cancelled before their ``acquire`` arrived), so a late
``acquire`` or a heartbeat sent before the release never brings one back (oldest forgotten first)."""


_Admitted = contextlib.AbstractAsyncContextManager[TokenReservation]
"""An ``Admission.admit`` context entered and not yet exited: a held lease."""


def caller_of(lease: str) -> str:
    """The caller that chose a lease id (``<caller>-<number>``)."""
    return lease.rsplit("-", 1)[0]


class AdmissionBroker:
    """The job's admission queue (a Ray actor, started by
    :meth:`~async_reward._core.job_admission.JobAdmission.broker`).

    A lease is one admitted attempt. Its id, ``<caller>-<number>``, is chosen by the caller, so a
    ``cancel`` can name a lease whose ``acquire`` has not started yet (Ray may run an async actor's
    calls out of order), and the broker knows whose calls to drop when a caller falls silent.
    ``replacing``: started because the job's broker died; it then grants nothing for
    :data:`GRACE_HEARTBEATS` heartbeats from its first call, while callers report their leases.
    """

    def __init__(
        self, limits: LimitSettings, heartbeat_s: float = HEARTBEAT_S, replacing: bool = False
    ) -> None:
        self._admission = Admission(limits, worker_count=1)
        self._max_concurrency = limits.max_concurrency
        self._silent_s = heartbeat_s * SILENT_HEARTBEATS
        self._sweep_every_s = heartbeat_s
        self._grace_s = heartbeat_s * GRACE_HEARTBEATS if replacing else 0.0
        self._started = False
        self._held: dict[str, tuple[_Admitted, TokenReservation]] = {}
        self._waiting: dict[str, asyncio.Task[Any]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._seen: dict[str, float] = {}
        self._stuck: dict[str, int] = {}
        self._reclaimed = self._granted = self._adopted = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def acquire(self, lease: str, estimated_tokens: int, priority: Priority) -> bool:
        """Wait for a slot and the budgets. True once granted; False if the lease was cancelled, or
        its caller was taken for dead (the caller then queues again under a new id)."""
        self._start()
        if lease in self._ended:
            return False
        if lease in self._waiting or lease in self._held:
            raise ValueError(f"lease {lease} is already waiting or held: a caller's ids are never reused")
        self._seen[caller_of(lease)] = time.monotonic()
        self._start_sweeper()
        context = self._admission.admit(estimated_tokens, priority)
        task = asyncio.current_task()
        assert task is not None
        self._waiting[lease] = task
        try:
            reservation = await context.__aenter__()
        except asyncio.CancelledError:
            return False  # cancel() or the sweep stopped the wait; Admission released what it took
        finally:
            self._waiting.pop(lease, None)
        self._held[lease] = (context, reservation)
        self._granted += 1
        return True

    async def release(self, lease: str, charged_tokens: int | None = None) -> None:
        """Give a lease back; ``charged_tokens``: the usage the response reported, when above the estimate."""
        self._end(lease)
        await self._take_back(lease, charged_tokens)

    async def cancel(self, lease: str) -> None:
        """The caller stopped waiting: drop its waiter, or give back what was granted meanwhile."""
        task = self._waiting.get(lease)
        if task is not None:
            task.cancel()
        else:  # granted meanwhile, or its acquire has not arrived yet (it will return False at once)
            await self.release(lease)

    async def heartbeat(self, caller: str, held: dict[str, int] | None = None, stuck: int = 0) -> int:
        """``caller`` is alive (sent every ``heartbeat_s`` while it has calls waiting or admitted) and
        holds the leases ``held`` (id: estimated tokens), ``stuck`` of them by calls that ignored
        their cancellation and still run. A lease this broker does not hold (granted by a broker that
        died, or taken back while its caller was silent) is counted from now on: it takes a slot even
        if none is free, and no new grant goes out until the job is back under ``max_concurrency``.

        Returns the job's count of leases held by such stuck calls (what each caller last reported,
        at most the leases it holds), so that every caller's waiting calls can see them."""
        self._start()
        self._seen[caller] = time.monotonic()
        self._stuck[caller] = stuck
        for lease, tokens in (held or {}).items():
            if (
                caller_of(lease) != caller
                or lease in self._held
                or lease in self._waiting
                or lease in self._ended
            ):
                continue
            context = self._admission.adopt(tokens)
            self._held[lease] = (context, await context.__aenter__())
            self._adopted += 1
        if self._held:
            self._start_sweeper()
        return self.stuck_leases()

    def stuck_leases(self) -> int:
        """Leases held by calls their callers reported as stuck (ignoring their cancellation)."""
        holding = Counter(map(caller_of, self._held))
        return sum(min(count, holding[caller]) for caller, count in self._stuck.items())

    def stats(self) -> dict[str, int]:
        """Counters: in flight now and at most, waiting, granted, leases learnt from heartbeats
        (``adopted``), leases or waiting calls taken back from callers taken for dead, and whether
        grants are held back (a replacing broker's first heartbeats), for tests and metrics."""
        return {
            "in_flight": len(self._held),
            "max_in_flight": self._admission.max_in_flight,
            "waiting": self._admission.waiting,
            "granted": self._granted,
            "adopted": self._adopted,
            "reclaimed": self._reclaimed,
            "held_back": int(self._admission.held_back),
            "stuck": self.stuck_leases(),
            "max_concurrency": self._max_concurrency,
        }

    def _start(self) -> None:
        """On the first call: a replacing broker holds its grants back for the grace."""
        if not self._started:
            self._started = True
            if self._grace_s > 0:
                self._admission.hold_back(self._grace_s)

    def _end(self, lease: str) -> None:
        self._ended[lease] = None
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    async def _take_back(self, lease: str, charged_tokens: int | None = None) -> None:
        held = self._held.pop(lease, None)
        if held is None:
            return  # taken back by the sweep, cancelled, or never held here
        context, reservation = held
        reservation.settle(charged_tokens)
        await context.__aexit__(None, None, None)

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """While anything waits or is held: drop the calls of callers silent for too long."""
        while self._held or self._waiting:
            await asyncio.sleep(self._sweep_every_s)
            now = time.monotonic()
            busy = set(map(caller_of, [*self._waiting, *self._held]))
            for caller in [
                c for c, seen in self._seen.items() if c not in busy and now - seen > self._silent_s
            ]:
                del self._seen[caller]  # finished callers (managers come and go): not kept for ever
                self._stuck.pop(caller, None)
            silent = {caller for caller in busy if now - self._seen.get(caller, now) > self._silent_s}
            for caller in silent:
                waiting = [lease for lease in self._waiting if caller_of(lease) == caller]
                held = [lease for lease in self._held if caller_of(lease) == caller]
                logger.warning(
                    "job-wide admission: no heartbeat from a reward worker for %.0f s (dead or stalled): "
                    "dropped its %d waiting call(s) and took back its %d lease(s)",
                    now - self._seen[caller],
                    len(waiting),
                    len(held),
                )
                self._reclaimed += len(waiting) + len(held)
                self._seen.pop(caller, None)
                for lease in waiting:
                    self._waiting[lease].cancel()
                for lease in held:  # not ended: a caller that was only stalled reports them again
                    await self._take_back(lease)
