"""``limits.admission: job``: one admission queue for the whole job, held by a Ray actor.

Reward workers here are real Ray actor processes, each with its own ``JobAdmission`` (as each of
verl's reward workers builds one in its manager), meeting at one broker actor found by name (the
worker processes are kept between tests and given a new ``JobAdmission`` each; every test's broker is
new, and killed after it); and
verl's own ``RewardLoopManager`` with two reward workers scoring through ``llm_judge`` over loopback.
Admitted calls wait on gates the test opens, never on a sleep: which call holds what is a fact the
test controls, not a race against a loaded machine's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from async_reward._core.errors import ConfigError
from async_reward._core.job_admission import SILENT_HEARTBEATS, broker_name
from async_reward.config import LimitsConfig, load_config
from tests.end_to_end.test_verl_integration import assert_statuses

pytestmark = pytest.mark.usefixtures("ray_cluster")

HEARTBEAT_S = 0.5
"""The workers' heartbeat here: a dead one is found after SILENT_HEARTBEATS of them (3 s)."""
SLOW_HEARTBEAT_S = 1.0
"""The heartbeat of the tests that replace the broker: its grace (GRACE_HEARTBEATS of them, 3 s)
leaves a loaded machine time to report the leases; a stalled broker is found after 12 s."""


@pytest.fixture
def unique() -> Iterator[str]:
    """A broker name of this test's own, so no test meets another's queue. A broker this process
    started under it (a test that drives one directly) is killed after the test, not kept for the
    session."""
    name = f"test-{time.monotonic_ns()}"
    yield name
    from async_reward._core.job_admission import _BROKERS

    handle = _BROKERS.pop(name, None)
    if handle is not None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


def make_limits(**fields: Any) -> LimitsConfig:
    return LimitsConfig(admission="job", **fields)


_WORKER_CLASS: Any = None


def _worker_class() -> Any:
    """The ``Worker`` actor class, made once per process (each ``ray.remote`` of a new class is
    exported to the cluster again)."""
    global _WORKER_CLASS
    if _WORKER_CLASS is not None:
        return _WORKER_CLASS
    import ray

    from async_reward._core.job_admission import JobAdmission

    @ray.remote(num_cpus=0)
    class Worker:
        """One reward worker process's admission: calls that, once admitted, wait on a named gate."""

        def __init__(self) -> None:
            self.admission: JobAdmission | None = None
            self.log: list[tuple[float, str]] = []
            self.gates: dict[str, asyncio.Event] = {}

        def configure(self, limits: dict[str, Any], name: str, heartbeat_s: float) -> None:
            """This test's admission, as a reward worker builds it in its manager."""
            self.admission = JobAdmission(LimitsConfig(**limits), name, heartbeat_s)
            self.log, self.gates = [], {}

        async def reset(self) -> None:
            """Back to the state of a process that never admitted a call: the previous test's calls
            and heartbeats cancelled (and awaited), the brokers this process started killed, and the
            module's memory of brokers (held, seen dead) emptied."""
            from async_reward import job_admission

            current = asyncio.current_task()
            others = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            for handle in job_admission._BROKERS.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            job_admission._BROKERS.clear()
            job_admission._REPLACED.clear()
            self.admission, self.log, self.gates = None, [], {}

        def _gate(self, name: str) -> asyncio.Event:
            return self.gates.setdefault(name, asyncio.Event())

        async def call(
            self,
            label: str,
            priority: Any = 0.0,
            tokens: int = 0,
            gate: str | None = None,
            give_up_s: float | None = None,
        ) -> str:
            """Admit one call (giving up after ``give_up_s`` of waiting), log it, hold it until ``gate``."""
            assert self.admission is not None, "configure() first"
            context = self.admission.admit(tokens, priority)
            try:
                async with asyncio.timeout(give_up_s):
                    reservation = await context.__aenter__()
            except TimeoutError:
                return "gave up"
            try:
                self.log.append((time.monotonic(), label))  # one clock for every process here
                if gate is not None:
                    await self._gate(gate).wait()
                if tokens:
                    reservation.settle(tokens * 10)
            finally:
                await context.__aexit__(None, None, None)
            return label

        def open(self, gate: str) -> None:
            self._gate(gate).set()

        def stall(self, seconds: float) -> None:
            """Block this worker's event loop (a sync method of an async actor runs on it): no heartbeat."""
            time.sleep(seconds)

        def order(self) -> list[tuple[float, str]]:
            return list(self.log)

        def in_flight(self) -> int:
            """This worker's calls admitted and not yet ended."""
            assert self.admission is not None, "configure() first"
            return self.admission.in_flight

    _WORKER_CLASS = Worker
    return Worker


