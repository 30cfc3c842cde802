"""A user's sync reward function: resolved so it can run in a thread or a process, and run there with
a deadline that measures the call, not the wait for a free thread.

Longer than 400 lines: resolving the function (picklable for a process) and the pool that runs it
are one path a sync function takes; the pool's share is mostly what a call does at its edges (a
deadline passed, a cancelled sample, a process that died), each next to the state it touches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from async_reward._core.config_rules import bad_value, missing_value
from async_reward._core.deadline import AdmissionTimeout, DoublingWarning, run_with_deadline
from async_reward._core.limits import FifoSlots

__all__ = [
    "ExternFunction",
    "FunctionPool",
    "ScorerProcessDied",
    "check_reward_function",
    "default_pool_size",
    "load_user_object",
    "resolve_user_function",
    "user_object",
]

_FUNCTION_KEY = "reward.custom_reward_function"
_EXECUTOR_KEY = "reward.async_reward.executor"

logger = logging.getLogger(__name__)


#: The priority of a call run again after its pool broke: before every call not yet started (it had
#: its worker already; a rerun queued behind new calls could time out waiting, a good sample lost).
_RERUN_FIRST = float("-inf")


class ScorerProcessDied(BrokenProcessPool):
    """The reward function killed its process on this sample: it died in the shared pool and again
    when the call ran alone (status ``error``, not retried: it would die again)."""


class ExternFunction:
    """A picklable reference to ``custom_reward_function`` (file path + name + kwargs).

    verl loads the function with ``load_extern_object``, which executes the file under a generated
    module name; such a function cannot be pickled by reference into a process pool. This object is
    sent instead and loads the function once inside each pool process.
    """

    def __init__(self, path: str, name: str, reward_kwargs: dict[str, Any]) -> None:
        self.path = path
        self.name = name
        self.reward_kwargs = dict(reward_kwargs)

    def __call__(self, **kwargs: Any) -> Any:
        fn = load_user_object(self.path, self.name)
        return fn(**{**kwargs, **self.reward_kwargs})


@functools.lru_cache(maxsize=16)
def load_user_object(path: str, name: str) -> Any:
    """``name`` from the file (or ``pkg://`` module) at ``path``, loaded once per process (verl's
    ``load_extern_object`` runs the file every time it is called)."""
    from verl.utils.import_utils import load_extern_object

    return load_extern_object(module_path=path, object_name=name)


def user_object(config: Any, *, needed_by: str) -> tuple[str, str, Any] | None:
    """``(path, name, object)`` named by ``reward.custom_reward_function`` (None when no path is set),
    loaded as the reward workers will load it, so a wrong path or name is a ``ConfigError`` at
    start-up instead of a reward worker dying at the first step.

    Raises:
        ConfigError: no ``name``, a file that does not exist, a file that fails to run, or ``name``
            not defined in it.
    """
    fn_config = config.reward.get("custom_reward_function") or {}
    if not hasattr(fn_config, "get"):
        raise bad_value(_FUNCTION_KEY, fn_config, "is not a mapping", "write its path and name under it")
    path, name = fn_config.get("path"), fn_config.get("name")
    if not path:
        return None
    if not name:
        raise missing_value(f"{_FUNCTION_KEY}.name", needed_by, f"name the object in {path}")
    path, name = str(path), str(name)
    try:
        return path, name, load_user_object(path, name)
    except FileNotFoundError:
        raise bad_value(
            f"{_FUNCTION_KEY}.path", path, "does not exist", "give the path of your reward file"
        ) from None
    except AttributeError:
        raise bad_value(
            f"{_FUNCTION_KEY}.name",
            name,
            f"is not defined in {path}",
            "name a function or class of that file",
        ) from None
    except Exception as exc:  # the file itself raised while it ran (verl wraps that as RuntimeError)
        cause = exc.__cause__ or exc
        raise bad_value(
            f"{_FUNCTION_KEY}.path",
            path,
            f"cannot be loaded ({type(cause).__name__}: {cause})",
            "fix the error in that file",
        ) from None


def check_reward_function(config: Any, executor: str = "thread") -> None:
    """``custom_reward_function``, when set, must name a callable (for ``async_naive`` and
    ``async_rate_limited``), and a sync one under ``executor: process``."""
    found = user_object(config, needed_by="async_naive")
    if found is None:
        return
    path, name, obj = found
    if not callable(obj):
        raise bad_value(
            f"{_FUNCTION_KEY}.name",
            name,
            f"in {path} is a {type(obj).__name__}, not a function",
            "name a function",
        )
    _refuse_async_in_processes(obj, f"{name} of {path}", executor)


def _refuse_async_in_processes(fn: Callable[..., Any], what: str, executor: str) -> None:
    """Refuse an async ``fn`` under ``executor: process``: calling it in a pool process makes a
    coroutine, which cannot be sent back (``cannot pickle 'coroutine' object``), so every sample
    would fail. ``inspect.iscoroutinefunction`` sees through ``functools.partial``, verl's wrapping.

    Raises:
        ConfigError: naming ``reward.async_reward.executor`` and the fix.
    """
    if executor != "process":
        return
    if inspect.iscoroutinefunction(fn):
        raise bad_value(
            _EXECUTOR_KEY,
            executor,
            f"cannot run the async reward function {what}: a process returns its result by pickling, "
            "and a coroutine cannot be pickled, so every sample would fail",
            f"use {_EXECUTOR_KEY}=thread (the default; an async function runs on the event loop, not "
            "in the pool), or make the function sync",
        )


def resolve_user_function(
    config: Any, compute_score: Callable[..., Any] | None, executor: str
) -> Callable[..., Any]:
    """The callable a manager should call: verl's resolved function, or a picklable reference.

    With no ``custom_reward_function`` verl passes its default scorer for the data source.

    Raises:
        ConfigError: an async function under ``executor: process`` (:func:`_refuse_async_in_processes`).
    """
    if compute_score is None:
        from verl.utils.reward_score import default_compute_score

        compute_score = default_compute_score
    if executor != "process":
        return compute_score
    fn_config = config.reward.get("custom_reward_function") or {}
    path = fn_config.get("path")
    # Again here: a worker may be started by code that never ran the driver's check_reward_function.
    _refuse_async_in_processes(compute_score, f"{fn_config.get('name')} of {path}", executor)
    if not path:
        return compute_score  # verl's default scorer is a plain module function: picklable
    return ExternFunction(str(path), str(fn_config.get("name")), dict(fn_config.get("reward_kwargs") or {}))


class FunctionPool:
    """The threads (or processes) that run a manager's sync user function, each counted as busy from
    the moment a call is handed to it until the function returns.

    Why not the event loop's default executor: it has min(32, cpus + 4) threads while a worker runs
    ``limits.max_concurrency`` (64) calls at once, so calls queued inside the pool for a thread, and
    that queueing counted against their deadline: samples timed out without the function being slow.
    Here the pool has ``size`` workers (default: the manager's concurrency cap), a call takes a free
    one *before* its deadline starts, and the deadline measures the call alone.

    A call that outlives its deadline cannot be stopped (Python cannot kill a thread); it keeps its
    worker until it returns. So does a call whose sample was cancelled (a stopped batch): its function
    runs on, and from its deadline on it is overdue like the others. Such calls are counted
    (:attr:`overdue`, once each) and logged, and a call that finds every worker held waits at most
    ``wait_s`` for one, and at most ``timeout_s`` while overdue calls hold workers, then fails as
    ``timeout`` with a reason that says how many calls are stuck, instead of queueing behind them
    forever.
    """

    def __init__(self, kind: Literal["thread", "process"], size: int) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self.kind = kind
        self.size = size
        self.overdue = 0
        """Calls past their deadline whose function has not returned yet (each holds a worker)."""
        self._slots = FifoSlots(size)
        self._executor: Executor | None = None
        self._warning = DoublingWarning()

    @property
    def unit(self) -> str:
        return "thread" if self.kind == "thread" else "process"

    @property
    def units(self) -> str:
        return "threads" if self.kind == "thread" else "processes"

    async def call(
        self, fn: Callable[..., Any], kwargs: dict[str, Any], *, timeout_s: float, wait_s: float | None
    ) -> Any:
        """Run ``fn(**kwargs)`` on a free worker, then wait at most ``timeout_s`` for the call.

        Waiting for a worker is queueing, not the call: it is bounded by ``wait_s`` (the manager's
        ``admission_timeout_s``; None for no bound) and, while calls stuck past their deadline hold
        workers, by ``timeout_s`` (checked every ``timeout_s`` of waiting), so a pool held by calls
        that may never return fails its waiters instead of queueing them forever, while a pool that
        is merely busy with healthy calls never turns a waiting sample into a timeout.

        A process that dies (a crash, ``os._exit``, an OOM kill) breaks its whole pool: every call in
        flight there fails with ``BrokenProcessPool``, and which one killed it is unknown. So each of
        them is run again, once, alone in a new process of its own (ahead of calls not yet started,
        with a new ``timeout_s``): the call that kills its process again is the one that did, and only
        its sample fails; the others get their own result. The next call gets a new shared pool.

        Raises:
            AdmissionTimeout: no worker came free in time (status ``timeout``).
            TimeoutError: the call passed ``timeout_s`` (its worker stays busy until it returns).
            CancelledError: the caller was cancelled; a function still running keeps its worker until
                it returns, and counts as overdue if that is after ``timeout_s``.
            ScorerProcessDied: the call killed its process when it ran alone (status ``error``).
        """
        try:
            return await self._run(fn, kwargs, timeout_s, wait_s, alone=False)
        except BrokenProcessPool:
            if self.kind != "process":
                raise
        try:
            return await self._run(fn, kwargs, timeout_s, wait_s, alone=True)
        except BrokenProcessPool as exc:
            raise ScorerProcessDied(
                "the reward function's process died while scoring this sample (a crash, os._exit, a "
                "signal such as an OOM kill), also when it was run again alone in a process of its "
                f"own; the other calls in flight were run again and keep their results ({exc})"
            ) from None

    async def _run(
        self,
        fn: Callable[..., Any],
        kwargs: dict[str, Any],
        timeout_s: float,
        wait_s: float | None,
        *,
        alone: bool,
    ) -> Any:
        """One run of the call: on the shared pool, or (``alone``) in a new one-process pool that ends
        with the call, so that a process death there is this call's alone."""
        await self._take_worker(timeout_s, wait_s, priority=_RERUN_FIRST if alone else 0.0)
        loop = asyncio.get_running_loop()
        try:
            executor = ProcessPoolExecutor(max_workers=1) if alone else self._get_executor()
        except BaseException:
            self._slots.release()
            raise
        try:
            future: Future[Any] = executor.submit(_call_kwargs, fn, kwargs)
        except BaseException as exc:
            self._slots.release()
            if alone:
                executor.shutdown(wait=False)
            elif isinstance(exc, BrokenProcessPool):  # broken by another call's process, not seen yet
                self._drop_broken(executor)
            raise
        call = _Call(future, executor if alone else None)

        def returned(_done: Future[Any]) -> None:  # in the worker thread (or the pool's manager thread)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to hand it to
                loop.call_soon_threadsafe(self._returned, call)

        future.add_done_callback(returned)

        async def outcome() -> Any:
            result = await asyncio.wrap_future(future)
            return await result if inspect.isawaitable(result) else result  # a sync wrapper of a coroutine

        deadline = loop.time() + timeout_s
        try:
            return await run_with_deadline(outcome(), timeout_s, what="the reward function")
        except TimeoutError:
            self._mark_overdue(call, timeout_s)
            raise
        except BrokenProcessPool:
            if not alone:
                self._drop_broken(executor)
            raise
        except asyncio.CancelledError:
            # The sample was cancelled (a batch stopped) while its function runs: the thread cannot be
            # stopped and keeps its worker. If the function has not returned by its deadline it is
            # overdue like any call that passed it, so waiters for a worker see it and give up.
            if not future.done():
                call.timer = loop.call_at(deadline, self._mark_overdue, call, timeout_s)
            raise

    def _drop_broken(self, executor: Executor) -> None:
        """Forget the shared pool ``executor`` that a dead process broke, so the next call builds a new
        one; only once, by the first call that sees it (a later one must not drop the new pool)."""
        if self._executor is not executor:
            return
        self._executor = None
        executor.shutdown(wait=False)
        logger.warning(
            "a process of the reward function's pool died (a crash, os._exit, an OOM kill), failing every "
            "call in flight there; each is run again alone in a process of its own, and only a call that "
            "kills its process again fails (status error)"
        )

    def _mark_overdue(self, call: _Call, timeout_s: float) -> None:
        """Count ``call`` as overdue (once) if its function has not returned yet."""
        if call.overdue or call.returned or call.future.done():
            return
        call.overdue = True
        self.overdue += 1
        self._warn_overdue(timeout_s)

    def _returned(self, call: _Call) -> None:
        call.returned = True
        if call.own_executor is not None:
            # Here on the loop: the done callback runs in the pool's own manager thread.
            call.own_executor.shutdown(wait=False)
        if call.timer is not None:
            call.timer.cancel()
        if call.overdue:
            self.overdue -= 1
            self._warning.settled(self.overdue)
        self._slots.release()

    async def _take_worker(self, round_s: float, wait_s: float | None, priority: float = 0.0) -> None:
        """Acquire a worker (``priority``: lower first): in rounds of ``round_s``, failing after a round
        in which calls stuck past their deadline held workers, or once ``wait_s`` (if any) has passed."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        give_up_at = None if wait_s is None else began + wait_s
        while True:
            limit = round_s if give_up_at is None else min(round_s, max(0.0, give_up_at - loop.time()))
            try:
                async with asyncio.timeout(limit):
                    await self._slots.acquire(priority)
                return
            except TimeoutError:
                out_of_time = give_up_at is not None and loop.time() >= give_up_at
                if self.overdue or out_of_time:
                    bound = (
                        f"admission_timeout_s={wait_s:g} s"
                        if out_of_time and wait_s is not None
                        else f"timeout_s={round_s:g} s while stuck calls hold workers"
                    )
                    reason = self._no_worker_reason(loop.time() - began)
                    raise AdmissionTimeout(f"{reason}; limit: {bound}") from None

    def _no_worker_reason(self, wait_s: float) -> str:
        busy = f"all {self.size} {self.units}"
        stuck = (
            f"; {self.overdue} call(s) of the reward function still run past their deadline"
            if self.overdue
            else ""
        )
        return f"no free {self.unit} for the reward function within {wait_s:g} s ({busy} busy{stuck})"

    def _warn_overdue(self, timeout_s: float) -> None:
        if not self._warning.due(self.overdue):
            return
        logger.warning(
            "%d call(s) of the reward function still run past their %g s deadline and hold %d of %d "
            "%s (a running call cannot be stopped from outside); later samples wait for a free one "
            "and become 'timeout' when none comes free in time. Fix the function's hang.",
            self.overdue,
            timeout_s,
            self.overdue,
            self.size,
            self.units,
        )

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool's workers (``wait``: after their calls return); the next call starts new ones."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait)

    def _get_executor(self) -> Executor:
        if self._executor is None:
            if self.kind == "process":
                self._executor = ProcessPoolExecutor(max_workers=self.size)
            else:
                self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="async-reward")
        return self._executor


class _Call:
    """One call handed to a pool worker: whether it is counted overdue, whether its function has
    returned (its worker released), the timer that marks it overdue at its deadline when its
    sample was cancelled first, and the one-process pool it ran alone in (shut down when it returns)."""

    __slots__ = ("future", "overdue", "own_executor", "returned", "timer")

    def __init__(self, future: Future[Any], own_executor: Executor | None = None) -> None:
        self.future = future
        self.own_executor = own_executor
        self.overdue = False
        self.returned = False
        self.timer: asyncio.TimerHandle | None = None


def default_pool_size(kind: str, executor_workers: int | None, max_concurrency: int) -> int:
    """``executor_workers`` when set; else ``max_concurrency`` threads, or one process per CPU."""
    if executor_workers is not None:
        return executor_workers
    return max_concurrency if kind == "thread" else max(1, os.cpu_count() or 1)


def _call_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)
