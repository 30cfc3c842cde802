"""Admission: concurrency slots, per-worker RPM / TPM shares that hold in every 60-second window, the
order calls are admitted in (oldest step first, for slots and budget), and the job queue's broker
driven in-process.

Budget tests run on a virtual-time event loop: ``loop.time()`` reads a fake clock, and whenever the
loop would block waiting for a timer, the clock jumps to that timer instead. aiolimiter schedules its
wake-ups with ``loop.call_at`` and reads ``loop.time()``, so minutes of limiter behaviour run in
milliseconds and nothing sleeps for real.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from aiolimiter import AsyncLimiter

from async_reward._core.limits import Admission, strict_minute_limiter
from async_reward.config import ConfigError, LimitsConfig

T = TypeVar("T")


class _Clock:
    now = 0.0
    """Seconds of virtual time."""


class _FastForwardSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls instead of blocking, and moves the clock forward by the time the loop would have waited."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if not events and timeout is None:
            raise RuntimeError("deadlock: the loop would wait forever with no timer scheduled")
        # Every pass of the loop takes a microsecond, as real time would: a timer due "now" whose
        # callback finds a float residue still to wait (aiolimiter reschedules itself then) must see
        # time move, or it would spin forever at one instant.
        self._clock.now += max(0.0 if events else timeout or 0.0, 1e-6)
        return events


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.clock = _Clock()
        super().__init__(_FastForwardSelector(self.clock))

    def time(self) -> float:
        return self.clock.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = _VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        leftover = asyncio.all_tasks(loop)  # background loops (a broker's sweep) end with the run
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.wait(leftover))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def max_window_sum(events: list[tuple[float, int]], window_s: float = 60.0) -> int:
    """Largest total amount in any closed window [t, t + window_s] (the worst one starts at an event)."""
    events = sorted(events)
    times = [t for t, _ in events]
    prefix = [0, *itertools.accumulate(amount for _, amount in events)]
    return max(
        (prefix[bisect.bisect_right(times, t + window_s)] - prefix[i] for i, t in enumerate(times)), default=0
    )


async def record_admissions(
    admit_once: Callable[[], Awaitable[None]], *, tasks: int, duration_s: float
) -> list[tuple[float, int]]:
    """Keep ``tasks`` callers admitting back to back for ``duration_s``; return (time, 1) per admission."""
    loop = asyncio.get_running_loop()
    events: list[tuple[float, int]] = []

    async def caller() -> None:
        while loop.time() < duration_s:
            await admit_once()
            events.append((loop.time(), 1))

    await asyncio.gather(*(caller() for _ in range(tasks)))
    return events


def test_virtual_clock_does_not_sleep_for_real() -> None:
    async def main() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(3600)


def test_plain_aiolimiter_admits_two_budgets_in_the_first_minute() -> None:
    """The flaw we fix, and proof that the window check can see it."""

    async def main() -> list[tuple[float, int]]:
        limiter = AsyncLimiter(100, time_period=60)
        return await record_admissions(limiter.acquire, tasks=4, duration_s=180)

    assert max_window_sum(run_virtual(main())) >= 195


@pytest.mark.parametrize(
    ("rpm", "worker_count", "share"),
    [(600, 4, 150), (10, 1, 10), (21, 2, 10), (1000, 3, 333), (2, 2, 1)],
)
def test_request_share_holds_in_every_window_and_is_used(rpm: float, worker_count: int, share: int) -> None:
    admission = Admission(LimitsConfig(max_concurrency=8, requests_per_minute=rpm), worker_count)
    assert admission.request_budget == pytest.approx(rpm / worker_count)
    minutes = 10

    async def admit_once() -> None:
        async with admission.admit():
            await asyncio.sleep(0.05)  # the call itself, in virtual time

    events = run_virtual(record_admissions(admit_once, tasks=8, duration_s=minutes * 60))
    assert max_window_sum(events) <= share
    # No strict limiter can sustain more than floor(share) a minute; we keep at least 95 % of it
    # (a share of one request a minute sustains 0.9 of it: the 0.1 rounding margin).
    admitted = sum(1 for t, _ in events if t < minutes * 60)
    assert admitted >= (0.95 if share > 1 else 0.9) * share * minutes


def record_limiter_charges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """Every amount any ``AsyncLimiter`` charges from now on, with the loop's time of the charge."""
    charges: list[tuple[float, int]] = []
    acquire = AsyncLimiter.acquire

    async def recording_acquire(self: AsyncLimiter, amount: float = 1) -> None:
        await acquire(self, amount)
        charges.append((asyncio.get_running_loop().time(), int(amount)))

    monkeypatch.setattr(AsyncLimiter, "acquire", recording_acquire)
    return charges


