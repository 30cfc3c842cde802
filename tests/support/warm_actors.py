"""verl's reward-loop and agent-loop worker actors kept warm between the tests of one pytest process.

Each of those Ray actors is a process that imports torch and verl before it does anything (about 7 s
of CPU here), and the suite builds a ``RewardLoopManager`` and an agent-loop manager for almost every
run it makes. So instead of killing them after a run, the harness hands them back here, and the next
``RewardLoopManager`` / agent-loop manager of the same worker class re-initialises one: verl's own
``__init__`` runs again on the same actor (same class, same arguments verl passes), after every task
the previous run left on the actor's event loop has been cancelled. What a test exercises is the
same code on a fresh object; only the process is reused, as a long-running job reuses its workers.

Where reuse could change what a test sees, it does not happen:

* a re-initialisation that raises (a manager that refuses its config) kills the warm actor and
  builds a fresh one with verl's own call, so the failure surfaces exactly as it would (an actor that
  dies at construction);
* an actor that died (a test killed it) is dropped, never handed out;
* a reward worker keeps its name (verl names them ``reward_loop_worker_{i}``): a warm one is reused
  only for its own name, and freed before a fresh one takes the name;
* :func:`fresh_workers` turns reuse off for a block of code: a test about worker start-up or about
  our own ``kill_workers`` runs the real thing there.

Installed for the whole session by ``tests/conftest.py`` (``ray_cluster``), by wrapping
``RewardLoopManager._init_reward_loop_workers`` and ``AgentLoopManager._init_agent_loop_workers``, and
our ``PipelinedRewardLoopManager``'s ``start_workers`` / ``kill_workers``, in the pytest process only:
Ray workers and subprocesses run verl and our code unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import ray

__all__ = ["WARM", "WarmActors", "fresh_workers", "install", "release"]

logger = logging.getLogger(__name__)

#: How long a liveness check of a warm actor may take before it counts as dead.
_PING_TIMEOUT_S = 30.0


async def _cancel_other_tasks() -> None:
    """Cancel every task on this loop but the caller's, and wait until they have ended: the previous
    run's generations, scorings and their TransferQueue writes stop before the actor is reused."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.gather(*others, return_exceptions=True)


def _forget_a_replaced_transfer_queue() -> None:
    """Drop this process's TransferQueue client when the controller it was made for is gone: verl's
    agent-loop ``__init__`` calls ``tq.init()``, which reuses the process's client and asks its old
    controller for the config, so a warm worker whose TransferQueue was closed and opened again since
    (before a ``main_ppo`` subprocess, by the toy benchmark) refused every new run and was rebuilt."""
    import sys

    interface = sys.modules.get("transfer_queue.interface")
    if interface is None or interface._TQ_CONTROLLER is None:
        return  # this process never attached to a TransferQueue
    try:
        current = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    except ValueError:
        current = None
    if current == interface._TQ_CONTROLLER:
        return
    if interface._TQ_CLIENT is not None:
        with contextlib.suppress(Exception):
            interface._TQ_CLIENT.close()
    interface._TQ_CLIENT = interface._TQ_CONTROLLER = None


def _reusable(cls: type) -> Any:
    """``ray.remote`` of a subclass of ``cls`` that can be put back to a just-built state."""

    class Warm(cls):  # type: ignore[misc,valid-type]
        async def _warm_quiesce(self) -> None:
            await _cancel_other_tasks()

        async def _warm_reinit(self, *args: Any, **kwargs: Any) -> None:
            await _cancel_other_tasks()
            from async_reward._core.http import close_sessions

            await close_sessions()  # the previous managers' connections; the next opens its own
            _forget_a_replaced_transfer_queue()
            self.__dict__.clear()
            cls.__init__(self, *args, **kwargs)

    # Ray's logs and ``:actor_name:`` name the actor by its class: keep verl's name.
    Warm.__name__, Warm.__qualname__, Warm.__module__ = cls.__name__, cls.__qualname__, cls.__module__
    return ray.remote(Warm)


