"""Deadlines a callee cannot ignore, and user code that cannot stop the event loop.

``asyncio.timeout`` cancels the code it bounds and then waits for that code to finish cancelling: a
coroutine that catches ``CancelledError`` and carries on (a bare ``except BaseException``, a retry
loop of its own) keeps its caller waiting forever, and with it the sample, the batch and the trainer.
:func:`run_with_deadline` runs the call as its own task, cancels it at the deadline, gives it a short
grace to stop, and otherwise leaves it running and logs that it did: the caller gets its
``TimeoutError`` on time either way. A call left running still holds what was admitted for it (its
concurrency slot): :class:`LeftRunningCalls` gives that back only when the task really ends, and
counts and logs the calls that ignore their cancellation.

User code may also raise what asyncio treats as control flow. ``KeyboardInterrupt`` and
``SystemExit`` escape a task and stop the whole event loop (a Ray actor's loop included, which then
never answers again); a ``CancelledError`` the code raises by itself looks like the cancellation of
our task; ``GeneratorExit`` is no ``Exception``. :func:`contained` turns all of them into
:class:`UserCodeError`, an ordinary exception that becomes the sample's status ``error``, and lets a
``CancelledError`` through only when the task really is being cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "GRACE_S",
    "AdmissionTimeout",
    "DeadlineAbandoned",
    "DeadlineExceeded",
    "DoublingWarning",
    "LeftRunning",
    "LeftRunningCalls",
    "UserCodeError",
    "being_cancelled",
    "contained",
    "describe_error",
    "run_with_deadline",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long a call cancelled at its deadline may take to stop before it is abandoned.
GRACE_S = 1.0

LeftRunning = Callable[["asyncio.Future[Any]", bool], None]
"""Told of a call's task that :func:`run_with_deadline` leaves without waiting for it to end:
``(task, stuck)``; ``stuck``: it ignored its cancellation for the whole grace (abandoned at its
deadline); False: its caller was cancelled and the task, cancelled too, has not ended yet."""


class AdmissionTimeout(TimeoutError):
    """A call waited longer than allowed for a slot, a worker or a rate budget (status ``timeout``,
    not retried: the queue is what it waited for)."""


class DeadlineExceeded(TimeoutError):
    """:func:`run_with_deadline`'s deadline passed (the task stopped); ``timeout_s`` is that deadline."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(message, timeout_s)  # both in args: it pickles through Ray
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return str(self.args[0])


class DeadlineAbandoned(TimeoutError):
    """The call ignored its cancellation at the deadline and was left running (status ``timeout``,
    not retried: another attempt would pile up another copy)."""