@pytest.mark.parametrize(("tpm", "worker_count"), [(100_000, 4), (30_000, 1), (9_000, 3)])
def test_token_share_holds_in_every_window_with_oversized_requests_and_debt(
    monkeypatch: pytest.MonkeyPatch, tpm: int, worker_count: int
) -> None:
    share = math.floor(tpm / worker_count)
    admission = Admission(
        LimitsConfig(max_concurrency=16, tokens_per_minute=tpm, estimated_tokens_per_request=512),
        worker_count,
    )
    charges = record_limiter_charges(monkeypatch)
    minutes = 10
    rng = random.Random(0)

    async def caller() -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < minutes * 60:
            estimate = rng.randint(50, 2_000)  # some larger than the bucket: charged in pieces
            async with admission.admit(estimate) as reservation:
                await asyncio.sleep(rng.uniform(0.1, 3.0))
                # Usage differs from the estimate both ways; the excess is charged as debt.
                reservation.settle(int(estimate * rng.uniform(0.5, 1.5)))

    async def main() -> None:
        await asyncio.gather(*(caller() for _ in range(16)))

    run_virtual(main())
    assert max_window_sum(charges) <= share
    charged = sum(amount for t, amount in charges if t < minutes * 60)
    assert charged >= 0.95 * share * minutes


def test_settle_charges_only_usage_above_the_charge() -> None:
    async def main() -> None:
        admission = Admission(LimitsConfig(tokens_per_minute=10_000), 1)
        async with admission.admit(100) as reservation:
            reservation.settle(None)
            reservation.settle(40)  # less than charged: aiolimiter cannot refund, nothing happens
            assert (reservation.charged, admission._token_debt) == (100, 0)
            reservation.settle(130)
            reservation.settle(150)  # a second settle charges only the increase
            assert (reservation.charged, admission._token_debt) == (150, 50)
        async with admission.admit(0):
            assert admission._token_debt == 0  # the next admission paid it first

    run_virtual(main())


def test_request_larger_than_the_whole_token_share_fails_fast() -> None:
    admission = Admission(
        LimitsConfig(tokens_per_minute=1_000, estimated_tokens_per_request=100), worker_count=2
    )

    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(ValueError, match="exceeds this worker's whole budget of 500 tokens"):
            async with admission.admit(501):
                pass
        assert (admission.waiting, admission.in_flight) == (0, 0) and loop.time() < 1e-3  # no waiting
        async with admission.admit(500):  # the whole share fits, in pieces of the 25-token bucket
            pass
        return loop.time()

    assert run_virtual(main()) < 61  # about a minute: a whole minute of budget


def test_budgets_too_small_to_split_are_rejected() -> None:
    with pytest.raises(ValueError, match="less than one token"):
        Admission(LimitsConfig(tokens_per_minute=1), worker_count=2)
    with pytest.raises(ValueError, match="estimated_tokens_per_request=512 exceeds"):
        Admission(LimitsConfig(tokens_per_minute=1_000), worker_count=4)
    with pytest.raises(ConfigError, match="less than one request"):
        Admission(LimitsConfig(requests_per_minute=3), worker_count=4)
    with pytest.raises(ValueError):
        strict_minute_limiter(10, capacity=11)


async def test_unlimited_budgets_admit_at_once() -> None:
    admission = Admission(LimitsConfig(max_concurrency=2))
    async with admission.admit(10**9) as reservation:
        reservation.settle(10**10)
        assert admission.in_flight == 1