_IDLE_WORKERS: list[Any] = []
"""``Worker`` processes of this pytest process that no test holds, reset: the next tests configure
them instead of starting new ones (a Ray worker process costs about 1.3 CPU-seconds to start here,
and the file used 19 of them). What each test checks is its own ``JobAdmission`` and its own broker,
both built new for it; only the process is reused, as a job reuses its reward workers. A worker a
test killed is dead and is never handed out again."""

_PING_S = 30.0
"""How long a reset may take before the worker counts as stuck (then it is killed, not reused)."""


def _alive_after_reset(worker: Any) -> bool:
    import ray

    try:
        ray.get(worker.reset.remote(), timeout=_PING_S)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        with contextlib.suppress(Exception):
            ray.kill(worker, no_restart=True)
        return False
    return True


@pytest.fixture
def start_workers(ray_cluster: None) -> Iterator[Callable[..., list[Any]]]:
    """``start_workers(limits, name, count, heartbeat_s)``: ``count`` workers, each with a new
    ``JobAdmission`` for ``name``; warm ones first. Handed back after the test, reset (their calls
    cancelled, their brokers killed), unless the test killed them."""
    import ray

    handed: list[Any] = []

    def start(limits: LimitsConfig, name: str, count: int, heartbeat_s: float = HEARTBEAT_S) -> list[Any]:
        worker_cls = _worker_class()
        workers = [_IDLE_WORKERS.pop() if _IDLE_WORKERS else worker_cls.remote() for _ in range(count)]
        handed.extend(workers)
        ray.get([w.configure.remote(dataclasses.asdict(limits), name, heartbeat_s) for w in workers])
        return workers

    yield start
    _IDLE_WORKERS.extend(worker for worker in handed if _alive_after_reset(worker))


@pytest.fixture(scope="module", autouse=True)
def _kill_idle_workers_after_the_module() -> Iterator[None]:
    """The warm workers live as long as this file's tests need them."""
    yield
    import ray

    while _IDLE_WORKERS:
        with contextlib.suppress(Exception):
            ray.kill(_IDLE_WORKERS.pop(), no_restart=True)


def broker_stats(name: str) -> dict[str, int]:
    """The counters of the broker the workers started (found by name: a handle made here would be a
    broker of this process, collected when it is dropped)."""
    import ray

    deadline = time.monotonic() + 60
    while True:
        try:
            return ray.get(ray.get_actor(name).stats.remote())
        except ValueError:  # not started yet
            assert time.monotonic() < deadline, f"no broker {name}"
            time.sleep(0.02)


def wait_for(name: str, **counts: int) -> dict[str, int]:
    """Until the broker's counters read ``counts`` (generous: a loaded machine only makes it slower)."""
    deadline = time.monotonic() + 60
    while any((stats := broker_stats(name))[key] != value for key, value in counts.items()):
        assert time.monotonic() < deadline, (counts, stats)
        time.sleep(0.02)
    return stats


def test_the_job_queue_caps_calls_across_workers_and_lends_a_slot_wherever_a_call_waits(
    unique, start_workers
):
    """Two workers, two slots for the job: a worker with nothing to do leaves both slots to the other
    (per worker, each would get one), and together they never have more than two in flight."""
    import ray

    busy, idle = start_workers(make_limits(max_concurrency=2), unique, 2)
    calls = [busy.call.remote(f"b{i}", gate="go") for i in range(3)]
    stats = wait_for(unique, in_flight=2, waiting=1)  # both slots at the busy worker, one call queued
    assert stats["max_in_flight"] == 2
    ray.get(busy.open.remote("go"))
    assert sorted(ray.get(calls)) == ["b0", "b1", "b2"]
    both = [idle.call.remote(f"i{i}", gate="go") for i in range(2)] + [busy.call.remote("b3", gate="later")]
    wait_for(unique, in_flight=2, waiting=1)
    ray.get([idle.open.remote("go"), busy.open.remote("later")])
    ray.get(both)
    assert wait_for(unique, in_flight=0, waiting=0)["max_in_flight"] == 2


