"""Which reward worker scores a session: the least-loaded live one, and never a dead one again.

verl's v1 agent loop sends each session to ``random.choice`` of the reward workers
(``AgentLoopWorker._compute_score``). Those workers are plain Ray actors that are never restarted
(``RewardLoopManager._init_reward_loop_workers``): once one dies, every call to it raises
``RayActorError``, the session raises, its whole group is tagged ``failure`` and refilled, and the
random draw keeps picking the dead handle, so with two workers and five sessions a group only 3 % of
groups avoid it and the run thrashes. :class:`RewardWorkerPool` is the bookkeeping of one agent-loop
worker (one event loop, so no lock): sessions in flight per reward worker, which ones are dead, and
the choice. The agent-loop worker (``async_reward.v1.agent_loop``) makes the calls and re-scores a
session whose worker died on a live one (scoring is idempotent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from async_reward._core.result import LOST_WORKERS_KEY

__all__ = [
    "LOST_WORKERS_KEY",
    "REWARD_WORKERS_LOST",
    "RewardWorkerPool",
    "RewardWorkersLost",
    "worker_name",
]

#: The failure reason of a session that no live reward worker is left to score.
REWARD_WORKERS_LOST = "reward_workers_lost"


class RewardWorkersLost(RuntimeError):
    """Every reward worker this agent-loop worker can call is dead: nothing can score a session.

    verl does not restart its reward workers, so this does not heal: the session fails (its group is
    tagged ``failure`` by verl) and the next dispatch to this agent-loop worker raises it, which stops
    the trainer with this message. Constructible from the message alone, so it pickles through Ray.
    """

    reason = REWARD_WORKERS_LOST


def worker_name(handle: Any, index: int) -> str:
    """A reward worker's name in logs and extras: its Ray actor id (the same in every agent-loop
    worker, so the metrics count each death once), else its position in verl's list."""
    actor_id: Any = getattr(handle, "_actor_id", None)
    return actor_id.hex() if hasattr(actor_id, "hex") else f"reward_worker_{index}"


class RewardWorkerPool:
    """The reward workers of one agent-loop worker: sessions in flight on each, and the dead ones.

    Args:
        handles: verl's reward-worker handles, in verl's order.
    """

    __slots__ = ("_next", "dead", "handles", "in_flight", "names")

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)
        self.names = [worker_name(handle, i) for i, handle in enumerate(self.handles)]
        self.in_flight = [0] * len(self.handles)
        self.dead: set[int] = set()
        self._next = 0

    def live(self) -> list[int]:
        """Indices of the workers not known dead, in verl's order."""
        return [i for i in range(len(self.handles)) if i not in self.dead]

    def choose(self, group: str | None = None) -> int:
        """The live worker with the fewest of this agent-loop worker's sessions in flight; ties go
        round-robin, so sessions arriving together spread evenly. Raises :class:`RewardWorkersLost`
        when none is live.

        ``group`` (a session's ``uid``, with ``judge.mode: group``): the live worker chosen for that
        group by rendezvous hashing instead, the same in every agent-loop worker process (BLAKE2b,
        not Python's salted ``hash``), so a group's members meet in one reward worker; when a worker
        dies only its groups move, all members of each to the same next choice."""
        live = self.live()
        if not live:
            raise RewardWorkersLost(self.lost_message())
        if group is not None:
            return max(live, key=lambda i: _weight(group, i))
        count = len(self.handles)
        start, self._next = self._next, (self._next + 1) % count
        return min(live, key=lambda i: (self.in_flight[i], (i - start) % count))

    def mark_dead(self, index: int) -> bool:
        """Never choose worker ``index`` again; True when it was not known dead yet."""
        if index in self.dead:
            return False
        self.dead.add(index)
        return True

    def lost_message(self) -> str:
        """What a user reads when no worker is left: the cause, the workers, what to do."""
        return (
            f"{REWARD_WORKERS_LOST}: all {len(self.handles)} reward worker(s) of this agent-loop worker "
            f"are dead ({', '.join(self.names) or 'none given'}), so no session can be scored. verl "
            "does not restart its reward workers (RewardLoopManager); see their Ray logs for why they "
            "died (out of memory is the usual cause), then resume the run from its last checkpoint"
        )

    def is_death_of(self, error: BaseException, index: int) -> bool:
        """Whether ``error`` (raised by a call to worker ``index``) says that worker is gone.

        ``RayActorError`` (``ActorDiedError``) raised by the call itself, not ``ActorUnavailableError``
        (Ray: the actor "may be available later", e.g. a connection lost for a moment: see
        :func:`is_unavailable`);
        not a ``RayTaskError``: Ray raises the reward worker's own exceptions as one, and an actor the
        reward worker called dying (a reward-model router) reaches us as ``RayTaskError`` subclassing
        ``RayActorError`` while our worker is alive. When the error names its actor, it must be this one.
        """
        if not isinstance(error, RayActorError) or isinstance(error, RayTaskError):
            return False
        if isinstance(error, ActorUnavailableError):  # "may be available later": not a death
            return False
        actor_id = getattr(error, "actor_id", None)
        own: Any = getattr(self.handles[index], "_actor_id", None)
        return not (actor_id and hasattr(own, "hex")) or actor_id == own.hex()


def _weight(group: str, index: int) -> int:
    """Worker ``index``'s rendezvous-hashing weight for ``group``: the highest live one is chosen."""
    digest = hashlib.blake2b(f"{group}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def is_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says a reward worker cannot be reached for the moment (not that it died): the
    session is sent again after a pause, and the worker keeps its place."""
    return isinstance(error, ActorUnavailableError) and not isinstance(error, RayTaskError)


class SessionKillsRewardWorkers(RuntimeError):
    """A session whose scoring was followed by the death of a second reward worker: it is failed (its
    group is evicted and replaced, as verl does for a failed session) instead of being sent to the
    next worker. A response that kills its scorer (a verifier blown up by the policy's output, a crash
    in native code) would otherwise take down every reward worker in turn and stop the run."""

    reason = "reward_worker_killed_twice"
