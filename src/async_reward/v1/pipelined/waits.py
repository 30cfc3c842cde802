"""The pipelined mode's waits on TransferQueue's tags, and what bounds them: the reward deadline and a
watchdog on the agent-loop workers.

The trainer waits twice per batch, on TransferQueue's tags: for the batch to be *generated*, then for
each chunk of its groups to be *scored*. Two things can make such a wait endless:

* a judge that never answers: ``chunk_timeout_s`` bounds each wait for scores (the reward managers'
  own per-sample deadlines and bounded retries bound it too). It is a wall-clock limit sized for the
  judge, so it does not apply to generation: a long rollout is not a fault;
* a dead agent-loop worker (a Ray actor: out of memory, a lost node). Its sessions, generating or
  being scored, never write again, and verl neither restarts it nor tells the trainer. The
  :class:`AgentLoopWatchdog` detects the death itself (Ray answers a call to a dead actor with
  ``ActorDiedError``), never guesses it from elapsed time, so it needs no limit a user must size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from async_reward.v1.pipelined.batches import GroupState, InFlightBatch, read_groups
from async_reward.v1.pipelined.config import PIPELINED_MODE_PATH

__all__ = [
    "LIVENESS_CHECK_S",
    "AgentLoopWatchdog",
    "AgentLoopWorkerDied",
    "RewardWaitTimeout",
    "agent_loop_worker_name",
    "wait_for_groups",
]

#: Seconds between two liveness checks of the agent-loop workers (a death is seen within two of
#: them). Each check sends one tiny Ray call per worker, so it is done every few seconds, not at
#: every poll of TransferQueue's tags.
LIVENESS_CHECK_S = 5.0


class RewardWaitTimeout(TimeoutError):
    """``chunk_timeout_s`` passed with the groups a chunk needs still unscored."""


class AgentLoopWorkerDied(RuntimeError):
    """An agent-loop worker died while the step waited for sessions it was running."""


def agent_loop_worker_name(handle: Any, index: int) -> str:
    """``agent-loop worker <index> (Ray actor <id>)``: the id finds its logs in Ray's dashboard."""
    actor_id: Any = getattr(handle, "_actor_id", None)
    return f"agent-loop worker {index}" + (
        f" (Ray actor {actor_id.hex()})" if hasattr(actor_id, "hex") else ""
    )


class AgentLoopWatchdog:
    """Sees the death of an agent-loop worker (a Ray actor) while the trainer waits on its sessions.

    :meth:`dead` is called at every poll of a wait and does something only every ``every_s``
    seconds: it asks each worker for Ray's built-in readiness answer (``__ray_ready__``) and looks,
    without blocking, at the answers to the previous asks. A worker that answered is alive; one whose
    answer is ``ActorDiedError`` is dead (Ray marks an actor dead when its process is gone); one that
    has not answered yet (busy, or its node slow) is asked again only once it has, and is never
    declared dead for being slow. ``ActorUnavailableError`` ("may be available later") is not a death.

    Args:
        workers: The agent-loop manager's worker handles (``agent_loop_workers``).
        every_s: Seconds between two checks.
        clock: The monotonic clock (tests step it).
    """

    __slots__ = ("_asks", "_clock", "_next_check", "every_s", "workers")

    def __init__(
        self,
        workers: Sequence[Any],
        every_s: float = LIVENESS_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = list(workers)
        self.every_s = every_s
        self._clock = clock
        self._next_check = clock()
        self._asks: dict[int, Any] = {}
        """Worker index -> its unanswered ``__ray_ready__`` call."""

    def dead(self) -> tuple[str, RayActorError] | None:
        """``(worker name, Ray's error)`` of a worker found dead, or None (alive, or not checked now)."""
        now = self._clock()
        if now < self._next_check:
            return None
        self._next_check = now + self.every_s
        answered: set[Any] = set()
        if self._asks:
            refs = list(self._asks.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            answered = set(ready)
        for index, ref in list(self._asks.items()):
            if ref not in answered:
                continue
            del self._asks[index]
            try:
                ray.get(ref)
            except ActorUnavailableError:
                continue  # Ray: "may be available later" (a connection lost for a moment): ask again
            except RayActorError as error:
                return agent_loop_worker_name(self.workers[index], index), error
        for index, handle in enumerate(self.workers):
            if index not in self._asks:
                self._asks[index] = handle.__ray_ready__.remote()
        return None


def wait_for_groups(
    list_tags: Callable[[], Mapping[str, Mapping[str, Any]]],
    batch: InFlightBatch,
    done: Callable[[dict[str, GroupState]], bool],
    what: Literal["generated", "scored"],
    *,
    chunk_timeout_s: float | None,
    watchdog: AgentLoopWatchdog | None,
    pause: Callable[[], None],
    step: int,
) -> dict[str, GroupState]:
    """Read the tags (``list_tags``: one TransferQueue listing of the partition) until
    ``done(groups of batch)``, pausing between reads; return the groups as last read.

    ``chunk_timeout_s`` bounds a wait for scores only (the longest wait for one chunk of rewards, a
    limit sized for the judge). Every wait stops when ``watchdog`` finds an agent-loop worker dead.
    ``step``: the global step that waits (the batch may be the next step's).

    Raises:
        RewardWaitTimeout: ``chunk_timeout_s`` passed in a wait for scores, with the groups not scored.
        AgentLoopWorkerDied: naming the worker, what was waited for and Ray's cause.
    """
    limit = chunk_timeout_s if what == "scored" else None
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        groups = read_groups(list_tags(), batch.uids)
        if done(groups):
            return groups
        waiting = batch.unscored(groups) if what == "scored" else batch.ungenerated(groups)
        if deadline is not None and time.monotonic() > deadline:
            raise RewardWaitTimeout(
                f"the batch of step {batch.step}: {len(waiting)} of its {len(batch.sizes)} group(s) not "
                f"scored after {PIPELINED_MODE_PATH}.chunk_timeout_s={limit} (the longest wait for one "
                "chunk of rewards); raise it, or set it to null for no limit beyond the reward managers' "
                "own deadlines"
            )
        dead = watchdog.dead() if watchdog is not None else None
        if dead is not None:
            name, error = dead
            raise AgentLoopWorkerDied(
                f"step {step}: {name} died while the step waited for the batch of step {batch.step} to "
                f"be {what} ({len(waiting)} of its {len(batch.sizes)} group(s) not {what}); verl does not "
                "restart agent-loop workers, so the sessions it ran would never finish. See its Ray logs "
                "for why it died (out of memory is the usual cause), then resume the run from its last "
                f"checkpoint. Ray: {_first_line(error)}"
            ) from error
        pause()


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