def test_the_oldest_step_goes_first_wherever_its_call_waits(unique, start_workers):
    """A later step's call queued at one worker does not overtake an earlier step's call queued after
    it at another: the job's queue orders by priority (training step), not by worker or arrival."""
    import ray

    first, second = start_workers(make_limits(max_concurrency=1), unique, 2)
    holding = first.call.remote("holder", (0,), gate="go")
    wait_for(unique, in_flight=1)
    late_step = second.call.remote("step 5", (5,))
    wait_for(unique, waiting=1)
    early_step = first.call.remote("step 1", (1,))
    wait_for(unique, waiting=2)
    ray.get(first.open.remote("go"))
    ray.get([holding, late_step, early_step])
    # One slot: each call was admitted only after the one before had left, so the admission stamps
    # (CLOCK_MONOTONIC, shared by the processes of this machine) give the queue's order.
    admitted = sorted(ray.get(first.order.remote()) + ray.get(second.order.remote()))
    assert [label for _, label in admitted] == ["holder", "step 1", "step 5"]


def test_a_call_that_gives_up_waiting_leaves_no_waiter_and_takes_no_slot(unique, start_workers):
    import ray

    (one,) = start_workers(make_limits(max_concurrency=1), unique, 1)
    holding = one.call.remote("holder", gate="go")
    wait_for(unique, in_flight=1)
    assert ray.get(one.call.remote("impatient", give_up_s=0.2)) == "gave up"
    wait_for(unique, waiting=0)
    ray.get(one.open.remote("go"))
    ray.get(holding)
    wait_for(unique, in_flight=0)
    # The slot is free: the next call is admitted, and nothing was granted to the one that left.
    assert ray.get(one.call.remote("next", give_up_s=30.0)) == "next"
    assert broker_stats(unique)["granted"] == 2


def test_a_cancel_that_reaches_the_broker_before_or_after_its_grant_leaks_nothing(unique):
    """Ray may run an async actor's calls out of order: a cancel may come before its acquire, or
    after the grant it did not see. Either way the lease ends up neither held nor waiting."""
    import ray

    from async_reward._core.job_admission import JobAdmission

    broker = JobAdmission(make_limits(max_concurrency=1), unique).broker()
    ray.get(broker.cancel.remote("c-early"))
    assert ray.get(broker.acquire.remote("c-early", 0, 0.0)) is False
    assert ray.get(broker.acquire.remote("c-late", 0, 0.0)) is True
    with pytest.raises(ValueError, match="already waiting or held"):
        ray.get(broker.acquire.remote("c-late", 0, 0.0))  # an id is never granted twice
    ray.get(broker.cancel.remote("c-late"))
    assert ray.get(broker.acquire.remote("c-next", 0, 0.0)) is True  # the slot came back
    stats = ray.get(broker.stats.remote())
    assert (stats["in_flight"], stats["waiting"], stats["granted"]) == (1, 0, 2)
    ray.get(broker.release.remote("c-next"))
    ray.get(broker.release.remote("c-next"))  # a second release changes nothing
    assert ray.get(broker.stats.remote())["in_flight"] == 0


def test_a_dead_workers_leases_are_taken_back_and_a_live_workers_are_not(unique, start_workers):
    """Two slots: a live worker and a doomed one each hold one. The doomed one is killed: once it
    has missed its heartbeats its slot is taken back and a third call gets in, while the live
    worker's lease, held just as long, stays held (liveness, not a time limit on leases)."""
    import ray

    survivor, doomed = start_workers(make_limits(max_concurrency=2), unique, 2)
    ray.get(survivor.call.remote("starts the broker"))  # the survivor's process holds it
    live = survivor.call.remote("live", gate="go")
    doomed.call.remote("never finishes", gate="never")
    wait_for(unique, in_flight=2)
    ray.kill(doomed)
    assert ray.get(survivor.call.remote("third", give_up_s=60.0)) == "third"
    stats = wait_for(unique, in_flight=1)  # the live worker's lease, still held ("third"'s release
    assert stats["reclaimed"] == 1  # is sent without waiting, so it may reach the broker a moment later)
    time.sleep(SILENT_HEARTBEATS * HEARTBEAT_S * 2)  # twice the silence allowed: a live one beats on
    assert broker_stats(unique)["reclaimed"] == 1
    ray.get(survivor.open.remote("go"))
    assert ray.get(live) == "live"


