"""Where each group of a batch in flight stands, read from TransferQueue's tags (pure bookkeeping).

Under the pipelined mode (:mod:`async_reward.v1.pipelined.agent_loop`) a session's trajectory is in
TransferQueue as soon as it is generated, and its prompt is tagged ``finished`` / ``failure`` once
every session is scored. So from one tag listing (``tq.kv_list``) the trainer knows, per group:

* **generated**: every session's trajectory is written (or the group already ended);
* **scored**: the prompt tag is terminal, ``finished`` (every session scored) or ``failure`` (a
  session raised: ``on_failure: raise``, or a generation error);

and :class:`InFlightBatch` hands out scored groups in the order they finished, each exactly once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GroupState",
    "InFlightBatch",
    "UnpreparedTrajectory",
    "check_prepared",
    "read_groups",
    "session_of",
]

TERMINAL = ("finished", "failure")


def session_of(key: str) -> tuple[str, str] | None:
    """``(uid, session)`` of a trajectory key ``{uid}_{session}_{index}``; None for any other key."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], parts[1]


@dataclass
class GroupState:
    """One group (prompt ``uid``) as the latest tag listing shows it."""

    status: str | None
    """The prompt tag's status (``pending``, ``running``, ``finished``, ``failure``), None if absent."""
    sessions: set[str] = field(default_factory=set)
    """Sessions whose trajectories are written (their tags set: TransferQueue can list a key before
    the tags of its write, and verl's tags carry the ``seq_len`` that balancing reads)."""
    keys: list[str] = field(default_factory=list)
    """Its trajectory keys."""
    tags: list[dict[str, Any]] = field(default_factory=list)
    """Their tags, aligned with ``keys``."""

    @property
    def scored(self) -> bool:
        return self.status in TERMINAL

    @property
    def failed(self) -> bool:
        return self.status == "failure"

    def generated(self, size: int) -> bool:
        """All ``size`` sessions are written, or the group has already ended (its tag is terminal)."""
        return self.scored or len(self.sessions) >= size


def read_groups(listing: Mapping[str, Mapping[str, Any]], uids: set[str]) -> dict[str, GroupState]:
    """The state of each group in ``uids`` from one ``tq.kv_list(partition)[partition]`` listing."""
    groups = {uid: GroupState(status=None) for uid in uids}
    for key, tag in listing.items():
        if key in groups:
            groups[key].status = str(tag.get("status")) if tag.get("is_prompt", False) else None
            continue
        parsed = session_of(key)
        if parsed is None or parsed[0] not in groups or "seq_len" not in tag:
            continue  # not ours, or listed before verl's write has set its tags
        state = groups[parsed[0]]
        state.sessions.add(parsed[1])
        state.keys.append(key)
        state.tags.append(dict(tag))
    return groups


@dataclass
class InFlightBatch:
    """A training batch submitted for generation and not yet trained on.

    Args:
        step: The global step whose batch it is.
        version: The policy version that generates it (updates made before its submission).
        sizes: Sessions each group (``uid``) will run: ``rollout.n`` or the prompt's ``__rollout_n__``.
    """

    step: int
    version: int
    sizes: dict[str, int]
    handed_out: list[str] = field(default_factory=list)
    """Scored groups handed out, in the order they finished."""
    failed: list[str] = field(default_factory=list)
    """Groups that ended in ``failure``, dropped."""

    @property
    def uids(self) -> set[str]:
        return set(self.sizes)

    def generated(self, groups: Mapping[str, GroupState]) -> bool:
        """Every group has all its sessions written, or has already ended."""
        return all(groups[uid].generated(size) for uid, size in self.sizes.items())

    def ungenerated(self, groups: Mapping[str, GroupState]) -> list[str]:
        """Groups with a session still to write (and not ended): what a wait for generation waits on."""
        return sorted(uid for uid, size in self.sizes.items() if not groups[uid].generated(size))

    def unscored(self, groups: Mapping[str, GroupState]) -> list[str]:
        """Groups whose prompt tag is not terminal yet: what a wait for scores waits on."""
        return sorted(uid for uid in self.sizes if not groups[uid].scored)

    def take_scored(self, groups: Mapping[str, GroupState]) -> tuple[list[str], list[str]]:
        """Groups newly scored since the last call: ``(finished, failed)``, each handed out once."""
        seen = set(self.handed_out) | set(self.failed)
        finished = sorted(uid for uid in self.sizes if uid not in seen and groups[uid].status == "finished")
        failed = sorted(uid for uid in self.sizes if uid not in seen and groups[uid].failed)
        self.handed_out.extend(finished)
        self.failed.extend(failed)
        return finished, failed

    @property
    def settled(self) -> bool:
        """Every group has been handed out or dropped."""
        return len(self.handed_out) + len(self.failed) == len(self.sizes)


class UnpreparedTrajectory(RuntimeError):
    """A trajectory of a group about to be trained that the step never computed old log-probs for."""


def check_prepared(keys: Iterable[str], prepared: Collection[str], step: int) -> None:
    """Refuse to train a trajectory key that was not in the batch whose old log-probs were computed.

    The step computes old (and reference) log-probs once, on the batch as the listing showed it when
    every session was written (:meth:`InFlightBatch.generated`); the chunks it trains are read from
    later listings. With verl's agent loop and TransferQueue the two cannot differ: a session's
    outputs (``{uid}_{session}_{index}``) are written in one ``kv_batch_put``, whose tags reach the
    controller in one request, handled on the one thread that also answers ``kv_list``, and a session
    counts as written only once its keys carry their tags (:func:`read_groups`). A worker of one's
    own that writes a session's outputs in several puts could break that; verl would then train
    those rows against log-probs never computed. So it is checked, and fails loudly.

    Raises:
        UnpreparedTrajectory: naming the keys.
    """
    late = sorted(key for key in keys if key not in prepared)
    if late:
        raise UnpreparedTrajectory(
            f"the batch of step {step}: trajectory key(s) {late[:4]}{' ...' if len(late) > 4 else ''} "
            "appeared in TransferQueue after their sessions counted as written, so no old log-probs "
            "were computed for them. An agent-loop worker writes a session's outputs in more than one "
            "put; write them in one kv_batch_put (as verl's AgentLoopWorkerTQ does)"
        )
