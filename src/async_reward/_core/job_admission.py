"""One admission queue for the whole job (``limits.admission: job``): a Ray actor holds it.

Why: with ``admission: worker`` every reward worker process enforces its own ``max_concurrency`` and
an equal share of RPM / TPM. When the load is uneven (a step's last samples sit at one worker, the
served judge's capacity split over workers that are not equally busy), a slot or a share of the
budget idles at one worker while calls wait at another. Here every attempt of every worker waits in
one queue: :class:`AdmissionBroker`, a named Ray actor that runs an ordinary
:class:`~async_reward._core.limits.Admission` over the whole limits (``max_concurrency`` calls in flight in
the job, the whole RPM / TPM, the oldest training step first wherever its calls come from; among
equal priorities, in the order the calls reach the actor).

The cost per attempt: two actor calls (take a lease; give it back, fire-and-forget), and per worker
with calls waiting or admitted one heartbeat every ``heartbeat_s`` (awaited, off the calls' path).
The lease is taken before the call's own deadline starts, so what the round trip costs is queueing
time (``admission_timeout_s``), never the service's ``timeout_s``. ``benchmarks/job_admission.py``
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
* The broker stalls (alive, its event loop blocked): a caller's heartbeat is awaited, and a broker
  that answers none for :data:`SILENT_HEARTBEATS` x 2 heartbeats is killed and handled as dead, so
  no call waits for ever on it, even with ``admission_timeout_s`` null.
* The broker dies (with the worker that started it, which holds it, or killed as stalled): the first
  caller to see it starts a new one, and every caller queues its waiting calls there again. Each
  heartbeat carries the leases its caller holds, so the new broker learns the calls the dead one
  admitted and counts them (``Admission.adopt``): ``max_concurrency`` holds across any number of
  restarts, as long as every live caller reports within the new broker's grace. A broker started to
  replace a dead one grants nothing for :data:`GRACE_HEARTBEATS` heartbeats from its first call
  (every live caller reports within one); a lease reported later still counts at once, and no grant
  goes out until the job is back under ``max_concurrency``. Its RPM / TPM windows start afresh. A
  call that finds the broker unreachable queues again after each of its first :data:`_RESTARTS`
  failures (a pause of 0.5, 1, 1.5 s), and raises at the next: the sample's status is ``error``
  with Ray's reason.
* A call ignores its cancellation (abandoned at its deadline, or its sample cancelled): it keeps
  its lease until it really ends (:class:`~async_reward._core.deadline.LeftRunningCalls`), and each
  heartbeat says how many such calls its caller has; the broker answers with the job's count, so a
  waiting call of any worker sees lease holders that may never end and gives up at ``timeout_s``
  (as a worker's own admission does) instead of waiting for them.

Written on Ray's actor primitives rather than a library: the queue needs the priority order and the
strict minute windows of :mod:`async_reward._core.limits` (no Ray library offers either), and a Ray actor is
what every verl job already runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from async_reward._core.admission_broker import (
    GRACE_HEARTBEATS,
    HEARTBEAT_S,
    SILENT_HEARTBEATS,
    AdmissionBroker,
)
from async_reward._core.deadline import LeftRunningCalls
from async_reward._core.limits import LimitSettings, Priority, TokenReservation, tokens_to_charge

__all__ = [
    "GRACE_HEARTBEATS",
    "HEARTBEAT_S",
    "SILENT_HEARTBEATS",
    "AdmissionBroker",
    "JobAdmission",
    "broker_name",
    "job_admission_line",
]

logger = logging.getLogger(__name__)

_FIRST_ANSWER_S = 120.0
"""How long a caller waits for the first answer of a broker it has not heard from yet (it may still
be starting: a process to spawn on a busy node), before taking it for stalled."""
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


def broker_name(limits: LimitSettings, endpoint: str | None, job: str = "") -> str:
    """The broker's Ray actor name: one per (job, limits, endpoint).

    Two managers of one job calling different services keep separate queues. The endpoint is hashed
    with the job's id, never shown: a URL may carry a token, and the name is visible to anyone who
    can list the cluster's actors.
    """
    key = json.dumps({"job": job, "limits": vars(limits), "endpoint": endpoint or ""}, sort_keys=True)
    return _NAME_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def job_admission_line(limits: LimitSettings, workers: int) -> str:
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


_BROKERS: dict[str, Any] = {}
"""Broker handles of this process by name. Kept here, not per ``JobAdmission``: the handle that
started a broker is what keeps it alive (Ray collects an actor whose creating handles are gone, a
handle found by name does not count), so it must live as long as the process, whichever of its
managers started it."""
_REPLACED: set[str] = set()
"""Names of brokers this process saw die: the next one it starts replaces a dead one (grace)."""
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
    process that started it holds it (``_BROKERS``), and the next caller to find it dead or stalled
    starts another. While this caller has calls waiting or admitted it sends a heartbeat every
    ``heartbeat_s``, with the leases it holds, and waits for the answer (see the module's docstring).
    """

    def __init__(self, limits: LimitSettings, name: str, heartbeat_s: float = HEARTBEAT_S) -> None:
        self._limits = limits
        self._name = name
        self._heartbeat_s = heartbeat_s
        self._token_whole = math.floor(limits.tokens_per_minute) if limits.tokens_per_minute else None
        self._ids = itertools.count()
        self._caller = uuid.uuid4().hex[:12]
        self._held: dict[str, int] = {}
        self._waiting = 0
        self._heart: asyncio.Task[None] | None = None
        self._heard: Any = None
        self._said_requeue_at = -math.inf
        self.left_running = LeftRunningCalls(limits.max_concurrency, "the job's")
        """This worker's admitted calls left running past their caller, each holding its lease (and,
        in ``reported``, the job's such calls as the broker last answered a heartbeat)."""

    @property
    def name(self) -> str:
        """The broker actor's name."""
        return self._name

    @property
    def in_flight(self) -> int:
        """This worker's calls admitted and not yet finished."""
        return len(self._held)

    @property
    def waiting(self) -> int:
        """This worker's calls waiting in the job's queue."""
        return self._waiting

    def broker(self) -> Any:
        """The broker's actor handle, started on first use.

        Started by a process that saw the job's broker die, it replaces that one and holds its grants
        back while the leases are reported; started by a process that never used the dead one (which
        cannot tell a first start from a restart), it grants at once and counts the leases as they
        are reported, so the job may briefly exceed ``max_concurrency`` by what it granted before.
        """
        handle = _BROKERS.get(self._name)
        if handle is None:
            handle = _BROKERS[self._name] = (
                _remote_broker_class()
                .options(name=self._name, get_if_exists=True, num_cpus=0, max_concurrency=_CONCURRENT_CALLS)
                .remote(self._limits, self._heartbeat_s, self._name in _REPLACED)
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

    def _lost(self, broker: Any, why: str) -> None:
        """``broker`` is dead (or was killed as stalled): the first caller of this process to see it
        drops its handle, so the next ``broker()`` finds or starts the one that replaces it."""
        _REPLACED.add(self._name)
        if _BROKERS.get(self._name) is broker:
            del _BROKERS[self._name]
            logger.warning("job-wide admission: actor %s %s; starting a new one", self._name, why)

    def _lease(self) -> str:
        return f"{self._caller}-{next(self._ids)}"

    async def _acquire(self, tokens: int, priority: Priority) -> str:
        """A lease from the broker.

        If the broker cannot be reached (``RayActorError``: dead, killed as stalled, or unavailable,
        when Ray cannot say whether the call ran), the lease is cancelled (whatever state it reached)
        and the call queues again under a new id, at the broker found or started by name, after each
        of its first :data:`_RESTARTS` failures, a short while apart (Ray's registry may still hand
        out a dead actor's name for a moment); the next failure raises. If the broker took this
        caller for dead, the call queues again (not a failure).
        """
        from ray.exceptions import RayActorError

        failures = 0
        while True:
            broker, lease = self.broker(), self._lease()
            try:
                if await broker.acquire.remote(lease, tokens, priority):
                    return lease
            except asyncio.CancelledError:
                broker.cancel.remote(lease)
                raise
            except RayActorError:
                broker.cancel.remote(lease)  # if it ran on a live broker, its slot comes back
                failures += 1
                if failures > _RESTARTS:
                    raise
                self._lost(broker, "unreachable")
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
        try:
            while self._waiting or self._held:
                answered = await self._heartbeat()
                # After a failure, soon again: the leases held must reach the new broker within its grace.
                await asyncio.sleep(self._heartbeat_s if answered else self._heartbeat_s / 10)
        finally:
            self.left_running.reported = 0  # not heard any more: the next beat's first answer says it

    async def _heartbeat(self) -> bool:
        """One heartbeat, carrying the leases this caller holds (a broker that replaced a dead one
        learns them so). False if the broker is dead, or stalled: no answer within
        ``SILENT_HEARTBEATS`` x 2 heartbeats (``_FIRST_ANSWER_S`` for one not heard from yet, which may
        still be starting). A stalled broker is killed, so that its waiting calls fail over to a new
        one instead of waiting for ever, and no second broker runs beside it under its name."""
        import ray
        from ray.exceptions import RayActorError

        broker = self.broker()
        deadline = self._heartbeat_s * SILENT_HEARTBEATS * 2
        if broker is not self._heard:
            deadline = max(deadline, _FIRST_ANSWER_S)
        try:
            stuck_in_job = await asyncio.wait_for(
                broker.heartbeat.remote(self._caller, dict(self._held), self.left_running.stuck), deadline
            )
        except TimeoutError:
            logger.warning(
                "job-wide admission: actor %s answered no heartbeat for %.0f s (stalled): killing it",
                self._name,
                deadline,
            )
            with contextlib.suppress(Exception):
                ray.kill(broker, no_restart=True)
            self._lost(broker, "stalled")
            return False
        except RayActorError:
            self._lost(broker, "unreachable")
            return False
        except Exception:  # anything else (Ray shutting down): the next acquire or heartbeat finds out
            logger.debug("job-wide admission: heartbeat failed", exc_info=True)
            return True
        self._heard = broker
        self.left_running.reported = stuck_in_job if isinstance(stuck_in_job, int) else 0
        return True

    @contextlib.asynccontextmanager
    async def admit(
        self, estimated_tokens: int | None = None, priority: Priority = 0.0
    ) -> AsyncIterator[TokenReservation]:
        """As :meth:`async_reward._core.limits.Admission.admit`, in the job's queue."""
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
            lease = await self._acquire(tokens, priority)
        finally:
            self._waiting -= 1
        reservation = _LeaseReservation(tokens)
        self._held[lease] = tokens
        try:
            yield reservation
        finally:
            del self._held[lease]
            charged = reservation.charged if reservation.charged > tokens else None
            # To the broker of now: one that replaced the granting one has learnt the lease from a
            # heartbeat (or will not: it is no longer held). None: the next caller starts one.
            broker = _BROKERS.get(self._name)
            if broker is not None:
                broker.release.remote(lease, charged)