def test_a_dead_workers_waiting_calls_are_dropped_not_granted(unique, start_workers):
    """Ray does not stop an actor call when its caller dies: the dead worker's three queued calls
    would each be granted in turn, hold the slot and spend the budget. They are dropped instead."""
    import ray

    survivor, doomed = start_workers(make_limits(max_concurrency=1, requests_per_minute=600), unique, 2)
    ray.get(survivor.call.remote("starts the broker"))  # the survivor's process holds it
    holding = survivor.call.remote("holder", gate="go")
    wait_for(unique, in_flight=1)
    for i in range(3):
        doomed.call.remote(f"dead {i}")
    wait_for(unique, waiting=3)
    ray.kill(doomed)
    stats = wait_for(unique, waiting=0)
    assert stats["reclaimed"] == 3 and stats["granted"] == 2
    ray.get(survivor.open.remote("go"))
    ray.get(holding)
    assert ray.get(survivor.call.remote("next", give_up_s=60.0)) == "next"
    assert broker_stats(unique)["granted"] == 3  # the survivor's three: none of the dead worker's


def test_a_live_worker_taken_for_dead_queues_its_call_again(unique, start_workers):
    """A worker whose event loop stalls past the silence allowed has its waiting call dropped; once it
    runs again the call queues again and is admitted (a stall is not a lost sample)."""
    import ray

    survivor, stalled = start_workers(make_limits(max_concurrency=1), unique, 2)
    ray.get(survivor.call.remote("starts the broker"))
    holding = survivor.call.remote("holder", gate="go")
    wait_for(unique, in_flight=1)
    queued = stalled.call.remote("patient", give_up_s=120.0)
    wait_for(unique, waiting=1)
    ray.get(stalled.stall.remote(SILENT_HEARTBEATS * HEARTBEAT_S * 3))
    assert broker_stats(unique)["reclaimed"] == 1  # dropped while it was silent
    ray.get(survivor.open.remote("go"))
    assert ray.get(queued) == "patient"
    assert ray.get(holding) == "holder"


def test_when_the_worker_that_started_the_broker_dies_every_waiting_call_moves_to_a_new_one(
    unique, start_workers
):
    """The broker lives as long as the worker that started it. When it dies with twenty calls waiting
    at two other workers, one new broker takes them all (one caller starts it, the others find it),
    every call is admitted, and that broker stays up."""
    import ray

    owner, *others = start_workers(make_limits(max_concurrency=1), unique, 3)
    owner.call.remote("never finishes", gate="never")
    wait_for(unique, in_flight=1)
    waiting = [worker.call.remote(f"w{i}", give_up_s=120.0) for worker in others for i in range(10)]
    wait_for(unique, waiting=20)
    ray.kill(owner)
    assert sorted(ray.get(waiting)) == sorted(f"w{i}" for _ in others for i in range(10))
    stats = wait_for(unique, in_flight=0, waiting=0)  # releases are sent without waiting for them
    assert stats["granted"] == 20
    assert ray.get(others[0].call.remote("after", give_up_s=60.0)) == "after"


def live_broker(name: str, dead: set[Any]) -> tuple[Any, dict[str, int]] | None:
    """The broker now registered under ``name`` and its counters, if it answers and is none of
    ``dead`` (actor ids); None while the name still points at a dead one or at none."""
    import ray
    from ray.exceptions import RayActorError

    try:
        handle = ray.get_actor(name)
        if handle._actor_id in dead:
            return None
        return handle, ray.get(handle.stats.remote(), timeout=30)
    except (ValueError, RayActorError, ray.exceptions.GetTimeoutError):
        return None


