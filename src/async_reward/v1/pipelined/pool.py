"""The groups dispatched and not yet in a step's batch, and the rule that picks the next batch from them.

At ``trainer.v1.pipelined.max_staleness`` s >= 2 the mode keeps the batches of the next s steps
generating together, and a step's batch is no longer one dispatched batch: it is the first
``train_batch_size`` groups to be *generated*, oldest dispatch first, across every batch in flight (verl's
``colocate_async`` takes groups across batches in the same way, but only once they are scored). So a
long-tailed rollout's slowest groups do not hold the step back: they are trained a step later,
generated further during the next step's rollout (partial rollout), while the groups that finished
early from the next dispatch take their place. The staleness limit is kept by force: a group that
could otherwise not be trained within ``max_staleness`` versions of the policy that started it (a
batch holds ``train_batch_size`` groups, earliest deadline first) is in the next batch, and the step
waits for it.

Pure bookkeeping (no TransferQueue, no Ray): :class:`GroupPool` is fed each dispatch and a tag
listing's :class:`~async_reward.v1.pipelined.batches.GroupState`, and hands out
:class:`~async_reward.v1.pipelined.batches.InFlightBatch` objects that the trainer trains as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from async_reward.v1.pipelined.batches import GroupState, InFlightBatch

__all__ = ["GroupPool", "PooledGroup"]


@dataclass(frozen=True)
class PooledGroup:
    """A dispatched group (prompt ``uid``) not yet in a step's batch."""

    size: int
    """Sessions it runs (``rollout.n`` or the prompt's ``__rollout_n__``)."""
    version: int
    """The policy version that started generating it (updates made before its dispatch)."""
    order: int
    """Its dispatch's number, counting from 0: lower is older."""


class GroupPool:
    """Groups dispatched for generation and not yet chosen for a step, oldest dispatch first."""

    def __init__(self) -> None:
        self._groups: dict[str, PooledGroup] = {}
        self._dispatches = 0

    def __len__(self) -> int:
        return len(self._groups)

    def __bool__(self) -> bool:
        return bool(self._groups)

    def add(self, sizes: Mapping[str, int], version: int) -> None:
        """One dispatch: its groups with their session counts, started by policy ``version``."""
        order = self._dispatches
        self._dispatches += 1
        for uid, size in sizes.items():
            if uid in self._groups:
                raise ValueError(f"group {uid} is dispatched twice")
            self._groups[uid] = PooledGroup(size=int(size), version=int(version), order=order)

    @property
    def sizes(self) -> dict[str, int]:
        """Each pooled group's session count, by ``uid``."""
        return {uid: group.size for uid, group in self._groups.items()}

    def watched(self, step: int) -> InFlightBatch:
        """All pooled groups as one batch, to read their states from a tag listing."""
        version = min((group.version for group in self._groups.values()), default=step - 1)
        return InFlightBatch(step=step, version=version, sizes=self.sizes)

    def choose(
        self,
        groups: Mapping[str, GroupState],
        train_step: int,
        size: int,
        max_staleness: int,
    ) -> list[str] | None:
        """The groups of the batch trained at ``train_step``, or None while it cannot be formed yet.

        A group started by policy version v must be trained by step v + 1 + ``max_staleness``. Of the
        groups due by each later step t', at most ``size`` per step from the next one to t' can wait,
        so at least the rest are taken now, generated ones first (earliest deadline, then oldest
        dispatch); the batch waits while too few of them have ended generating (every session
        written, or the prompt tag terminal). It is then filled up to ``size`` with the other
        generated groups, oldest dispatch first, once ``size`` have ended (or every pooled group: a
        pool smaller than ``size``, the last step's). So a generated group is never left for a later
        step while a group of a newer dispatch is taken.
        """
        ranked = sorted(self._groups, key=self._rank)  # by deadline: versions grow with dispatches
        ended = {uid for uid in ranked if groups[uid].generated(self._groups[uid].size)}
        if len(ended) < min(size, len(ranked)):
            return None
        chosen: list[str] = []
        deadlines = [self._deadline(uid, max_staleness) for uid in ranked]
        for index, deadline in enumerate(deadlines):  # ranked by deadline: index + 1 due by this one's
            last_of_deadline = index + 1 == len(ranked) or deadlines[index + 1] > deadline
            if not last_of_deadline:
                continue
            need = index + 1 - max(0, deadline - train_step) * size
            taken = set(chosen)
            prefix = [other for other in ranked[: index + 1] if other in ended and other not in taken]
            if len(chosen) + len(prefix) < need:
                return None  # a group that cannot wait is still generating
            chosen.extend(prefix[: max(0, need - len(chosen))])
        taken = set(chosen)
        rest = [uid for uid in ranked if uid in ended and uid not in taken]
        chosen.extend(rest[: max(0, size - len(chosen))])
        return sorted(chosen, key=self._rank)

    def _rank(self, uid: str) -> tuple[int, int, str]:
        group = self._groups[uid]
        return (group.version, group.order, uid)

    def _deadline(self, uid: str, max_staleness: int) -> int:
        """The last step that may train the group: its version + 1 + ``max_staleness``."""
        return self._groups[uid].version + 1 + max_staleness

    def take(self, uids: list[str], step: int) -> InFlightBatch:
        """Remove ``uids`` from the pool: the batch trained at ``step``, versioned by its oldest group."""
        taken = [self._groups.pop(uid) for uid in uids]
        return InFlightBatch(
            step=step,
            version=min((group.version for group in taken), default=step - 1),
            sizes={uid: group.size for uid, group in zip(uids, taken, strict=True)},
        )

    def generated_share(self, groups: Mapping[str, GroupState], size: int) -> float:
        """How far the next batch is gathered: pooled groups that have ended generating, over ``size``."""
        ended = sum(groups[uid].generated(group.size) for uid, group in self._groups.items())
        return min(1.0, ended / size) if size else 1.0
