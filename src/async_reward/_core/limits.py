"""Admission for outbound calls: a concurrency slot, then a request budget, then a token budget.

The configured RPM / TPM are budgets of the whole job. verl starts ``reward.num_workers`` reward
processes and its own ``rate_limited`` manager gives each of them the full budget, so the job sends
up to ``num_workers`` times what was configured. Here each process takes ``budget / worker_count``.
The split is static on purpose: verl hands every worker an equal chunk of the batch, so equal shares
match the load, and a shared bucket in a Ray actor would add a round trip to every call.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from aiolimiter import AsyncLimiter

from async_reward._core.admission_queue import Budget, Slots, Turn
from async_reward._core.deadline import LeftRunningCalls

__all__ = [
    "Admission",
    "FifoSlots",
    "LimitSettings",
    "Priority",
    "TokenReservation",
    "strict_minute_limiter",
    "tokens_to_charge",
]


class LimitSettings(Protocol):
    """What admission reads of a ``limits`` section (:class:`async_reward.config.LimitSettings` is one).

    A protocol, not the config class: the primitives know nothing of configuration (they sit below it),
    so a test or another caller can hand them any object with these fields."""

    max_concurrency: int
    requests_per_minute: float | None
    tokens_per_minute: float | None
    estimated_tokens_per_request: int

    def validate(self, num_workers: int) -> None:
        """Refuse settings that cannot be split over ``num_workers`` processes (a ``ConfigError``)."""


#: An admission priority, lower first: a number, or a tuple compared element by element (a sample's
#: ``(generation step, dispatch order)``); a number ``p`` ranks as ``(p,)``, before ``(p, anything)``.
Priority = float | tuple[float, ...]


def _priority_key(priority: Priority) -> tuple[float, ...]:
    """One ordering for numbers and tuples, so both may wait in one heap."""
    return tuple(priority) if isinstance(priority, tuple) else (float(priority),)


_WINDOW_S = 60.0
_ROUNDING_MARGIN = 0.1
"""Part of one unit kept unused so float rounding in aiolimiter's leak can never admit an extra unit."""
_MAX_TOKEN_BURST_SHARE = 0.05
"""Largest token bucket as a share of the per-worker minute budget; sustained rate is the rest (>= 95 %)."""