class UserCodeError(RuntimeError):
    """A ``BaseException`` that user code raised (``KeyboardInterrupt``, ``SystemExit``,
    ``GeneratorExit``, a ``CancelledError`` nobody asked for), carried as an ordinary error so that it
    fails one sample instead of the event loop, the batch or the pipeline."""


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` for an error, or its type alone when its ``str()`` raises (user code
    controls both; an error report must not fail in turn)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def being_cancelled() -> bool:
    """True when the running task has a cancellation request pending (``Task.cancelling()``), i.e. a
    ``CancelledError`` seen now is ours to propagate, not something user code made up."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def as_user_code_error(exc: BaseException) -> UserCodeError | None:
    """The :class:`UserCodeError` for a ``BaseException`` that must not act as control flow here;
    None for an ordinary ``Exception`` or a real cancellation of the running task."""
    if isinstance(exc, Exception):
        return None
    if isinstance(exc, asyncio.CancelledError):
        if being_cancelled():
            return None
        return UserCodeError("CancelledError raised by the scoring code, not a cancellation of its task")
    detail = f": {exc}" if str(exc) else ""
    return UserCodeError(f"{type(exc).__name__} raised by the scoring code{detail}")


async def contained(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable``; a ``BaseException`` it raises that is not a real cancellation of this task
    comes out as :class:`UserCodeError`."""
    try:
        return await awaitable
    except BaseException as exc:
        replacement = as_user_code_error(exc)
        if replacement is None:
            raise
        raise replacement from exc


async def run_with_deadline(
    awaitable: Awaitable[_T],
    timeout_s: float,
    *,
    grace_s: float = GRACE_S,
    what: str = "the call",
    left_running: LeftRunning | None = None,
) -> _T:
    """Await ``awaitable`` (run as its own task, :func:`contained`) for at most ``timeout_s`` seconds.

    At the deadline the task is cancelled and given ``grace_s`` to stop; one that does not stop is
    abandoned (left running, logged). A caller cancelled while waiting cancels the task and returns
    at once, without waiting for it either. A task that ended after the deadline (the event loop
    was blocked, so no timer could fire on time) is a timeout too: its result is not used.
    ``left_running`` is told of the task each time this returns while it still runs (abandoned, or
    cancelled with its caller and not ended yet), so the caller can hold what the call uses (its
    admission: :class:`LeftRunningCalls`) until it really ends.

    Raises:
        DeadlineExceeded: the deadline passed (the task stopped, finished during the grace, or
            ended only after the deadline).
        DeadlineAbandoned: the deadline passed and the task ignored its cancellation.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    ended_at: list[float] = []
    task = asyncio.ensure_future(_timed(contained(awaitable), ended_at))

    def leave_cancelled() -> None:  # the caller is cancelled: so is the task, without waiting for it
        task.cancel()
        task.add_done_callback(_retrieve)
        if left_running is not None and not task.done():
            left_running(task, False)

    try:
        await asyncio.wait((task,), timeout=timeout_s)
    except asyncio.CancelledError:
        leave_cancelled()
        raise
    if task.done():
        return _outcome_on_time(task, ended_at[0] - started if ended_at else 0.0, timeout_s, what)
    task.cancel()
    task.add_done_callback(_retrieve)
    try:
        await asyncio.wait((task,), timeout=grace_s)
    except asyncio.CancelledError:
        leave_cancelled()
        raise
    if not task.done():
        logger.warning(
            "%s ignored its cancellation at its %g s deadline and is left running (it cannot be stopped "
            "from here); the sample is recorded as timeout",
            what,
            timeout_s,
        )
        if left_running is not None:
            left_running(task, True)
        raise DeadlineAbandoned(
            f"deadline of {timeout_s:g} s exceeded; {what} ignored its cancellation and was abandoned"
        )
    raise DeadlineExceeded(f"{what} took longer than its deadline of {timeout_s:g} s", timeout_s)


class DoublingWarning:
    """When to log a growing count of stuck calls: at 1, 2, 4, 8, ... (loud, not a flood), and from
    1 again once none is left. Shared by the thread pool's overdue calls and :class:`LeftRunningCalls`."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 1

    def due(self, count: int) -> bool:
        """Whether ``count`` (just grown) is the next to log; if so, the one after is twice it."""
        if count < self._next:
            return False
        self._next = count * 2
        return True

    def settled(self, count: int) -> None:
        """``count`` (just fallen): at 0, the next stuck call is logged again."""
        if count == 0:
            self._next = 1


class LeftRunningCalls:
    """Calls left running by :func:`run_with_deadline` (abandoned at their deadline, or cancelled
    with their caller and not ended yet), each keeping what was admitted for it (a concurrency slot,
    a job-wide lease) until its task really ends: a cap on calls in flight bounds the calls that
    run, not only those still awaited.

    A call that ignores its cancellation (for the whole grace: ``stuck`` when :meth:`keep` is told
    of it, else ``grace_s`` after) is counted in :attr:`stuck` until it ends, and logged (at 1, 2,
    4, 8, ... stuck calls, as the thread pool logs its overdue calls). One that never ends keeps
    its slot for ever; waiters for a slot see :attr:`holding` and give up instead of waiting for it.
    ``capacity`` and ``scope`` only word the log line (``"this worker's"``, ``"the job's"``).
    """

    def __init__(self, capacity: int, scope: str, *, grace_s: float = GRACE_S) -> None:
        self.capacity = capacity
        self.scope = scope
        self.grace_s = grace_s
        self.stuck = 0
        """Calls kept here that ignored their cancellation and still run, each holding its slot."""
        self.reported = 0
        """Such calls of the whole job, as its admission queue last reported them (``admission: job``)."""
        self._warning = DoublingWarning()
        self._releases: set[asyncio.Task[Any]] = set()

    @property
    def holding(self) -> int:
        """Stuck calls known to hold slots of this admission: these, or those reported, the more."""
        return max(self.stuck, self.reported)

    def keep(
        self, task: asyncio.Future[Any], release: Callable[[], Coroutine[Any, Any, Any]], *, stuck: bool
    ) -> None:
        """Run ``release()`` (giving back the call's slot) once ``task`` ends; count it as stuck now
        (``stuck``), or if it still runs ``grace_s`` from now."""
        loop = asyncio.get_running_loop()
        counted = False

        def count() -> None:
            nonlocal counted
            if not task.done() and not counted:
                counted = True
                self.stuck += 1
                self._warn()

        timer = None if stuck else loop.call_later(self.grace_s, count)
        if stuck:
            count()

        def ended(_task: asyncio.Future[Any]) -> None:
            if timer is not None:
                timer.cancel()
            if counted:
                self.stuck -= 1
                self._warning.settled(self.stuck)
            releasing = loop.create_task(release())
            self._releases.add(releasing)
            releasing.add_done_callback(self._released)

        task.add_done_callback(ended)

    def _released(self, releasing: asyncio.Task[Any]) -> None:
        self._releases.discard(releasing)
        error = None if releasing.cancelled() else releasing.exception()
        if error is not None:
            logger.warning("giving back the slot of a call left running failed: %s", describe_error(error))

    def _warn(self) -> None:
        if not self._warning.due(self.stuck):
            return
        logger.warning(
            "%d call(s) ignored their cancellation (at their deadline, or when their sample was "
            "cancelled) and still run, each holding its concurrency slot: %d of %s max_concurrency=%d "
            "(a running task cannot be stopped from outside); later samples wait for a free slot and "
            "become 'timeout' when none comes free in time. Fix the code that catches CancelledError.",
            self.stuck,
            self.stuck,
            self.scope,
            self.capacity,
        )


async def _timed(awaitable: Awaitable[_T], ended_at: list[float]) -> _T:
    """Await ``awaitable`` and note the loop's time when it returned: the call's own end, not when
    its waiter next ran, so a loop that is only busy (other samples' work) cannot make a result that
    came on time late."""
    try:
        return await awaitable
    finally:
        ended_at.append(asyncio.get_running_loop().time())


def _outcome_on_time(task: asyncio.Future[_T], elapsed_s: float, timeout_s: float, what: str) -> _T:
    """The finished ``task``'s result, unless it ended after its deadline (``elapsed_s``: from the
    start to the moment its coroutine returned, :func:`_timed`). That happens only when the event
    loop was blocked past the deadline (a sync call such as ``time.sleep`` in async code, this one's
    or another's that it waited on): the timer could not fire. A result after the deadline is a
    timeout, not a score.

    Raises:
        DeadlineExceeded: ``elapsed_s`` is past ``timeout_s``.
    """
    if elapsed_s <= timeout_s:
        return task.result()
    _retrieve(task)
    raise DeadlineExceeded(
        f"{what} ended {elapsed_s:.3g} s after it began, past its deadline of {timeout_s:g} s: the "
        "event loop was blocked (a blocking call, e.g. time.sleep, in async code), so its result is "
        "not used",
        timeout_s,
    )


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of a task nobody awaits any more as seen (no "never retrieved" log)."""
    if not task.cancelled():
        task.exception()