async def _settle_tasks() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_concurrency_is_capped_exactly() -> None:
    admission = Admission(LimitsConfig(max_concurrency=3))
    gate = asyncio.Event()

    async def call() -> None:
        async with admission.admit():
            await gate.wait()

    tasks = [asyncio.create_task(call()) for _ in range(20)]
    await _settle_tasks()
    assert (admission.in_flight, admission.waiting) == (3, 17)
    gate.set()
    await asyncio.gather(*tasks)
    assert (admission.max_in_flight, admission.in_flight, admission.waiting) == (3, 0, 0)


async def test_cancelled_waiter_releases_nothing_it_did_not_hold() -> None:
    admission = Admission(LimitsConfig(max_concurrency=1))
    gate = asyncio.Event()

    async def call() -> None:
        async with admission.admit():
            await gate.wait()

    holder = asyncio.create_task(call())
    waiter = asyncio.create_task(call())
    await _settle_tasks()
    assert (admission.in_flight, admission.waiting) == (1, 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (admission.in_flight, admission.waiting) == (1, 0)
    gate.set()
    await holder

    # Still exactly one slot: had the cancelled waiter released a slot, two would now get in.
    gate.clear()
    tasks = [asyncio.create_task(call()) for _ in range(3)]
    await _settle_tasks()
    assert (admission.in_flight, admission.waiting) == (1, 2)
    gate.set()
    await asyncio.gather(*tasks)
    assert admission.max_in_flight == 1


async def test_cancel_while_waiting_for_budget_frees_the_slot() -> None:
    # One request a minute: the second caller holds the slot while it waits for the budget.
    admission = Admission(LimitsConfig(max_concurrency=1, requests_per_minute=1))
    async with admission.admit():
        pass
    blocked = asyncio.create_task(admission.admit().__aenter__())
    await _settle_tasks()
    assert (admission.in_flight, admission.waiting) == (0, 1)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert admission.waiting == 0
    # The slot came back: a new caller gets past the semaphore and waits on the budget in its turn.
    nxt = asyncio.create_task(admission.admit().__aenter__())
    await _settle_tasks()
    assert admission._slots.locked() and admission.waiting == 1
    nxt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await nxt
    assert not admission._slots.locked()


async def test_fifo_slots_serve_in_arrival_order_and_survive_cancellation() -> None:
    from async_reward._core.limits import FifoSlots

    slots = FifoSlots(1)
    order: list[int] = []
    await slots.acquire()  # held by us

    async def worker(n: int) -> None:
        async with slots:
            order.append(n)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(worker(n)) for n in range(5)]
    await asyncio.sleep(0)
    tasks[2].cancel()  # a cancelled waiter must neither take nor leak a slot
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 3, 4]
    await asyncio.wait_for(slots.acquire(), timeout=1)  # the slot came back


