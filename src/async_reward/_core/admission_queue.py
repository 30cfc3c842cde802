"""The order of admission: each call admitted goes to the best-placed call waiting.

:class:`~async_reward._core.limits.Admission` admits a call when it holds a concurrency slot, one request
of the RPM budget and its tokens of the TPM budget. The calls waiting are ordered by priority (a
sample's training step, then its dispatch order) and arrival, for the slot and the budgets alike:
only the call whose turn it is (:class:`Turn`) waits for a slot (:class:`Slots`) and then inside
the rate limiters (:class:`Budget`), and a better-placed call that arrives meanwhile overtakes it.

Why not the limiters' own queue: aiolimiter serves its waiters smallest amount first, then in arrival
order, with no notion of priority, so calls holding slots would wait for budget in that order (issue
42: four step-5 calls queued before two step-1 calls were all admitted first). Writing the leaky
bucket's timing again would duplicate what :func:`~async_reward._core.limits.strict_minute_limiter` already
gets right; instead one call at a time waits inside it, and is interrupted (aiolimiter charges only on
success) when it is overtaken. Every wait runs on the event loop's clock, so tests drive it with a
virtual one.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from functools import partial

from aiolimiter import AsyncLimiter

__all__ = ["Budget", "Slots", "Turn"]

_Place = tuple[tuple[float, ...], int]
"""A call's place in the queue: its priority, then its arrival."""


async def _unless_overtaken(wait: Callable[[], Awaitable[None]], overtaken: asyncio.Future[None]) -> bool:
    """Await ``wait()`` unless ``overtaken`` completes first: True once it has ended, False if
    overtaken (it is then cancelled, having taken nothing: aiolimiter charges only on success)."""
    if overtaken.done():
        return False
    waiting = asyncio.ensure_future(wait())
    try:
        await asyncio.wait((waiting, overtaken), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiting.done():
            waiting.cancel()  # overtaken, or we were cancelled
    await asyncio.wait((waiting,))  # the cancel has taken effect, or the wait ended first
    if waiting.cancelled():
        return False
    waiting.result()
    return True


class Budget:
    """One strict minute limiter and what calls owe it, in whole units.

    ``owed`` > 0: spent or claimed and not yet charged (usage above an estimate, the claim of the call
    paying now); < 0: charged and not yet spent, left by a call that was overtaken or gave up while
    paying, and used by the next one, so no budget is charged twice or held unsent behind another call.
    """

    __slots__ = ("chunk", "limiter", "owed")

    def __init__(self, limiter: AsyncLimiter, chunk: int) -> None:
        self.limiter = limiter
        self.chunk = chunk
        self.owed = 0

    async def pay(self, overtaken: asyncio.Future[None]) -> bool:
        """Charge the limiter, ``chunk`` units at a time, until nothing is owed; False if overtaken
        first (what is still owed stays owed). A charge larger than the bucket waits piece by piece;
        the window bound holds for every piece, so it holds for the total."""
        while self.owed > 0:
            chunk = min(self.owed, self.chunk)
            if overtaken.done():
                return False
            if self.limiter.has_capacity(chunk):
                await self.limiter.acquire(chunk)  # returns at once
            elif not await _unless_overtaken(partial(self.limiter.acquire, chunk), overtaken):
                return False
            self.owed -= chunk
        return True


class Slots:
    """Admission's concurrency slots: a count, and a wake-up for the one call that may wait.

    Only the call whose turn it is waits for a slot (see :class:`Turn`), so no queue is needed here.
    The count may go below zero: slots taken without waiting (``Admission.adopt``, ``hold_back``) are
    owed, and releases pay them back before a call gets one.
    """

    __slots__ = ("_free", "_wake")

    def __init__(self, count: int) -> None:
        self._free = count
        self._wake: asyncio.Future[None] | None = None

    def locked(self) -> bool:
        """No slot is free right now."""
        return self._free <= 0

    def take(self, count: int = 1) -> None:
        """Take ``count`` slots now, free or not (those not free are owed)."""
        self._free -= count

    def release(self) -> None:
        self._free += 1
        if self._free > 0 and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def acquire(self, overtaken: asyncio.Future[None]) -> bool:
        """Take a slot, waiting for one unless ``overtaken`` completes first: True once taken, False
        if overtaken (nothing taken)."""
        while not overtaken.done():
            if self._free > 0:
                self._free -= 1
                return True
            wake = self._wake = asyncio.get_running_loop().create_future()

            def wake_up(_: object, wake: asyncio.Future[None] = wake) -> None:
                if not wake.done():
                    wake.set_result(None)

            overtaken.add_done_callback(wake_up)
            try:
                await wake
            finally:
                overtaken.remove_done_callback(wake_up)
                self._wake = None
        return False


class Turn:
    """Whose turn it is to wait for a slot and the budgets: one call at a time, the lowest
    (priority, arrival) first. A better-placed call that arrives meanwhile overtakes the holder: the
    holder's ``overtaken`` future completes, it stops waiting (nothing taken; what it had paid stays
    as credit, see :class:`Budget`), gives back its slot and queues again at its old place.
    """

    __slots__ = ("_holder", "_overtaken", "_waiters")

    def __init__(self) -> None:
        self._waiters: list[tuple[_Place, asyncio.Future[asyncio.Future[None]]]] = []
        self._holder: _Place | None = None
        """The place of the call whose turn it is (None: nobody's)."""
        self._overtaken: asyncio.Future[None] | None = None

    def idle(self) -> bool:
        """Nobody's turn, nobody waiting for one."""
        return self._holder is None

    async def take(self, key: tuple[float, ...], order: int) -> asyncio.Future[None]:
        """Wait for the turn; returns the future that completes when a better-placed call arrives."""
        place = (key, order)
        holder, overtaken = self._holder, self._overtaken
        if holder is None or overtaken is None:
            self._holder, self._overtaken = place, asyncio.get_running_loop().create_future()
            return self._overtaken
        if place < holder and not overtaken.done():
            overtaken.set_result(None)
        waiter: asyncio.Future[asyncio.Future[None]] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (place, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # the turn reached us as we were cancelled: pass it on
            raise

    def give_back(self) -> None:
        """End the holder's turn: the best-placed live waiter's starts now, so a call that arrives
        before it runs can already overtake it."""
        while self._waiters:
            place, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                self._holder, self._overtaken = place, asyncio.get_running_loop().create_future()
                waiter.set_result(self._overtaken)
                return
        self._holder = self._overtaken = None