class FifoSlots:
    """Concurrency slots handed out oldest batch first, then first come, first served, in O(log n).

    Written here instead of using ``asyncio.Semaphore``: CPython 3.11's ``Semaphore.acquire`` calls
    ``locked()``, which scans every waiter, so thousands of samples queued for a few dozen slots cost
    O(n) each (0.25 ms per acquire at 1000 waiters, more than the rest of a manager's overhead), and it
    has no notion of priority. A released slot goes straight to the live waiter with the lowest
    ``priority`` (the earliest training step its sample belongs to, then the earliest dispatched
    where the trainer numbers its dispatches), the longest-waiting among equals,
    so no late arrival of the same batch can overtake it and a later batch never delays an earlier
    one's last samples (what the trainer waits for).
    """

    __slots__ = ("_free", "_order", "_waiters")

    def __init__(self, count: int) -> None:
        self._free = count
        self._order = 0
        self._waiters: list[tuple[tuple[float, ...], int, asyncio.Future[None]]] = []

    async def acquire(self, priority: Priority = 0.0) -> None:
        """Take a slot; ``priority``: lower is served first (default 0: plain first come, first served)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._order += 1
        heapq.heappush(self._waiters, (_priority_key(priority), self._order, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as we were cancelled: pass it on
            raise  # a cancelled waiter stays in the heap and is skipped by release()

    def locked(self) -> bool:
        """No slot is free right now."""
        return self._free == 0

    def release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *_exc_info: object) -> None:
        self.release()


def strict_minute_limiter(budget: float, capacity: int) -> AsyncLimiter:
    """An ``AsyncLimiter`` that admits at most ``floor(budget)`` whole units in ANY 60-second window.

    ``capacity`` is the bucket size: the burst admitted at once, and the largest single ``acquire``.
    Raises ValueError if ``budget < 1`` or ``capacity`` is not in ``[1, floor(budget)]``.
    """
    whole = math.floor(budget)
    if whole < 1:
        raise ValueError(f"a budget of {budget} per minute is less than one unit")
    if not 1 <= capacity <= whole:
        raise ValueError(f"bucket capacity must be in [1, {whole}], got {capacity}")
    # A leaky bucket of capacity C leaking r units/s admits `amount` when level + amount <= C. Over any
    # window [t, t + 60] the units admitted are (level after the last admission) - (level before the
    # first) + (what leaked in between) <= C - 0 + 60 r. AsyncLimiter(budget, 60) has C = budget and
    # r = budget / 60, so a fresh bucket admits a full burst and keeps leaking: up to 2 x budget in the
    # first minute. We need C + 60 r <= budget instead. Amounts are whole numbers, so "at most budget"
    # means "at most B = floor(budget)", and C + 60 r < B + 1 already guarantees it; we take
    # C + 60 r = B + 1 - 0.1. So 60 r = B + 0.9 - C units a minute are sustained: >= 95 % of B when
    # C <= 0.05 B + 0.9. No strict limiter sustains more than B a minute (back-to-back windows each
    # hold at most B). aiolimiter is parameterised as (max_rate=C, time_period=C / r).
    per_minute = whole + 1 - _ROUNDING_MARGIN - capacity
    return AsyncLimiter(capacity, time_period=_WINDOW_S * capacity / per_minute)


def tokens_to_charge(
    limits: LimitSettings, estimated_tokens: float | None, whole_budget: int | None, budget: str, fix: str
) -> int:
    """The whole tokens a call is charged before it runs (``estimated_tokens``, default
    ``limits.estimated_tokens_per_request``, rounded up: the window guarantee counts whole tokens).

    Raises ValueError at once, rather than letting the call wait for ever, if the estimate is
    negative or above ``whole_budget`` (None: no token limit), which ``budget`` names (``{whole}``
    is filled in) and ``fix`` says how to mend.
    """
    tokens = math.ceil(limits.estimated_tokens_per_request if estimated_tokens is None else estimated_tokens)
    if tokens < 0:
        raise ValueError(f"estimated_tokens must be >= 0, got {tokens}")
    if whole_budget is not None and tokens > whole_budget:
        raise ValueError(
            f"a request estimated at {tokens} tokens exceeds {budget.format(whole=whole_budget)}: no "
            f"minute could hold it. {fix}"
        )
    return tokens


class TokenReservation:
    """Tokens charged for one admitted call; ``settle`` corrects the charge once usage is known."""

    __slots__ = ("_admission", "charged", "estimated")

    def __init__(self, admission: Admission, estimated: int) -> None:
        self._admission = admission
        self.estimated = estimated
        """Tokens charged before the call."""
        self.charged = estimated
        """Tokens charged so far, the estimate plus any correction."""

    def settle(self, actual_tokens: int | None) -> None:
        """Record the usage the response reported (None: unknown, keep the estimate).

        Usage above the charge becomes debt that the next admission pays before its own tokens, so
        the caller that learnt it is not blocked, and the budget still sees every token. Usage below
        the charge is not refunded: aiolimiter has no way to put capacity back, and erring towards
        fewer calls is the safe side of a paid API's limit. Settling twice charges only the increase.
        """
        if actual_tokens is None or actual_tokens <= self.charged:
            return
        self._admission._add_token_debt(actual_tokens - self.charged)
        self.charged = actual_tokens


class Admission:
    """Admission for outbound calls: concurrency slot, then request budget, then token budget.

    One instance per reward worker process and event loop (aiolimiter binds to the loop it first
    runs on). ``worker_count`` is the number of processes sharing the job-wide RPM / TPM;
    ``request_budget`` and ``token_budget`` are this process's shares per minute (None: unlimited).

    Each admission goes to the best-placed call waiting, by ``priority`` (the oldest training step
    first) then arrival, for slots and budget alike (:mod:`async_reward._core.admission_queue`). The token
    guarantee is on tokens charged. A call up to the token bucket's size is charged when admitted, as
    the provider counts it; a larger one is charged piece by piece while it waits, so the provider may
    see a window exceed the share by the pre-charged part of such calls straddling its start. Usage
    above an estimate is charged after the call (see ``TokenReservation.settle``).
    """

    __slots__ = (
        "_arrivals",
        "_held_back",
        "_in_flight",
        "_limits",
        "_max_in_flight",
        "_requests",
        "_slots",
        "_token_whole",
        "_tokens",
        "_turn",
        "_waiting",
        "left_running",
        "request_budget",
        "token_budget",
    )

    def __init__(self, limits: LimitSettings, worker_count: int = 1) -> None:
        if worker_count < 1:
            raise ValueError(f"worker_count must be >= 1, got {worker_count}")
        limits.validate(worker_count)
        self._limits = limits
        self._slots = Slots(limits.max_concurrency)
        self._turn = Turn()
        self._arrivals = itertools.count()
        self._in_flight = self._max_in_flight = self._waiting = 0
        self._held_back = False
        self.left_running = LeftRunningCalls(limits.max_concurrency, "this worker's")

        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        self.request_budget = None if rpm is None else rpm / worker_count
        self.token_budget = None if tpm is None else tpm / worker_count
        # Capacity 1 paces requests evenly (one every 60 / (B - 0.1) s) instead of in bursts: several
        # providers enforce a per-minute limit over shorter sub-windows, and steady pacing meets both.
        self._requests = (
            None if self.request_budget is None else Budget(strict_minute_limiter(self.request_budget, 1), 1)
        )
        self._tokens: Budget | None = None
        self._token_whole = 0
        if self.token_budget is not None:
            # limits.validate refused a share below one token or below one estimated request.
            self._token_whole = math.floor(self.token_budget)
            # A typical request is charged in one piece, as the provider counts it; the bucket stays
            # under 5 % of the share so >= 95 % of it is sustained. Larger charges go in pieces.
            burst_cap = max(1, math.floor(_MAX_TOKEN_BURST_SHARE * self._token_whole))
            chunk = max(1, min(limits.estimated_tokens_per_request, burst_cap))
            self._tokens = Budget(strict_minute_limiter(self.token_budget, chunk), chunk)

    @property
    def in_flight(self) -> int:
        """Calls admitted and not yet finished."""
        return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most calls ever in flight at once (a check that max_concurrency holds)."""
        return self._max_in_flight

    @property
    def waiting(self) -> int:
        """Calls queued for a slot or for budget (queue depth)."""
        return self._waiting

    @property
    def held_back(self) -> bool:
        """Slots are held back (:meth:`hold_back`): no call starts now."""
        return self._held_back

    @property
    def _token_debt(self) -> int:
        """Tokens used beyond what was charged, that the next admission pays before its own."""
        return max(self._tokens.owed, 0) if self._tokens is not None else 0

    @asynccontextmanager
    async def admit(
        self, estimated_tokens: int | None = None, priority: Priority = 0.0
    ) -> AsyncIterator[TokenReservation]:
        """Wait for a slot, one request and ``estimated_tokens`` tokens, then run the body.

        ``priority`` orders the wait: lower first (a sample's training step, so an older batch's
        samples go before a newer one's, then its dispatch order; see ``Priority``), first come first
        served among equals. Only the best-placed call waits for a slot and then for the budgets; a
        better-placed call that arrives meanwhile overtakes it. The slot is taken before the budgets,
        so what is charged is sent at once and no call holds budget while it waits for a socket. The
        per-call timeout should start inside the body, so it measures the service and not this queue.
        ``estimated_tokens`` defaults to ``limits.estimated_tokens_per_request``. Raises ValueError at
        once, rather than waiting, if it exceeds this worker's whole minute token budget.
        The slot is released on exit, exception and cancellation; a task cancelled while waiting
        releases nothing. Budget already charged is not refunded (it is used by the next call).
        """
        tokens = tokens_to_charge(
            self._limits,
            estimated_tokens,
            self._token_whole if self._tokens is not None else None,
            "this worker's whole budget of {whole} tokens per minute (tokens_per_minute / worker_count)",
            "Raise tokens_per_minute, lower reward.num_workers, or shorten the request.",
        )
        self._waiting += 1
        try:
            await self._enter(tokens, priority, next(self._arrivals))
        finally:
            self._waiting -= 1
        self._started()
        try:
            yield TokenReservation(self, tokens)
        finally:
            self._in_flight -= 1
            self._slots.release()

    @asynccontextmanager
    async def adopt(self, estimated_tokens: int) -> AsyncIterator[TokenReservation]:
        """Count a call admitted elsewhere (by a job queue that has since died) as in flight here.

        It takes a slot at once, even when none is free: the slot is then owed, and the next release
        pays it back instead of serving a waiter, so no new call starts until the calls in flight are
        back under ``max_concurrency``. Its budget was charged where it was admitted: none here.
        """
        self._slots.take(1)
        self._started()
        try:
            yield TokenReservation(self, estimated_tokens)
        finally:
            self._in_flight -= 1
            self._slots.release()

    def hold_back(self, seconds: float) -> None:
        """Start no call for ``seconds``: every slot is taken now and given back then, one by one, to
        the calls waiting, in their order (a job queue replacing a dead one, while the calls the dead
        one admitted report: see :meth:`adopt`)."""
        count = self._limits.max_concurrency
        self._slots.take(count)
        self._held_back = True
        asyncio.get_running_loop().call_later(seconds, self._give_back, count)

    def _give_back(self, count: int) -> None:
        self._held_back = False
        for _ in range(count):
            self._slots.release()

    def _started(self) -> None:
        """One more call in flight (the body's ``finally`` counts it out)."""
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)

    async def _enter(self, tokens: int, priority: Priority, order: int) -> None:
        """In this call's turn, take a slot, then one request and ``tokens`` tokens (after any token
        debt); returns holding the slot. Overtaken meanwhile: gives the slot back and queues again."""
        claims = [
            (budget, amount) for budget, amount in ((self._requests, 1), (self._tokens, tokens)) if budget
        ]
        if not claims and self._turn.idle() and not self._slots.locked():
            self._slots.take()  # nothing to wait for: the common case without budgets
            return
        while True:
            overtaken = await self._turn.take(_priority_key(priority), order)
            try:
                if not await self._slots.acquire(overtaken):
                    continue
                admitted = False
                try:
                    admitted = await self._pay(claims, overtaken)
                finally:
                    if not admitted:
                        self._slots.release()
                if admitted:
                    return
            finally:
                self._turn.give_back()

    @staticmethod
    async def _pay(claims: list[tuple[Budget, int]], overtaken: asyncio.Future[None]) -> bool:
        """Claim the amounts and pay each budget; False if overtaken first. A call that does not
        finish paying withdraws its claims: what it had paid stays as the budgets' credit."""
        if not claims:
            return True
        for budget, amount in claims:
            budget.owed += amount
        paid = False
        try:
            for budget, _ in claims:
                if not await budget.pay(overtaken):
                    return False
            paid = True
            return True
        finally:
            if not paid:
                for budget, amount in claims:
                    budget.owed -= amount

    def _add_token_debt(self, tokens: int) -> None:
        if self._tokens is not None:
            self._tokens.owed += math.ceil(tokens)
