"""``on_failure: exclude`` in training: a sample whose reward failed moves the weights as if it were absent.

The reward managers flag such a sample (``excluded`` in its reward extras, its failure ``status``
kept). Here, engine-agnostic, the schedule turns the flags into training inputs for one (mini-)batch:

* **Advantages from the scored members only.** The backend's ``compute_advantage`` runs on the
  trainable rows alone (``batch[rows]``), so no estimator ever sees an excluded sample: GRPO / RLOO
  group statistics, GAE whitening, a KL controller. Its outputs are put back in place; the other
  rows get zeros for every tensor it added.
* **A group left with fewer than two scored members trains on nothing**: a group-relative advantage
  of one sample is not defined (verl's GRPO would give it its raw score). Groups that lost no member
  are untouched, so a batch without group keys is unaffected.
* **Zero loss mask** (``response_mask``) for every row that is not trainable. verl's actor divides by
  the valid tokens of the mini-batch (token-mean) or not at all (token-sum), so such a row adds
  nothing to the loss, the gradient or the normaliser; the loss aggregations that count sequences
  are refused at start-up (``async_reward.config.checks.check_on_failure``).

A (mini-)batch with no trainable row is not updated at all (an empty update would divide by zero).
verl's actor may split what it is given into several optimizer updates (``ppo_mini_batch_size x
rollout.n`` rows each, after its own order and optional shuffle); one made only of untrained rows would
still step AdamW (momentum, weight decay). So an update gets only the untrained rows that fill its
trainable ones up to a whole number of optimizer updates (:func:`rows_for_update`): fewer rows without
a loss token than one optimizer update holds, so none is without one, whatever the order.
Tensors the advantage step adds are zero on rows that do not train, so the step's data metrics
(``critic/score/*``, ``critic/advantages/*``) count those rows as zeros; ``reward/excluded`` and
``reward/untrained`` say how many there were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from verl import DataProto

__all__ = [
    "EXCLUDED_KEY",
    "MIN_SCORED_PER_GROUP",
    "ExclusionOutcome",
    "advantage_without_excluded",
    "rows_for_update",
    "trainable_rows",
]

#: The reward extras key a manager sets on a sample to keep out of the gradient.
EXCLUDED_KEY = "excluded"
#: Fewest scored members a group that lost some needs to train at all.
MIN_SCORED_PER_GROUP = 2


def trainable_rows(excluded: np.ndarray, group_keys: np.ndarray | None = None) -> np.ndarray:
    """Which rows may train: not excluded, and not in a group left with fewer than
    :data:`MIN_SCORED_PER_GROUP` scored members (groups without exclusions always train)."""
    excluded = np.asarray(excluded, dtype=bool)
    keep = ~excluded
    if group_keys is None or not excluded.any():
        return keep
    keys = np.asarray(group_keys, dtype=object)
    for key in set(keys[excluded].tolist()):
        members = keys == key
        if int(keep[members].sum()) < MIN_SCORED_PER_GROUP:
            keep[members] = False
    return keep


def rows_for_update(keep: np.ndarray, optimizer_rows: int | None) -> np.ndarray | None:
    """The rows (indices, in order) of a (mini-)batch to hand the actor's update, or None for all.

    ``keep`` says which rows train; ``optimizer_rows`` is how many rows one of the actor's optimizer
    updates takes (verl: ``ppo_mini_batch_size x rollout.n``; None: the update call is one optimizer
    update). Every trainable row is kept, and only as many untrained rows as fill the last optimizer
    update: then fewer untrained rows than one update holds reach the actor, so none of its updates
    is made of untrained rows only, in any order, shuffle or data-parallel split.
    """
    keep = np.asarray(keep, dtype=bool)
    if optimizer_rows is None or keep.all():
        return None
    fill = -int(keep.sum()) % optimizer_rows
    untrained = np.flatnonzero(~keep)
    chosen = np.sort(np.concatenate([np.flatnonzero(keep), untrained[:fill]]))
    return None if len(chosen) == len(keep) else chosen


@dataclass(frozen=True)
class ExclusionOutcome:
    """A (mini-)batch after exclusion, ready for ``update`` (unless nothing is trainable)."""

    batch: DataProto
    """The batch with advantages (from the trainable rows only) and zero loss masks elsewhere."""
    excluded: int
    """Rows flagged ``excluded`` by the reward managers."""
    untrained: int
    """Rows given no gradient: the excluded ones plus the scored members of groups left too small."""
    keep: np.ndarray | None = None
    """Per row, whether it trains; None when every row does."""

    @property
    def trainable(self) -> bool:
        """Whether any row trains (an update of this batch would change something)."""
        return self.keep is None or bool(self.keep.any())


def advantage_without_excluded(
    batch: DataProto, compute_advantage: Callable[[DataProto], DataProto], group_key: str = "uid"
) -> ExclusionOutcome:
    """``compute_advantage(batch)``, as if the rows flagged ``excluded`` (and the members of groups
    left with fewer than two scored samples) were not in ``batch``; those rows get a zero loss mask.

    A batch without the ``excluded`` key, or with none set, goes to ``compute_advantage`` unchanged.
    """
    flags = batch.non_tensor_batch.get(EXCLUDED_KEY)
    excluded = np.zeros(len(batch), dtype=bool) if flags is None else np.asarray(flags, dtype=bool)
    if not excluded.any():
        return ExclusionOutcome(compute_advantage(batch), 0, 0)
    keep = trainable_rows(excluded, batch.non_tensor_batch.get(group_key))
    _zero_loss_mask(batch, ~keep)
    untrained = int((~keep).sum())
    if keep.any():
        rows = np.flatnonzero(keep)
        scored = compute_advantage(batch[rows])
        batch = _put_back(batch, scored, rows)
    else:
        # Nothing here trains (the update is skipped), but the batch still needs the fields the
        # advantage step adds, for the step's record and metrics: computed on the masked rows, zeroed.
        before = set(batch.batch.keys())
        batch = compute_advantage(batch)
        for key in set(batch.batch.keys()) - before:
            batch.batch[key] = batch.batch[key].new_zeros(batch.batch[key].shape)
    return ExclusionOutcome(batch, int(excluded.sum()), untrained, keep)


def _zero_loss_mask(batch: DataProto, rows: np.ndarray) -> None:
    """``response_mask`` (verl's loss mask) set to 0 on ``rows``; built from ``attention_mask`` as verl's
    ``compute_response_mask`` does when the batch has none."""
    import torch

    if "response_mask" not in batch.batch.keys():  # noqa: SIM118 (TensorDict membership needs keys())
        width = batch.batch["responses"].shape[-1]
        batch.batch["response_mask"] = batch.batch["attention_mask"][:, -width:].clone()
    mask = batch.batch["response_mask"].clone()
    mask[torch.from_numpy(rows)] = 0
    batch.batch["response_mask"] = mask


def _put_back(batch: DataProto, scored: DataProto, rows: np.ndarray) -> DataProto:
    """``batch`` with every tensor ``compute_advantage`` produced for ``rows`` written back in place;
    rows outside get zeros for tensors that are new. Non-tensor fields and meta info it added too."""
    import torch

    if len(scored) != len(rows):
        raise RuntimeError(
            f"compute_advantage returned {len(scored)} rows for {len(rows)}: an advantage step that "
            "resamples the batch (e.g. algorithm.use_pf_ppo) cannot be combined with on_failure=exclude"
        )
    index = torch.from_numpy(rows)
    known = set(batch.batch.keys())
    for key in list(scored.batch.keys()):
        values = scored.batch[key]
        if key in known and batch.batch[key].shape[1:] == values.shape[1:]:
            full = batch.batch[key].clone()
        else:
            full = torch.zeros((len(batch), *values.shape[1:]), dtype=values.dtype, device=values.device)
        full[index] = values
        batch.batch[key] = full
    for key, values in scored.non_tensor_batch.items():
        if key not in batch.non_tensor_batch:
            column = np.empty(len(batch), dtype=object)
            column[rows] = list(values)
            batch.non_tensor_batch[key] = column
    batch.meta_info.update({k: v for k, v in scored.meta_info.items() if k not in batch.meta_info})
    return batch