def replaced(name: str, dead: set[Any], workers: list[Any], bound: int, **counts: int) -> dict[str, int]:
    """Until a broker that is none of ``dead`` has held back its grace and reads ``counts``, while the
    slot is still held: all along, the calls in flight in the job (summed over the workers) stay
    within ``bound`` and the new broker grants nothing."""
    import ray

    deadline = time.monotonic() + 180
    while True:
        in_flight = sum(ray.get([worker.in_flight.remote() for worker in workers]))
        assert in_flight <= bound, f"{in_flight} calls in flight in the job against max_concurrency={bound}"
        found = live_broker(name, dead)
        if found is not None:
            handle, stats = found
            assert stats["granted"] == 0, f"a new broker granted a call while the slot was held: {stats}"
            if not stats.get("held_back", 0) and all(stats[key] == value for key, value in counts.items()):
                dead.add(handle._actor_id)  # the next kill's victim
                return stats
        assert time.monotonic() < deadline, (counts, found)
        time.sleep(0.05)


def test_broker_failures_keep_max_concurrency_and_a_call_requeues_three_times_then_fails(
    unique, start_workers
):
    """Issue 42, items 12 and 13. One slot: a worker holds it while another's call waits with no
    admission timeout. The broker is killed four times. Each new broker learns the held lease from
    the holder's heartbeat before it grants anything, so the waiting call stays out (one call in
    flight in the job, not one more per failure); that call queues again after each of its first
    three failures and fails at the fourth (the sample's ``error``)."""
    import ray

    holder_worker, waiter = start_workers(make_limits(max_concurrency=1), unique, 2, SLOW_HEARTBEAT_S)
    holder = holder_worker.call.remote("holder", gate="go")
    wait_for(unique, in_flight=1)
    queued = waiter.call.remote("queued", gate="never")  # if admitted, it would stay in flight
    wait_for(unique, waiting=1)
    dead = {ray.get_actor(unique)._actor_id}
    for failure in range(1, 5):
        ray.kill(ray.get_actor(unique))
        if failure == 4:
            break
        stats = replaced(unique, dead, [holder_worker, waiter], 1, in_flight=1, waiting=1)
        assert stats["adopted"] == 1 and stats["granted"] == 0, stats
    with pytest.raises(ray.exceptions.RayError, match=r"RayActorError|ActorDiedError|actor died"):
        ray.get(queued, timeout=180)
    assert ray.get(waiter.order.remote()) == []  # never admitted
    ray.get(holder_worker.open.remote("go"))
    assert ray.get(holder, timeout=60) == "holder"


def test_a_stalled_broker_is_replaced_and_a_call_waiting_without_a_timeout_gets_in(unique, start_workers):
    """A broker alive but stalled (its event loop blocked) answers no heartbeat: its callers kill it
    and start another, which learns the held lease first; the call that was waiting with no
    admission timeout is admitted there once the slot is free, instead of waiting for ever."""
    import ray

    worker, other = start_workers(make_limits(max_concurrency=1), unique, 2, SLOW_HEARTBEAT_S)
    holder = worker.call.remote("holder", gate="go")
    wait_for(unique, in_flight=1)
    queued = other.call.remote("queued")
    wait_for(unique, waiting=1)
    time.sleep(SLOW_HEARTBEAT_S * 3)  # both have had a heartbeat answered: the stall deadline applies
    stalled = ray.get_actor(unique)
    stalled.__ray_call__.remote(lambda broker: time.sleep(900))  # blocks the broker's event loop
    stats = replaced(unique, {stalled._actor_id}, [worker, other], 1, in_flight=1, waiting=1)
    assert stats["adopted"] == 1 and stats["granted"] == 0
    ray.get(worker.open.remote("go"))
    assert ray.get([holder, queued], timeout=120) == ["holder", "queued"]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(stalled.stats.remote(), timeout=60)  # killed, not left stalled beside the new one


def test_the_whole_budgets_are_the_jobs_and_usage_above_the_estimate_is_charged(unique, start_workers):
    """With one queue nothing is split: a request budget too small to share over four workers is valid,
    and the tokens a response reported beyond its estimate become the queue's debt."""
    import ray

    limits = make_limits(
        max_concurrency=4, requests_per_minute=2, tokens_per_minute=1000, estimated_tokens_per_request=5
    )
    limits.validate(4)  # per worker this is refused: half a request a minute each
    with pytest.raises(ConfigError, match="less than one request per minute each"):
        dataclasses.replace(limits, admission="worker").validate(4)
    (one,) = start_workers(limits, unique, 1)
    ray.get(one.call.remote("a", 0.0, 5))  # settles 50 tokens against 5 charged
    broker = ray.get_actor(unique)
    deadline = time.monotonic() + 60
    while ray.get(broker.__ray_call__.remote(lambda b: b._admission._token_debt)) != 45:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ray.get(broker.__ray_call__.remote(lambda b: b._admission.request_budget)) == 2
    with pytest.raises(ValueError, match="exceeds the job's whole budget of 1000 tokens"):
        ray.get(one.call.remote("too big", 0.0, 1001))