def _underlying(actor_cls: Any) -> type:
    """The Python class of a ``ray.remote`` class (or the class itself)."""
    return getattr(actor_cls, "__ray_actor_class__", actor_cls)


def _alive(handle: Any) -> bool:
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=_PING_TIMEOUT_S)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False
    return True


class WarmActors:
    """Idle warm actors by ``(class, slot)``; see the module docstring."""

    def __init__(self) -> None:
        self._idle: dict[tuple[type, str], list[Any]] = defaultdict(list)
        self._classes: dict[type, Any] = {}
        self._slot_of: dict[Any, tuple[type, str]] = {}
        self._names: dict[Any, str] = {}
        """Actor names (verl names its reward workers ``reward_loop_worker_{i}``), by handle."""
        self.enabled = True
        self.started: Counter[str] = Counter()
        """Actors built, by class name."""
        self.reused: Counter[str] = Counter()
        """Times a warm actor was re-initialised instead, by class name."""

    def acquire(self, actor_cls: Any, slot: str, options: dict[str, Any], args: tuple[Any, ...]) -> Any:
        """An actor of ``actor_cls`` initialised with ``args``: a warm one of ``slot`` if there is one
        alive and it accepts them, else a fresh one built with ``options`` (verl's own call)."""
        cls = _underlying(actor_cls)
        key = (cls, slot)
        while self.enabled and self._idle[key]:
            handle = self._idle[key].pop()
            if not _alive(handle):
                continue
            try:
                ray.get(handle._warm_reinit.remote(*args))
            except Exception as exc:  # the fresh actor below fails the way verl's would
                logger.info("warm %s refused its new config (%s): building a fresh one", cls.__name__, exc)
                _kill(handle, self._names.get(handle))
                break
            self.reused[cls.__name__] += 1
            self._slot_of[handle] = key
            return handle
        name = options.get("name")
        if name is not None:  # a warm actor of another class may hold the name: free it first
            for idle in self._idle.values():
                for held in [handle for handle in idle if self._names.get(handle) == name]:
                    idle.remove(held)
                    _kill(held, name)
        if cls not in self._classes:
            self._classes[cls] = _reusable(cls)
        handle = self._classes[cls].options(**options).remote(*args)
        if name is not None:
            self._names[handle] = name
        self.started[cls.__name__] += 1
        self._slot_of[handle] = key
        return handle

    def release(self, handles: list[Any]) -> None:
        """Back to the pool once their event loops are quiet; dead or unknown ones are dropped (an
        unknown one, built elsewhere, is killed as the harness always did); one already back is left
        as it is."""
        for handle in handles:
            if any(handle in idle for idle in self._idle.values()):
                continue  # handed back already (a manager shut down twice)
            key = self._slot_of.pop(handle, None)
            if key is None or not self.enabled:
                _kill(handle, self._names.get(handle))
                continue
            try:
                ray.get(handle._warm_quiesce.remote(), timeout=_PING_TIMEOUT_S)
            except Exception:  # dead, or stuck: never reused
                _kill(handle, self._names.get(handle))
                continue
            self._idle[key].append(handle)

    def close(self) -> None:
        """Kill every idle actor (the end of the session)."""
        for handles in self._idle.values():
            for handle in handles:
                _kill(handle)
        self._idle.clear()


def _kill(handle: Any, name: str | None = None) -> None:
    """Kill an actor and return once it is gone and its ``name`` (if any) is free to take again."""
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + _PING_TIMEOUT_S
    while time.monotonic() < deadline and _alive_quick(handle):
        time.sleep(0.05)
    while name is not None and time.monotonic() < deadline:
        try:
            holder = ray.get_actor(name)
        except ValueError:
            return
        if holder._actor_id != handle._actor_id:
            # The name is another actor's now (a warm one handed back after this one was replaced):
            # not ours to wait for. Waiting for it to go cost 30 s per such teardown.
            return
        time.sleep(0.05)


