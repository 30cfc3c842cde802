"""One admission queue for the whole job (``limits.admission: job``): a Ray actor holds it.

Why: with ``admission: worker`` every reward worker process enforces its own ``max_concurrency`` and
an equal share of RPM / TPM. When the load is uneven (a step's last samples sit at one worker, the
served judge's capacity split over workers that are not equally busy), a slot or a share of the
budget idles at one worker while calls wait at another. Here every attempt of every worker waits in
one queue: :class:`AdmissionBroker`, a named Ray actor that runs an ordinary
:class:`~async_reward.limits.Admission` over the whole limits (``max_concurrency`` calls in flight in
the job, the whole RPM / TPM, the oldest training step first wherever its calls come from).

The cost per attempt: two actor calls (take a lease; give it back, fire-and-forget). The lease is
taken before the call's own deadline starts, so what the round trip costs is queueing time
(``admission_timeout_s``), never the service's ``timeout_s``. ``benchmarks/job_admission.py``
measures it.

What can go wrong, and what happens:

* The caller gives up while waiting (``admission_timeout_s``, a cancelled sample): it tells the
  broker, which drops the waiter, or hands the slot straight back if it was granted meanwhile.
* A worker dies holding leases: each lease carries a hold limit (the attempt's deadline, ``timeout_s``,
  plus :data:`HOLD_MARGIN_S`); the broker takes back leases held past it, so dead workers cannot
  shrink the job's concurrency for good. A live call that overran is not stopped; its slot is counted
  free again (the budgets were charged when it was admitted, so they hold regardless).
* The broker dies: every waiting and later admission raises (Ray's ``ActorDiedError``), so each
  sample gets status ``error`` with that reason; nothing waits forever.

Written on Ray's actor primitives rather than a library: the queue needs the priority order and the
strict minute windows of :mod:`async_reward.limits` (no Ray library offers either), and a Ray actor is
what every verl job already runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .config import LimitsConfig
from .limits import Admission, Priority, TokenReservation

__all__ = ["HOLD_MARGIN_S", "AdmissionBroker", "JobAdmission", "broker_name", "job_admission_line"]

logger = logging.getLogger(__name__)

HOLD_MARGIN_S = 60.0
"""Seconds a lease may be held past its attempt's deadline before the broker takes it back."""
_SWEEP_EVERY_S = 5.0
"""Longest gap between two looks for leases held past their limit."""
_NAME_PREFIX = "async_reward_admission_"
_CONCURRENT_CALLS = 1_000_000
"""Concurrent calls the broker accepts. Every waiting attempt of the job is one ``acquire``, and a
full actor would hold back the ``release`` that lets one of them in: so far more than any job queues.
One event loop runs them all (no concurrency groups: Ray gives each group a loop of its own, and the
queue's futures belong to one loop)."""


def broker_name(limits: LimitsConfig, endpoint: str | None) -> str:
    """The broker's Ray actor name: one per (limits, endpoint) in a Ray namespace.

    Two managers of one job calling different services keep separate budgets; two jobs in one
    namespace calling the same service with the same limits share one (as the service would count
    them). The endpoint is hashed, never shown: a URL may carry a token.
    """
    key = json.dumps({"limits": dataclasses.asdict(limits), "endpoint": endpoint or ""}, sort_keys=True)
    return _NAME_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]


def job_admission_line(limits: LimitsConfig, workers: int) -> str:
    """What ``limits.admission: job`` does, for the job's log at start-up (anything turned on is
    visibly on)."""

    def budget(value: float | None, unit: str) -> str:
        return f"{value:g} {unit} a minute" if value is not None else f"no {unit} limit"

    return (
        f"limits.admission=job: one admission queue for the job's {workers} reward worker(s), in a Ray "
        f"actor: {limits.max_concurrency} calls in flight in the whole job, "
        f"{budget(limits.requests_per_minute, 'requests')}, {budget(limits.tokens_per_minute, 'tokens')}, "
        "oldest training step first (two actor calls per attempt)"
    )