def test_the_broker_name_depends_on_job_limits_and_endpoint_and_shows_none_of_them():
    limits = make_limits(max_concurrency=3)
    secret = "https://user:hunter2@judge.example/v1"
    name = broker_name(limits, secret, "01000000")
    assert name == broker_name(make_limits(max_concurrency=3), secret, "01000000")
    assert name != broker_name(limits, "https://other.example/v1", "01000000")
    assert name != broker_name(make_limits(max_concurrency=4), secret, "01000000")
    assert name != broker_name(limits, secret, "02000000")  # another job: another queue
    assert "hunter2" not in name and "judge.example" not in name and "01000000" not in name


def test_function_components_have_a_queue_per_function_and_share_one_for_the_same_function(
    tmp_path, verl_config_factory, tokenizer
):
    """``async_composite`` with ``limits.admission: job``: two components calling different functions
    with the same limits had one broker between them (each got half its budget, without a word); each
    function is its own service now, and two components calling the same function share its queue."""
    from async_reward.managers.composite import AsyncCompositeRewardManager

    path = tmp_path / "fns.py"
    path.write_text(
        "def svc_a(*args, **kwargs):\n    return 1.0\n\ndef svc_b(*args, **kwargs):\n    return 0.0\n"
    )
    limits = {"max_concurrency": 1, "admission": "job"}

    def component(name: str, function: str) -> dict[str, Any]:
        return {
            "name": name,
            "manager": "async_rate_limited",
            "weight": 0.5,
            "function": {"path": str(path), "name": function},
            "async_reward": {"limits": limits},
        }

    parts = [component("a", "svc_a"), component("b", "svc_b"), component("c", "svc_a")]
    manager = AsyncCompositeRewardManager(
        verl_config_factory("async_composite", {"composite": {"components": parts}}), tokenizer
    )
    names = {part.name: part.manager.admission.name for part in manager.parts}
    assert names["a"] != names["b"], names
    assert names["a"] == names["c"], names


async def test_a_call_that_ignores_its_cancellation_keeps_its_lease_and_every_workers_waiters_see_it(
    verl_config_factory, tokenizer, batch_factory, tmp_path
):
    """Two reward workers' managers (two callers of one job queue, ``max_concurrency`` 1); a call of
    one ignores its cancellation at its deadline. It gave its lease back while it ran on, so the other
    worker's sample ran beside it. Now it keeps the lease until it ends, its worker's heartbeat says
    so, and the other worker's sample, which can get no slot, fails as ``timeout`` naming it instead of
    waiting for it (no ``admission_timeout_s``: it would wait until the gate opens, after the checks)."""
    import ray

    from async_reward._core.job_admission import _BROKERS
    from tests._core.test_failure_handling import HAZARDS, build, score, statuses, until
    from tests.managers.test_managers import write_module

    hazards = write_module(tmp_path, HAZARDS, "hazards.py")
    gate = tmp_path / "gate"
    settings = {
        "timeout_s": 0.5,
        "retry": {"max_attempts": 1},
        "limits": {"max_concurrency": 1, "admission": "job"},
    }
    stuck_one, other = (
        build(verl_config_factory, tokenizer, hazards, "async_score", **settings) for _ in "ab"
    )
    name = stuck_one.admission.name
    assert other.admission.name == name
    for manager in (stuck_one, other):
        manager.admission._heartbeat_s = HEARTBEAT_S  # the default 5 s only makes this slower
    try:
        [abandoned] = await score(stuck_one, batch_factory, [f"swallow:{gate}"])
        assert (
            "ignored its cancellation and was abandoned" in abandoned["reward_extra_info"]["failure_reason"]
        )
        assert stuck_one.admission.in_flight == 1  # the lease is kept while the call runs
        [starved] = await score(other, batch_factory, ["ok"], bound_s=60)
        info = starved["reward_extra_info"]
        assert info["status"] == "timeout", info
        assert "1 call(s) that ignored their cancellation still run" in info["failure_reason"], info
        assert (await ray.get_actor(name).stats.remote())["in_flight"] == 1
        gate.touch()  # the call ends: its lease goes back, and the job's queue serves the other worker
        await until(lambda: stuck_one.admission.in_flight == 0)
        assert statuses(await score(other, batch_factory, ["ok"], bound_s=60)) == ["ok"]
    finally:
        gate.touch()
        handle = _BROKERS.pop(name, None)
        if handle is not None:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)