def _alive_quick(handle: Any) -> bool:
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=1.0)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False
    return True


WARM = WarmActors()


def release(handles: list[Any]) -> None:
    """Hand a run's workers back (:meth:`WarmActors.release`)."""
    WARM.release(list(handles))


@contextlib.contextmanager
def fresh_workers() -> Iterator[None]:
    """No reuse inside the block: every worker built there is new, and killed when released."""
    previous, WARM.enabled = WARM.enabled, False
    try:
        yield
    finally:
        WARM.enabled = previous


def install() -> None:
    """Wrap verl's two worker-building methods in this process (idempotent)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    if getattr(RewardLoopManager._init_reward_loop_workers, "_warm", False):
        return

    def init_reward_loop_workers(self: Any) -> None:
        self.reward_loop_workers = []
        for i in range(self.config.reward.num_workers):
            name = f"reward_loop_worker_{i}"
            self.reward_loop_workers.append(
                WARM.acquire(
                    self.reward_loop_workers_class,
                    slot=name,
                    options={"name": name},
                    args=(self.config, self.reward_router_address),
                )
            )

    async def init_agent_loop_workers(self: Any) -> None:
        from uuid import uuid4

        self.agent_loop_workers = [
            WARM.acquire(
                self.agent_loop_workers_class,
                slot=str(i),
                options={"name": f"agent_loop_worker_{i}_{uuid4().hex[:8]}"},
                args=(self.config, self.llm_client, self.teacher_client, self.reward_loop_worker_handles),
            )
            for i in range(self.rollout_config.agent.num_workers)
        ]

    init_reward_loop_workers._warm = True  # type: ignore[attr-defined]
    RewardLoopManager._init_reward_loop_workers = init_reward_loop_workers  # type: ignore[method-assign]
    AgentLoopManager._init_agent_loop_workers = init_agent_loop_workers  # type: ignore[method-assign]
    _install_pipeline_workers()


def _install_pipeline_workers() -> None:
    """The same for our legacy ``PipelinedRewardLoopManager``'s ``PipelineRewardWorker`` actors: its
    ``start_workers`` takes warm ones (by index; a reused actor keeps the name it was built with, which
    only logs show) and its ``kill_workers`` hands them back. Nothing to wrap where the legacy trainer
    was deleted (``async_reward.legacy`` absent)."""
    try:
        from async_reward.legacy import dispatch, manager, pool
    except ModuleNotFoundError as missing:
        if missing.name != "async_reward.legacy":
            raise
        return

    original_start, original_kill = pool.start_workers, pool.kill_workers

    def start_workers(
        config: Any,
        count: int,
        *,
        name_prefix: str,
        max_concurrency: int | None,
        options: dict[str, Any] | None,
        ready_timeout_s: float,
        reward_router_address: str | None = None,
    ) -> list[Any]:
        if options or not WARM.enabled:  # a caller's own actor options: built as it asked, never reused
            return original_start(
                config,
                count,
                name_prefix=name_prefix,
                max_concurrency=max_concurrency,
                options=options,
                ready_timeout_s=ready_timeout_s,
                reward_router_address=reward_router_address,
            )
        workers = []
        for i in range(count):
            label = f"{name_prefix}_{i}"
            handle = WARM.acquire(
                pool.PipelineRewardWorker,
                slot=str(i),
                options={"name": label, "max_concurrency": 64},
                args=(config, max_concurrency, reward_router_address),
            )
            workers.append(pool.WorkerRef(label=label, handle=handle))
        return pool.wait_until_ready(workers, ready_timeout_s)

    def kill_workers(workers: list[Any], wait_s: float = 30.0) -> None:
        if not WARM.enabled:  # our own kill, as a test of it needs
            original_kill(workers, wait_s)
            return
        for worker in workers:
            worker.alive = False
        release([worker.handle for worker in workers])

    manager.start_workers = start_workers  # type: ignore[assignment]
    dispatch.kill_workers = kill_workers  # type: ignore[assignment]
