"""A pipelined step with nothing to train: logged, the run goes on, and the number in a row is bounded.

A step trains nothing when every group of its batch failed (dropped: ``on_failure: raise`` through a
judge outage, generation errors) or no chunk had a loss token (``on_failure: exclude`` through the
same outage). ``exclude`` exists to ride out a short outage, so such a step is logged
(``pipeline/untrained_step`` = 1, with its ``reward/*`` metrics) and the run goes on, as verl v1's
lines with our replay buffer do, for at most ``trainer.v1.sampler.sampler_kwargs.max_untrained_skips``
such steps in a row (the same key, with the same meaning and default): then the reward service is
failing for real and the run stops, saying so.

verl's ``fit`` reads each step's batch from TransferQueue for its metrics and clears it; an empty
key list fails both (``Received an empty list as keys``). So the step hands ``fit`` one tag-only row
that marks it untrained (:func:`untrained_step_batch`), which the trainer's ``_compute_metrics`` and
``_log_rollout_data`` recognise (:func:`is_untrained_step`) and ``fit`` clears like any batch.
"""

from __future__ import annotations

import logging
from typing import Any

from transfer_queue import KVBatchMeta

from async_reward.config.v1 import MAX_UNTRAINED_SKIPS_KEY

__all__ = [
    "MAX_UNTRAINED_SKIPS_PATH",
    "UNTRAINED_STEP_TAG",
    "UntrainedSteps",
    "is_untrained_step",
    "untrained_step_batch",
    "untrained_step_markers",
]

logger = logging.getLogger(__name__)

#: The tag of the row an untrained step hands ``fit``.
UNTRAINED_STEP_TAG = "async_reward_untrained_step"
#: The bound's full name (the v1 lines' key, honoured by this mode).
MAX_UNTRAINED_SKIPS_PATH = f"trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY}"


class UntrainedSteps:
    """Steps in a row with nothing trained, bounded.

    Args:
        bound: ``max_untrained_skips``: such steps in a row the run rides out (0: it stops at the first).
    """

    __slots__ = ("bound", "in_a_row")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.in_a_row = 0

    def trained(self) -> None:
        """A step trained: the count starts again."""
        self.in_a_row = 0

    def untrained(self, step: int, failed_groups: int, groups: int, untrained_sessions: int) -> None:
        """Count a step with nothing trained; past the bound the run stops.

        Raises:
            RuntimeError: more than ``bound`` such steps in a row, naming the key and the fixes.
        """
        self.in_a_row += 1
        what = (
            f"{failed_groups} of {groups} group(s) failed, {untrained_sessions} session(s) without a "
            "loss token"
        )
        if self.in_a_row > self.bound:
            raise RuntimeError(
                f"step {step}: {self.in_a_row} steps in a row had nothing to train on (this one: {what}); "
                "the reward service is failing, see the reward/status_* and pipeline/failed_groups "
                "metrics and the failure_reason of the samples. Fix the service, raise "
                f"{MAX_UNTRAINED_SKIPS_PATH} (now {self.bound}) to wait longer, or use on_failure: fallback"
            )
        logger.warning(
            "step %d trains nothing (%s): logged as untrained (pipeline/untrained_step), %d of at most "
            "%d such steps in a row (%s)",
            step,
            what,
            self.in_a_row,
            self.bound,
            MAX_UNTRAINED_SKIPS_PATH,
        )


def untrained_step_batch(store: Any, partition_id: str, step: int) -> KVBatchMeta:
    """Write the tag-only row that marks ``step`` untrained to ``store`` (TransferQueue) and return
    it as the step's batch (``fit`` clears it after its metrics)."""
    key = f"async_reward_untrained_step_{step}"
    tag = {UNTRAINED_STEP_TAG: True, "global_steps": step}
    store.kv_put(key=key, partition_id=partition_id, tag=tag)
    return KVBatchMeta(partition_id=partition_id, keys=[key], tags=[tag])


def is_untrained_step(batch: KVBatchMeta) -> bool:
    """Whether ``batch`` is the row of an untrained step (:func:`untrained_step_batch`)."""
    return len(batch.tags) == 1 and bool(batch.tags[0].get(UNTRAINED_STEP_TAG, False))


def untrained_step_markers(listing: dict[str, Any]) -> list[str]:
    """The untrained-step rows in a partition's tag listing: a checkpoint saved during such a step
    holds its row (``fit`` saves before it clears), which a resumed run clears."""
    return [key for key, tag in listing.items() if tag.get(UNTRAINED_STEP_TAG, False)]
