"""When the next step's batch is chosen at ``max_staleness`` >= 2: ahead, or in its own rollout.

Choosing the batch of step k+1 at the end of step k's rollout (*ahead*) lets its rewards be scored
while step k trains: it pays when the judge is slow or busy, where scoring a batch takes about a
step. It costs a rollout: at the same staleness limit a group must be generated one rollout sooner,
so with a long-tailed generation the slowest groups make the step wait for them. Choosing the batch
at the end of its own rollout (as verl's ``colocate_async`` does) gives the generation that rollout,
and costs whatever scoring of the groups generated last is still running when training needs it.

So the mode measures, each step, whether the judge caught up: every group generated and not yet
scored when the rollout ended is scored by the time the prepare stage (old and reference
log-probs, which need no score) has ended. If it did, choosing a batch at the end of its own
rollout costs no wait for scores, and the next batch is chosen then; if not (the judge is busy, or
slow against the prepare stage), it is chosen ahead. Nothing to tune: a measured fact per step,
decided again every step (``pipeline/judge_caught_up``, ``pipeline/next_batch_chosen_ahead``).

Pure bookkeeping, no TransferQueue: the trainer feeds it group states read from tag listings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from async_reward.v1.pipelined.batches import GroupState

__all__ = ["JudgeCatchUp"]


@dataclass
class JudgeCatchUp:
    """Whether the judge scored, by the end of a step's prepare stage, what its rollout left unscored."""

    backlog: frozenset[str] = field(default_factory=frozenset)
    """Groups generated and not yet scored when the last rollout ended."""
    caught_up: bool | None = None
    """The last measurement; None before the first prepare stage has ended."""

    def rollout_ended(self, groups: Mapping[str, GroupState], sizes: Mapping[str, int]) -> int:
        """Note the groups of ``sizes`` (uid -> sessions) that are generated and not scored; their count."""
        self.backlog = frozenset(
            uid for uid, size in sizes.items() if groups[uid].generated(size) and not groups[uid].scored
        )
        return len(self.backlog)

    def prepare_ended(self, groups: Mapping[str, GroupState]) -> bool:
        """Measure: every group of the backlog is scored (ended) in ``groups``, a listing read now."""
        self.caught_up = all(groups[uid].scored for uid in self.backlog)
        return self.caught_up

    def choose_in_own_rollout(self) -> bool:
        """Choose the next batch at the end of its own rollout: the judge caught up last step."""
        return bool(self.caught_up)