class AdmissionBroker:
    """The job's admission queue (a Ray actor: see :class:`JobAdmission` for how it is started).

    A lease is one admitted attempt; its id is chosen by the caller, so a ``cancel`` can name a lease
    whose ``acquire`` has not even started (Ray may run an async actor's calls out of order)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        config = LimitsConfig(**limits)
        self._admission = Admission(config, worker_count=1)
        self._max_concurrency = config.max_concurrency
        self._held: dict[
            str, tuple[contextlib.AbstractAsyncContextManager[TokenReservation], TokenReservation, float]
        ] = {}
        self._waiting: dict[str, asyncio.Task[Any]] = {}
        self._dropped: set[str] = set()
        self._reclaimed = self._granted = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def acquire(
        self, lease: str, estimated_tokens: int, priority: Priority, hold_limit_s: float
    ) -> bool:
        """Wait for a slot and the budgets; True once granted, False if ``cancel`` came first."""
        if lease in self._dropped:
            self._dropped.discard(lease)
            return False
        self._start_sweeper()
        context = self._admission.admit(estimated_tokens, priority)
        task = asyncio.current_task()
        assert task is not None
        self._waiting[lease] = task
        try:
            reservation = await context.__aenter__()
        except asyncio.CancelledError:
            return False  # cancel() stopped the wait; Admission released nothing it had not taken
        finally:
            self._waiting.pop(lease, None)
        self._held[lease] = (context, reservation, time.monotonic() + hold_limit_s)
        self._granted += 1
        return True

    async def release(self, lease: str, charged_tokens: int | None = None) -> None:
        """Give a lease back; ``charged_tokens``: the usage the response reported, when above the estimate."""
        held = self._held.pop(lease, None)
        if held is None:
            return  # taken back by the sweep, or cancelled
        context, reservation, _ = held
        reservation.settle(charged_tokens)
        await context.__aexit__(None, None, None)

    async def cancel(self, lease: str) -> None:
        """The caller stopped waiting: drop its waiter, or give back what was granted meanwhile."""
        task = self._waiting.get(lease)
        if task is not None:
            task.cancel()
        elif lease in self._held:
            await self.release(lease)
        else:
            self._dropped.add(lease)  # its acquire has not started: it will return False at once

    def stats(self) -> dict[str, int]:
        """Counters: in flight now and at most, waiting, granted and taken back (for tests and metrics)."""
        return {
            "in_flight": len(self._held),
            "max_in_flight": self._admission.max_in_flight,
            "waiting": self._admission.waiting,
            "granted": self._granted,
            "reclaimed": self._reclaimed,
            "max_concurrency": self._max_concurrency,
        }

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        while self._held or self._waiting:
            now = time.monotonic()
            overdue = [lease for lease, (_, _, until) in self._held.items() if until <= now]
            for lease in overdue:
                logger.warning(
                    "job-wide admission: took back a lease held past its attempt's deadline plus %g s "
                    "(its reward worker died or hung)",
                    HOLD_MARGIN_S,
                )
                self._reclaimed += 1
                await self.release(lease)
            deadlines = [until for _, _, until in self._held.values()]
            wait = min([_SWEEP_EVERY_S, *(until - now for until in deadlines)])
            await asyncio.sleep(max(0.01, wait))


_REMOTE_BROKER: Any = None


def _remote_broker_class() -> Any:
    """``AdmissionBroker`` as a Ray actor class, made once per process (Ray imported only here)."""
    global _REMOTE_BROKER
    if _REMOTE_BROKER is None:
        import ray

        _REMOTE_BROKER = ray.remote(AdmissionBroker)
    return _REMOTE_BROKER


class _LeaseReservation(TokenReservation):
    """The caller's view of a lease's tokens: ``settle`` records usage, sent with the release."""

    __slots__ = ()

    def __init__(self, estimated: int) -> None:
        self.estimated = self.charged = estimated

    def settle(self, actual_tokens: int | None) -> None:
        if actual_tokens is not None and actual_tokens > self.charged:
            self.charged = actual_tokens


class JobAdmission:
    """``Admission``'s interface (``admit``) over the job's broker actor, for one reward worker.

    The broker is found by name, or started by the first worker to need it (``get_if_exists``); it
    lives as long as the handle of the worker that started it (Ray collects an actor nobody holds,
    named or not), and is started again by the next worker to find it dead. ``hold_limit_s`` is how
    long a lease may be held before the broker takes it back (the attempt's deadline plus
    :data:`HOLD_MARGIN_S`).
    """

    def __init__(self, limits: LimitsConfig, name: str, hold_limit_s: float) -> None:
        self._limits = limits
        self._name = name
        self._hold_limit_s = hold_limit_s
        self._token_whole = math.floor(limits.tokens_per_minute) if limits.tokens_per_minute else None
        self._broker: Any = None
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:12]
        self._in_flight = self._waiting = 0

    @property
    def name(self) -> str:
        """The broker actor's name (in the job's Ray namespace)."""
        return self._name

    @property
    def in_flight(self) -> int:
        """This worker's calls admitted and not yet finished."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """This worker's calls waiting in the job's queue."""
        return self._waiting

    def broker(self) -> Any:
        """The broker's actor handle, started on first use."""
        if self._broker is None:
            self._broker = (
                _remote_broker_class()
                .options(name=self._name, get_if_exists=True, num_cpus=0, max_concurrency=_CONCURRENT_CALLS)
                .remote(dataclasses.asdict(self._limits))
            )
            logger.info(
                "job-wide admission through Ray actor %s: %d calls in flight in the whole job, "
                "requests_per_minute=%s, tokens_per_minute=%s",
                self._name,
                self._limits.max_concurrency,
                self._limits.requests_per_minute,
                self._limits.tokens_per_minute,
            )
        return self._broker

    async def _acquire(self, lease: str, tokens: int, priority: Priority) -> tuple[Any, bool]:
        """Take ``lease`` from the broker; if the broker has died, start a new one once and retry.

        A broker lives as long as the worker that started it; when that worker dies (verl's reward
        workers normally live as long as the job), the first worker to notice starts the next one.
        What the dead one had admitted is unknown to the new one, so for one hold limit the job may
        have up to twice ``max_concurrency`` calls in flight; its RPM / TPM windows start afresh.
        """
        from ray.exceptions import RayActorError

        for attempt in (1, 2):
            broker = self.broker()
            try:
                return broker, await broker.acquire.remote(lease, tokens, priority, self._hold_limit_s)
            except asyncio.CancelledError:
                broker.cancel.remote(lease)
                raise
            except RayActorError:
                if attempt == 2:
                    raise
                logger.warning("job-wide admission: actor %s died; starting a new one", self._name)
                self._broker = None
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def admit(
        self, estimated_tokens: int | None = None, priority: Priority = 0.0
    ) -> AsyncIterator[TokenReservation]:
        """As :meth:`async_reward.limits.Admission.admit`, in the job's queue."""
        tokens = self._limits.estimated_tokens_per_request if estimated_tokens is None else estimated_tokens
        tokens = math.ceil(tokens)
        if tokens < 0:
            raise ValueError(f"estimated_tokens must be >= 0, got {tokens}")
        if self._token_whole is not None and tokens > self._token_whole:
            raise ValueError(
                f"a request estimated at {tokens} tokens exceeds the job's whole budget of "
                f"{self._token_whole} tokens per minute (tokens_per_minute): no minute could hold it. "
                "Raise tokens_per_minute or shorten the request."
            )
        lease = f"{self._prefix}-{next(self._ids)}"
        self._waiting += 1
        try:
            broker, granted = await self._acquire(lease, tokens, priority)
        finally:
            self._waiting -= 1
        if not granted:  # only a cancel of ours answers False, and we are not cancelled
            raise RuntimeError(f"job-wide admission refused lease {lease} it was not asked to cancel")
        reservation = _LeaseReservation(tokens)
        self._in_flight += 1
        try:
            yield reservation
        finally:
            self._in_flight -= 1
            charged = reservation.charged if reservation.charged > tokens else None
            broker.release.remote(lease, charged)