async def test_slots_go_to_the_oldest_batch_first_then_in_arrival_order() -> None:
    """Waiters of a later training step (priority 3) queued before those of an earlier one (priority
    2): every freed slot goes to the earlier step's waiters first, each step's in arrival order."""
    admission = Admission(LimitsConfig(max_concurrency=1))
    order: list[tuple[int, int]] = []
    hold = asyncio.Event()

    async def first() -> None:
        async with admission.admit(priority=1):
            await hold.wait()

    async def call(step: int, n: int) -> None:
        async with admission.admit(priority=step):
            order.append((step, n))
            await asyncio.sleep(0)

    holder = asyncio.create_task(first())
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(call(3, n)) for n in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(call(2, n)) for n in range(3)]
    await asyncio.sleep(0)
    assert admission.waiting == 6 and admission.in_flight == 1
    hold.set()
    await asyncio.gather(holder, *tasks)
    assert order == [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    assert admission.max_in_flight == 1


# ------------------------------------------------------------------ budget order (issue 42, item 10)


async def _call_in_order(
    admission: Admission, order: list[Any], label: Any, priority: Any, tokens: int = 0
) -> None:
    async with admission.admit(tokens, priority):
        order.append(label)


@pytest.mark.parametrize("slots", [16, 2, 1])
def test_request_budget_goes_to_the_oldest_step_first_not_in_the_limiters_order(slots: int) -> None:
    """The request budget is the wait (120 a minute: one every 0.5 s). Four step-5 calls wait, then
    two step-1 calls arrive: the step-1 calls are admitted first, and the step-5 calls keep their
    arrival order, the one already waiting for the next request included (it is overtaken, not sent
    to the back). With plentiful slots (16) the step-5 calls hold slots while they wait; with fewer
    (2, 1) a step-5 call waiting for budget does not keep a step-1 call from a slot either."""
    admission = Admission(LimitsConfig(max_concurrency=slots, requests_per_minute=120))
    order: list[Any] = []
    times: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await _call_in_order(admission, order, "first", 0)  # takes the bucket: the rest wait for budget
        late = [asyncio.create_task(_call_in_order(admission, order, (5, n), 5)) for n in range(4)]
        await _settle_tasks()
        assert admission.waiting == 4
        early = [asyncio.create_task(_call_in_order(admission, order, (1, n), 1)) for n in range(2)]
        for task in asyncio.as_completed([*late, *early]):
            await task
            times.append(loop.time())

    run_virtual(main())
    assert order == ["first", (1, 0), (1, 1), (5, 0), (5, 1), (5, 2), (5, 3)]
    assert max_window_sum([(t, 1) for t in [0.0, *times]], window_s=60.0) <= 120
    assert times[-1] == pytest.approx(6 * 60 / 119.9, abs=0.01)  # paced as before: no unit lost


def test_token_budget_goes_to_the_oldest_step_first_and_an_overtaken_calls_tokens_are_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tokens are the wait (12 000 a minute, charged 500 at a time). A step-5 call has paid part of
    its 1 500 tokens when two step-1 calls arrive: they go first, and what the step-5 call had paid
    is used by the next call rather than charged twice (every token charged exactly once, in order)."""
    admission = Admission(
        LimitsConfig(max_concurrency=16, tokens_per_minute=12_000, estimated_tokens_per_request=500)
    )
    charges = record_limiter_charges(monkeypatch)
    order: list[Any] = []

    async def main() -> None:
        await _call_in_order(admission, order, "first", 0, 500)  # the bucket: the rest wait for tokens
        late = [
            asyncio.create_task(_call_in_order(admission, order, (5, n), (5, n), 1_500)) for n in range(3)
        ]
        await asyncio.sleep(3.0)  # one 500-token piece comes every ~2.6 s: (5, 0) has paid one of three
        assert sum(amount for _, amount in charges) == 1_000
        early = [
            asyncio.create_task(_call_in_order(admission, order, (1, n), (1, n), 1_500)) for n in range(2)
        ]
        await asyncio.gather(*late, *early)

    run_virtual(main())
    assert order == ["first", (1, 0), (1, 1), (5, 0), (5, 1), (5, 2)]
    assert sum(amount for _, amount in charges) == 500 + 5 * 1_500  # nothing charged twice or lost
    assert max_window_sum(charges) <= 12_000


@pytest.mark.parametrize("seed", [0, 1])
def test_budgets_hold_in_every_window_when_calls_of_random_steps_overtake_each_other(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Every admission goes to the best-placed call waiting, and overtaking never lets a budget through
    faster: requests and tokens stay within their shares in every 60-second window while calls of
    random steps keep arriving, and most of the binding budget is still used."""
    rpm, tpm, workers = 300, 90_000, 2
    admission = Admission(
        LimitsConfig(
            max_concurrency=12,
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
            estimated_tokens_per_request=400,
        ),
        workers,
    )
    requests: list[tuple[float, int]] = []
    tokens: list[tuple[float, int]] = []
    waiting: set[tuple[int, float]] = set()
    acquire = AsyncLimiter.acquire

    async def recording_acquire(self: AsyncLimiter, amount: float = 1) -> None:
        await acquire(self, amount)
        target = requests if admission._requests and self is admission._requests.limiter else tokens
        target.append((asyncio.get_running_loop().time(), int(amount)))

    monkeypatch.setattr(AsyncLimiter, "acquire", recording_acquire)
    rng = random.Random(seed)
    minutes = 10

    async def caller() -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < minutes * 60:
            estimate = rng.randint(50, 1_500)
            priority = (rng.randint(0, 5), rng.random())
            waiting.add(priority)
            async with admission.admit(estimate, priority) as reservation:
                waiting.remove(priority)
                assert all(priority < other for other in waiting)  # the best-placed call waiting
                await asyncio.sleep(rng.uniform(0.1, 2.0))
                reservation.settle(int(estimate * rng.uniform(0.5, 1.5)))

    async def main() -> None:
        await asyncio.gather(*(caller() for _ in range(24)))

    run_virtual(main())
    assert max_window_sum(requests) <= rpm // workers
    assert max_window_sum(tokens) <= tpm // workers
    used = sum(amount for t, amount in tokens if t < minutes * 60)
    assert used >= 0.95 * (tpm // workers) * minutes  # tokens bind here (~800 a call, 150 calls a minute)


def test_a_call_cancelled_while_it_waits_for_budget_hands_the_budget_on() -> None:
    """The call whose turn it is to wait for budget gives up: the next one in order gets the next
    request at the time it would have come anyway, and no slot or turn is left behind."""
    admission = Admission(LimitsConfig(max_concurrency=4, requests_per_minute=120))
    order: list[Any] = []
    times: dict[Any, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await _call_in_order(admission, order, "first", 0)
        doomed = asyncio.create_task(_call_in_order(admission, order, "doomed", 1))
        await _settle_tasks()
        later = [asyncio.create_task(_call_in_order(admission, order, n, 2)) for n in range(2)]
        await asyncio.sleep(0.2)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        for n, task in enumerate(later):
            await task
            times[n] = loop.time()
        assert (admission.waiting, admission.in_flight, admission._slots.locked()) == (0, 0, False)

    run_virtual(main())
    assert order == ["first", 0, 1]
    assert times[0] == pytest.approx(60 / 119.9, abs=0.01)


def test_the_jobs_queue_orders_budget_by_step_too() -> None:
    """``limits.admission: job`` runs the same admission inside its broker: driven here in-process on
    the virtual clock, its grants follow the step, not the order the calls reached it."""

    from async_reward._core.job_admission import AdmissionBroker

    broker = AdmissionBroker(LimitsConfig(admission="job", max_concurrency=16, requests_per_minute=120))
    order: list[str] = []

    async def lease(name: str, priority: Any) -> None:
        assert await broker.acquire(name, 0, priority)
        order.append(name)
        await broker.release(name)

    async def main() -> None:
        await lease("w0-0", (0, 0))
        late = [asyncio.create_task(lease(f"w1-{n}", (5, n))) for n in range(4)]
        await _settle_tasks()
        early = [asyncio.create_task(lease(f"w2-{n}", (1, n))) for n in range(2)]
        await asyncio.gather(*late, *early)
        assert broker.stats()["in_flight"] == 0

    run_virtual(main())
    assert order == ["w0-0", "w2-0", "w2-1", "w1-0", "w1-1", "w1-2", "w1-3"]


# ------------------------------------------- the job queue's broker in-process (issue 42, item 12)


def _broker(max_concurrency: int, replacing: bool = False) -> Any:

    from async_reward._core.job_admission import AdmissionBroker

    limits = LimitsConfig(admission="job", max_concurrency=max_concurrency)
    return AdmissionBroker(limits, heartbeat_s=1.0, replacing=replacing)


def test_a_broker_that_replaces_a_dead_one_counts_the_reported_leases_before_any_grant() -> None:
    """Two slots; the dead broker had granted two calls that still run. The new one grants nothing
    for its grace (3 heartbeats), learns both leases from their caller's heartbeat, and lets a
    waiting call in only when one of them ends. A lease reported after the grace (a worker that
    stalled longer) is counted at once: over the cap for a moment, and no new grant until the job is
    back under it."""
    broker = _broker(2, replacing=True)
    granted: list[str] = []

    async def lease(name: str) -> None:
        assert await broker.acquire(name, 0, 1)
        granted.append(name)

    async def main() -> None:
        first = asyncio.create_task(lease("w-0"))  # the broker's first call: its grace starts
        await asyncio.sleep(0.5)
        await broker.heartbeat("a", {"a-0": 0, "a-1": 0})  # the calls the dead broker admitted
        await asyncio.sleep(2.0)
        assert broker.stats()["held_back"] == 1
        await asyncio.sleep(1.0)
        stats = broker.stats()
        assert (stats["in_flight"], stats["waiting"], stats["adopted"], stats["held_back"]) == (2, 1, 2, 0)
        assert granted == []
        await broker.release("a-0")
        await first
        assert granted == ["w-0"]
        await broker.heartbeat("b", {"b-0": 0})  # reported late: counted beyond the cap
        assert broker.stats()["in_flight"] == 3
        second = asyncio.create_task(lease("w-1"))
        await broker.release("a-1")
        await _settle_tasks()
        assert granted == ["w-0"]  # two in flight, the cap: still no grant
        await broker.release("b-0")
        await second
        assert granted == ["w-0", "w-1"]
        assert broker.stats()["max_in_flight"] == 3

    run_virtual(main())


def test_a_heartbeat_never_brings_back_a_released_lease_nor_counts_another_callers() -> None:
    """Ray may run a caller's release before the heartbeat it sent earlier, which still lists the
    lease: the lease stays released. A heartbeat counts only its own caller's leases. A broker that
    replaces nothing grants at once."""
    broker = _broker(1)

    async def main() -> None:
        assert await broker.acquire("a-0", 0, 0)
        await broker.release("a-0")
        await broker.heartbeat("a", {"a-0": 0, "b-0": 0})
        assert (broker.stats()["in_flight"], broker.stats()["adopted"]) == (0, 0)
        assert await broker.acquire("a-1", 0, 0)  # the slot is free

    run_virtual(main())


def test_a_heartbeat_answers_the_jobs_leases_held_by_calls_that_ignore_their_cancellation() -> None:
    """Each caller reports how many of its leases are held by calls that ignored their cancellation
    (they keep them until they end); every heartbeat is answered with the job's count, at most the
    leases each caller still holds, so a worker whose own calls are healthy sees another's stuck
    ones, and a stuck call that ended stops counting before its caller reports again."""
    broker = _broker(3)

    async def main() -> None:
        for lease in ("a-0", "a-1", "b-0"):
            assert await broker.acquire(lease, 0, 0)
        assert await broker.heartbeat("a", {"a-0": 0, "a-1": 0}, 2) == 2
        assert await broker.heartbeat("b", {"b-0": 0}) == 2
        await broker.release("a-0")  # one of them ended; a has not reported since
        assert await broker.heartbeat("b", {"b-0": 0}) == 1
        await broker.release("a-1")
        assert await broker.heartbeat("b", {"b-0": 0}) == 0
        assert broker.stats()["stuck"] == 0

    run_virtual(main())


@pytest.mark.parametrize(
    ("key", "budget", "kept"), [("requests_per_minute", 15, 8), ("tokens_per_minute", 20, 16)]
)
def test_a_budget_whose_whole_shares_lose_a_tenth_is_refused_naming_what_the_job_would_get(
    key: str, budget: float, kept: int
) -> None:
    """Each worker's limiter admits whole units in any minute, so 15 requests a minute over verl's
    default 8 workers sent 8 a minute (7.47 measured over 30 virtual minutes), without a word. Refused
    now, saying what the job would get; the job's one queue holds the whole budget, and a budget the
    workers divide keeps it all."""
    limits = {key: budget, "estimated_tokens_per_request": 1}
    with pytest.raises(ConfigError) as error:
        LimitsConfig(**limits).validate(8)
    assert error.value.key == f"reward.async_reward.limits.{key}"
    assert f"{kept:g} a minute for the job" in str(error.value), str(error.value)
    assert "limits.admission: job" in error.value.fix
    LimitsConfig(**limits, admission="job").validate(8)
    LimitsConfig(**{**limits, key: 16}).validate(8)


def test_a_fraction_of_a_small_budget_that_one_limiter_never_sends_is_refused() -> None:
    """1.5 requests a minute: one limiter (one worker, or the job's queue) sends one a minute."""
    for admission in ("worker", "job"):
        with pytest.raises(ConfigError, match=r"not a whole number.*: 1 a minute") as error:
            LimitsConfig(requests_per_minute=1.5, admission=admission).validate(1)
        assert error.value.fix == "write a whole number (1 or 2)"
    LimitsConfig(requests_per_minute=10.5).validate(1)  # 10 of 10.5: within a tenth, accepted
