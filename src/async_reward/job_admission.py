"""One admission queue for the whole job (``limits.admission: job``): a Ray actor holds it.

Why: with ``admission: worker`` every reward worker process enforces its own ``max_concurrency`` and
an equal share of RPM / TPM. When the load is uneven (a step's last samples sit at one worker, the
served judge's capacity split over workers that are not equally busy), a slot or a share of the
budget idles at one worker while calls wait at another. Here every attempt of every worker waits in
one queue: :class:`AdmissionBroker`, a named Ray actor that runs an ordinary
:class:`~async_reward.limits.Admission` over the whole limits (``max_concurrency`` calls in flight in
the job, the whole RPM / TPM, the oldest training step first wherever its calls come from; among
equal priorities, in the order the calls reach the actor).

The cost per attempt: two actor calls (take a lease; give it back, fire-and-forget). The lease is
taken before the call's own deadline starts, so what the round trip costs is queueing time
(``admission_timeout_s``), never the service's ``timeout_s``. ``benchmarks/job_admission.py``
measures it.

What can go wrong, and what happens:

* The caller gives up while waiting (``admission_timeout_s``, a cancelled sample): it tells the
  broker, which drops the waiter, or hands the slot straight back if it was granted meanwhile.
* A worker dies with calls waiting or admitted: Ray does not stop an actor call when its caller
  dies, so the broker cannot learn it from Ray. Every caller with calls waiting or admitted sends a
  heartbeat every ``heartbeat_s``; the broker drops the waiting calls and takes back the leases of a
  caller silent for :data:`SILENT_HEARTBEATS` heartbeats, so a dead worker neither holds slots nor
  spends budget. (Not a hold limit on each lease: a live call can wait for a thread or a process of
  its worker's pool for as long as ``admission_timeout_s`` allows, unbounded by default.) A live
  caller wrongly taken for dead (its event loop stalled that long) queues its calls again.
* The broker dies (with the worker that started it, which holds it): the first caller to see it
  starts a new one, and every caller queues its waiting calls there again. What the dead one had
  admitted is unknown to the new one, so while those calls finish the job may have up to twice
  ``max_concurrency`` calls in flight, and the RPM / TPM windows start afresh. After a few failures
  in a row a call raises: the sample's status is ``error`` with Ray's reason; nothing waits forever.

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
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from .config import LimitsConfig
from .limits import Admission, Priority, TokenReservation, tokens_to_charge

__all__ = [
    "HEARTBEAT_S",
    "SILENT_HEARTBEATS",
    "AdmissionBroker",
    "JobAdmission",
    "broker_name",
    "job_admission_line",
]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
"""Seconds between two heartbeats of a caller with calls waiting or admitted."""
SILENT_HEARTBEATS = 6
"""Heartbeats a caller may miss before the broker takes it for dead (30 s by default)."""
_NAME_PREFIX = "async_reward_admission_"
_CONCURRENT_CALLS = 1_000_000
"""Concurrent calls the broker accepts. Every waiting attempt of the job is one ``acquire``, and a
full actor would hold back the ``release`` that lets one of them in: so far more than any job queues.
One event loop runs them all (no concurrency groups: Ray gives each group a loop of its own, and the
queue's futures belong to one loop)."""
_RESTARTS = 3
"""Times one call queues again after the broker could not be reached, before it raises."""
_RESTART_PAUSE_S = 0.5
"""Pause before queueing again after the n-th failure: n times this."""
_FORGOTTEN_KEPT = 10_000
"""Lease ids remembered as cancelled before their ``acquire`` arrived (oldest forgotten first)."""


def broker_name(limits: LimitsConfig, endpoint: str | None, job: str = "") -> str:
    """The broker's Ray actor name: one per (job, limits, endpoint).

    Two managers of one job calling different services keep separate queues. The endpoint is hashed
    with the job's id, never shown: a URL may carry a token, and the name is visible to anyone who
    can list the cluster's actors.
    """
    key = json.dumps(
        {"job": job, "limits": dataclasses.asdict(limits), "endpoint": endpoint or ""}, sort_keys=True
    )
    return _NAME_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


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


_Admitted = contextlib.AbstractAsyncContextManager[TokenReservation]
"""An ``Admission.admit`` context entered and not yet exited: a held lease."""


def _caller_of(lease: str) -> str:
    return lease.rsplit("-", 1)[0]


class AdmissionBroker:
    """The job's admission queue (a Ray actor: see :class:`JobAdmission` for how it is started).

    A lease is one admitted attempt. Its id, ``<caller>-<number>``, is chosen by the caller, so a
    ``cancel`` can name a lease whose ``acquire`` has not started yet (Ray may run an async actor's
    calls out of order), and the broker knows whose calls to drop when a caller falls silent.
    """

    def __init__(self, limits: dict[str, Any], heartbeat_s: float = HEARTBEAT_S) -> None:
        config = LimitsConfig(**limits)
        self._admission = Admission(config, worker_count=1)
        self._max_concurrency = config.max_concurrency
        self._silent_s = heartbeat_s * SILENT_HEARTBEATS
        self._sweep_every_s = heartbeat_s
        self._held: dict[str, tuple[_Admitted, TokenReservation]] = {}
        self._waiting: dict[str, asyncio.Task[Any]] = {}
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._seen: dict[str, float] = {}
        self._reclaimed = self._granted = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def acquire(self, lease: str, estimated_tokens: int, priority: Priority) -> bool:
        """Wait for a slot and the budgets. True once granted; False if the lease was cancelled, or
        its caller was taken for dead (the caller then queues again under a new id)."""
        if lease in self._forgotten:
            del self._forgotten[lease]
            return False
        if lease in self._waiting or lease in self._held:
            raise ValueError(f"lease {lease} is already waiting or held: a caller's ids are never reused")
        caller = _caller_of(lease)
        self._seen[caller] = time.monotonic()
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
        held = self._held.pop(lease, None)
        if held is None:
            return  # taken back by the sweep, or cancelled
        context, reservation = held
        reservation.settle(charged_tokens)
        await context.__aexit__(None, None, None)

    async def cancel(self, lease: str) -> None:
        """The caller stopped waiting: drop its waiter, or give back what was granted meanwhile."""
        task = self._waiting.get(lease)
        if task is not None:
            task.cancel()
        elif lease in self._held:
            await self.release(lease)
        else:  # its acquire has not arrived yet: it will return False at once
            self._forgotten[lease] = None
            while len(self._forgotten) > _FORGOTTEN_KEPT:
                self._forgotten.popitem(last=False)

    def heartbeat(self, caller: str) -> None:
        """``caller`` is alive (sent every ``heartbeat_s`` while it has calls waiting or admitted)."""
        self._seen[caller] = time.monotonic()

    def stats(self) -> dict[str, int]:
        """Counters: in flight now and at most, waiting, granted, and leases or waiting calls taken
        back from callers taken for dead (for tests and metrics)."""
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
        """While anything waits or is held: drop the calls of callers silent for too long."""
        while self._held or self._waiting:
            await asyncio.sleep(self._sweep_every_s)
            now = time.monotonic()
            busy = set(map(_caller_of, [*self._waiting, *self._held]))
            for caller in [
                c for c, seen in self._seen.items() if c not in busy and now - seen > self._silent_s
            ]:
                del self._seen[caller]  # finished callers (managers come and go): not kept for ever
            silent = {caller for caller in busy if now - self._seen.get(caller, now) > self._silent_s}
            for caller in silent:
                waiting = [lease for lease in self._waiting if _caller_of(lease) == caller]
                held = [lease for lease in self._held if _caller_of(lease) == caller]
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
                for lease in held:
                    await self.release(lease)


_BROKERS: dict[str, Any] = {}
"""Broker handles of this process by name. Kept here, not per ``JobAdmission``: the handle that
started a broker is what keeps it alive (Ray collects an actor whose creating handles are gone, a
handle found by name does not count), so it must live as long as the process, whichever of its
managers started it."""
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

    The broker is found by name, or started by the first worker to need it (``get_if_exists``); the
    process that started it holds it (``_BROKERS``), and the next caller to find it dead starts
    another. While this caller has calls waiting or admitted it sends a heartbeat every
    ``heartbeat_s`` (see the module's docstring).
    """

    def __init__(self, limits: LimitsConfig, name: str, heartbeat_s: float = HEARTBEAT_S) -> None:
        self._limits = limits
        self._name = name
        self._heartbeat_s = heartbeat_s
        self._token_whole = math.floor(limits.tokens_per_minute) if limits.tokens_per_minute else None
        self._ids = itertools.count()
        self._caller = uuid.uuid4().hex[:12]
        self._in_flight = self._waiting = 0
        self._heart: asyncio.Task[None] | None = None
        self._said_requeue_at = -math.inf

    @property
    def name(self) -> str:
        """The broker actor's name."""
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
        handle = _BROKERS.get(self._name)
        if handle is None:
            handle = _BROKERS[self._name] = (
                _remote_broker_class()
                .options(name=self._name, get_if_exists=True, num_cpus=0, max_concurrency=_CONCURRENT_CALLS)
                .remote(dataclasses.asdict(self._limits), self._heartbeat_s)
            )
            logger.info(
                "job-wide admission through Ray actor %s: %d calls in flight in the whole job, "
                "requests_per_minute=%s, tokens_per_minute=%s",
                self._name,
                self._limits.max_concurrency,
                self._limits.requests_per_minute,
                self._limits.tokens_per_minute,
            )
        return handle

    def _lease(self) -> str:
        return f"{self._caller}-{next(self._ids)}"

    async def _acquire(self, tokens: int, priority: Priority) -> tuple[Any, str]:
        """A lease from the broker: ``(broker, lease)``.

        If the broker cannot be reached (``RayActorError``: dead, or unavailable, when Ray cannot say
        whether the call ran), the lease is cancelled (whatever state it reached) and the call queues
        again under a new id, at the broker found or started by name, up to :data:`_RESTARTS` times a
        short while apart (Ray's registry may still hand out a dead actor's name for a moment); then
        it raises. If the broker took this caller for dead, the call queues again.
        """
        from ray.exceptions import RayActorError

        failures = 0
        while True:
            broker, lease = self.broker(), self._lease()
            try:
                if await broker.acquire.remote(lease, tokens, priority):
                    return broker, lease
            except asyncio.CancelledError:
                broker.cancel.remote(lease)
                raise
            except RayActorError:
                broker.cancel.remote(lease)  # if it ran on a live broker, its slot comes back
                failures += 1
                if failures > _RESTARTS:
                    raise
                if _BROKERS.get(self._name) is broker:  # the first to see it gone starts the next
                    del _BROKERS[self._name]
                    logger.warning("job-wide admission: actor %s unreachable; starting a new one", self._name)
                await asyncio.sleep(_RESTART_PAUSE_S * failures)
                continue
            # False without a cancel of ours: the broker took this caller for dead. We are not: again.
            now = time.monotonic()
            if now - self._said_requeue_at > 60.0:
                self._said_requeue_at = now
                logger.warning("job-wide admission: the queue took this worker for dead; queueing again")

    def _keep_heart_beating(self) -> None:
        if self._heart is None or self._heart.done():
            self._heart = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while self._waiting or self._in_flight:
            with contextlib.suppress(Exception):  # a dead broker: the next acquire finds out
                self.broker().heartbeat.remote(self._caller)
            await asyncio.sleep(self._heartbeat_s)

    @contextlib.asynccontextmanager
    async def admit(
        self, estimated_tokens: int | None = None, priority: Priority = 0.0
    ) -> AsyncIterator[TokenReservation]:
        """As :meth:`async_reward.limits.Admission.admit`, in the job's queue."""
        tokens = tokens_to_charge(
            self._limits,
            estimated_tokens,
            self._token_whole,
            "the job's whole budget of {whole} tokens per minute (tokens_per_minute)",
            "Raise tokens_per_minute or shorten the request.",
        )
        self._waiting += 1
        self._keep_heart_beating()
        try:
            broker, lease = await self._acquire(tokens, priority)
        finally:
            self._waiting -= 1
        reservation = _LeaseReservation(tokens)
        self._in_flight += 1
        try:
            yield reservation
        finally:
            self._in_flight -= 1
            charged = reservation.charged if reservation.charged > tokens else None
            broker.release.remote(lease, charged)