def test_an_unknown_admission_scope_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as error:
        load_config({"reward": {"async_reward": {"limits": {"admission": "cluster"}}}})
    assert error.value.key == "reward.async_reward.limits.admission"
    assert "use worker" in str(error.value) and "or job" in str(error.value)


def test_the_start_up_checks_say_that_the_jobs_queue_is_on(verl_config_factory, monkeypatch, capsys):
    from async_reward._core import start_lines
    from async_reward.config.checks import check_reward

    monkeypatch.setattr(start_lines, "_SAID", set())
    limits = {"admission": "job", "max_concurrency": 12, "requests_per_minute": 90}
    check_reward(
        verl_config_factory(
            "async_remote", {"remote": {"url": "http://127.0.0.1:1/score"}, "limits": limits}, num_workers=3
        )
    )
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "admission=job" in line]
    assert line == (
        "async_reward: limits.admission=job: one admission queue for the job's 3 reward worker(s), in a "
        "Ray actor: 12 calls in flight in the whole job, 90 requests a minute, no tokens limit, oldest "
        "training step first (two actor calls per attempt)"
    )
    check_reward(
        verl_config_factory("async_remote", {"remote": {"url": "http://127.0.0.1:1/score"}}, num_workers=3)
    )
    assert "admission=job" not in capsys.readouterr().out


def test_llm_judge_through_verls_reward_loop_shares_one_queue_between_its_workers(
    server, verl_config_factory, reward_loop, batch_factory
):
    """The path a user takes: verl's RewardLoopManager starts two reward worker processes, each
    builds llm_judge, and both admit through the job's one queue: the judge never sees more than the
    job's three calls at once, and every sample is scored once."""
    import ray

    server.update_config(latency_ms=(100.0, 100.0))
    settings = {
        "judge": {"base_url": server.url + "/v1"},
        "limits": {"max_concurrency": 3, "admission": "job"},
    }
    config = verl_config_factory("llm_judge", settings, num_workers=2)
    rows = [{"response": f"The answer is {i}", "ground_truth": str(i % 3)} for i in range(16)]
    batch = batch_factory(rows)
    manager = reward_loop(config)
    output = manager.compute_rm_score(batch)
    assert_statuses(output, ["ok"] * len(rows))
    assert server.stats()["max_in_flight_total"] <= 3
    names = ray.get(
        [
            handle.__ray_call__.remote(lambda w: w.reward_manager.admission.name)
            for handle in manager.reward_loop_workers
        ]
    )
    assert len(set(names)) == 1
    # a lease goes back fire-and-forget (job_admission's docstring): the last may land after the scores
    stats = wait_for(names[0], in_flight=0)
    assert stats["max_concurrency"] == 3 and stats["max_in_flight"] <= 3
    assert stats["granted"] >= len(rows)


def test_the_score_command_outside_ray_is_the_whole_job(server, tmp_path):
    """``async-reward score`` starts no Ray: with ``admission: job`` its own process is the job, so its
    own admission over the whole limits is the job's (no actor, no cluster started for it)."""
    import json
    import subprocess
    import sys

    from tests.tools.test_cli_score import make_rows, read_output, write_jsonl

    server.update_config(latency_ms=(50.0, 50.0))
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(8))
    out = tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge", "--no-progress"]
    argv += ["--set", f"judge.base_url={server.url}/v1", "limits.admission=job", "limits.max_concurrency=2"]
    probe = (
        "import sys, ray, async_reward_cli; code = async_reward_cli.main(sys.argv[1:]); "
        "print('RAY_STARTED' if ray.is_initialized() else 'NO_RAY'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NO_RAY" in done.stdout
    assert [row["status"] for row in read_output(out)] == ["ok"] * 8
    assert server.stats()["max_in_flight_total"] <= 2
    assert json.dumps(read_output(out))  # every row written once, readable
