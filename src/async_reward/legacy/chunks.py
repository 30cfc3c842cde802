"""Pure group bookkeeping of the pipelined reward loop: no Ray, no threads, unit-testable.

A *group* is the set of samples sharing a group key (``uid``: one GRPO prompt and its responses).
Chunks are made of complete groups only, because group-local advantages (GRPO, RLOO) and group
post-processing (``post_process_scores``) need every member's score. Groups are numbered in the
index order of their first member; among complete, undelivered groups a chunk takes the lowest
numbers first, so with verl's usual layout (members of a group adjacent) chunks come out roughly in
batch order. Groups may have different sizes and need not be contiguous in the batch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from async_reward._core.postprocess import apply_group_postprocessing
from async_reward._core.result import extras_fill_values, neutral_value

__all__ = [
    "ChunkBook",
    "GroupLayout",
    "RewardChunk",
    "assemble_rm_scores",
    "neutral_value",
    "postprocess_groups",
    "split_groups",
    "stack_extras",
]


@dataclass(frozen=True)
class GroupLayout:
    """Which sample belongs to which group, for one submitted batch."""

    group_of: np.ndarray
    """(n,) int64: the group number of each sample. Groups are numbered by their first member's index."""
    members: tuple[np.ndarray, ...]
    """Sorted int64 sample indices of each group."""
    keys: tuple[Any, ...]
    """The group key (e.g. the ``uid``) of each group; None for a batch without keys."""

    @property
    def num_samples(self) -> int:
        return int(self.group_of.shape[0])

    @property
    def num_groups(self) -> int:
        return len(self.members)

    @classmethod
    def from_keys(cls, keys: Sequence[Any] | np.ndarray | None, num_samples: int) -> GroupLayout:
        """Group samples by key; ``keys=None`` makes every sample its own group.

        Raises:
            ValueError: ``keys`` has the wrong length or holds an unhashable value.
        """
        if keys is None:
            indices = np.arange(num_samples, dtype=np.int64)
            return cls(group_of=indices, members=tuple(indices.reshape(-1, 1)), keys=(None,) * num_samples)
        if len(keys) != num_samples:
            raise ValueError(f"group keys have length {len(keys)}, the batch has {num_samples} samples")
        numbers: dict[Any, int] = {}
        group_of = np.empty(num_samples, dtype=np.int64)
        try:
            for position, key in enumerate(keys):
                group_of[position] = numbers.setdefault(key, len(numbers))
        except TypeError as exc:  # e.g. a list or an array as a uid
            raise ValueError(f"group key values must be hashable (str or int): {exc}") from None
        order = np.argsort(group_of, kind="stable")
        bounds = np.cumsum(np.bincount(group_of, minlength=len(numbers)))[:-1]
        return cls(group_of=group_of, members=tuple(np.split(order, bounds)), keys=tuple(numbers))

    def sizes(self) -> np.ndarray:
        return np.fromiter((len(m) for m in self.members), dtype=np.int64, count=len(self.members))


def split_groups(layout: GroupLayout, parts: int, groups: Sequence[int] | None = None) -> list[np.ndarray]:
    """Deal whole groups to ``parts`` workers: consecutive runs of groups, balanced by sample count.

    Returns one array of sample indices per part, in group order (the order workers should score
    them in, so groups complete early and steadily). Parts may be empty when there are fewer groups
    than parts. ``groups`` restricts the split to those group numbers (default: all).
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    chosen = list(range(layout.num_groups)) if groups is None else list(groups)
    if not chosen:
        return [np.empty(0, dtype=np.int64) for _ in range(parts)]
    sizes = np.array([len(layout.members[g]) for g in chosen], dtype=np.int64)
    total = int(sizes.sum())
    # Group g goes to the part in which its first sample falls when the samples are cut evenly.
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    part_of = np.minimum((starts * parts) // max(total, 1), parts - 1)
    result: list[np.ndarray] = []
    for part in range(parts):
        picked = [layout.members[chosen[i]] for i in np.flatnonzero(part_of == part)]
        result.append(np.concatenate(picked) if picked else np.empty(0, dtype=np.int64))
    return result


@dataclass
class ChunkBook:
    """Per-ticket progress: which samples are scored, which groups are complete and not yet delivered."""

    layout: GroupLayout
    scored: np.ndarray = field(init=False)
    """(n,) bool: the sample's result has been recorded."""
    num_scored: int = field(init=False, default=0)
    num_delivered: int = field(init=False, default=0)
    num_ready: int = field(init=False, default=0)
    """Samples in complete groups not delivered yet."""
    _missing: np.ndarray = field(init=False)
    _ready_heap: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.scored = np.zeros(self.layout.num_samples, dtype=bool)
        self._missing = self.layout.sizes().copy()

    @property
    def num_samples(self) -> int:
        return self.layout.num_samples

    @property
    def num_pending(self) -> int:
        """Samples not scored yet."""
        return self.num_samples - self.num_scored

    @property
    def num_left(self) -> int:
        """Samples not delivered yet (scored or not)."""
        return self.num_samples - self.num_delivered

    @property
    def finished(self) -> bool:
        return self.num_delivered == self.num_samples

    def record(self, index: int) -> bool:
        """Mark sample ``index`` scored; False (and no change) when it already was."""
        if self.scored[index]:
            return False
        self.scored[index] = True
        self.num_scored += 1
        group = int(self.layout.group_of[index])
        self._missing[group] -= 1
        if self._missing[group] == 0:
            heapq.heappush(self._ready_heap, group)
            self.num_ready += len(self.layout.members[group])
        return True

    def ready_for(self, n_samples: int) -> bool:
        """Whether :meth:`take` can serve ``n_samples`` now (more than is left means "the rest")."""
        if self.finished:
            return False
        return self.num_ready >= min(n_samples, self.num_left)

    def take(self, n_samples: int) -> list[int]:
        """Deliver the fewest complete groups, lowest numbers first, holding at least ``n_samples``
        samples (all that is left when fewer are). Call only when :meth:`ready_for` is true."""
        if not self.ready_for(n_samples):
            raise RuntimeError("take() called before enough complete groups are scored")
        target = min(n_samples, self.num_left)
        groups: list[int] = []
        taken = 0
        while taken < target:
            group = heapq.heappop(self._ready_heap)
            groups.append(group)
            taken += len(self.layout.members[group])
        self.num_ready -= taken
        self.num_delivered += taken
        return sorted(groups)

    def restore(self, groups: Sequence[int]) -> None:
        """Undo a :meth:`take` whose chunk could not be built, so the groups can be taken again."""
        for group in groups:
            heapq.heappush(self._ready_heap, group)
            size = len(self.layout.members[group])
            self.num_ready += size
            self.num_delivered -= size


def stack_extras(
    infos: Sequence[dict[str, Any]], known: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Turn per-sample ``reward_extra_info`` dicts into one numpy array per key, as verl does.

    Every key any sample (or ``known``, key -> fill value) has appears for all samples; a missing
    value is the key's fill value from ``known``, else the neutral value of another sample's value.
    Key order: first appearance in ``infos``, then ``known``.
    """
    fills = extras_fill_values(infos, known)
    return {key: np.array([info.get(key, fill) for info in infos]) for key, fill in fills.items()}


def postprocess_groups(
    layout: GroupLayout, groups: Sequence[int], raw_scores: Sequence[Any]
) -> dict[int, float]:
    """Final float score per sample of ``groups``, running group post-processing once per group.

    ``raw_scores`` is indexed by sample; a :class:`~async_reward._core.result.ScoredFloat` carries whether it
    failed and which class post-processes it (plain floats pass through unchanged).
    """
    final: dict[int, float] = {}
    for group in groups:
        members = layout.members[group]
        scores = [raw_scores[i] for i in members]
        processed = apply_group_postprocessing([layout.keys[group]] * len(members), scores)
        final.update(zip(members.tolist(), processed, strict=True))
    return final


def assemble_rm_scores(
    layout_batch: TensorDict, indices: np.ndarray, scores: Sequence[float]
) -> torch.Tensor:
    """``rm_scores`` for ``batch[indices]``, laid out by verl's ``RewardManagerBase.assemble_rm_scores``.

    ``layout_batch`` holds ``responses`` and ``attention_mask`` (and ``prompts`` when present; its
    width is otherwise ``attention_mask`` minus ``responses``). Scores must be plain floats that were
    already post-processed, so nothing runs twice.
    """
    index = torch.from_numpy(np.asarray(indices, dtype=np.int64))
    responses = layout_batch["responses"][index]
    attention_mask = layout_batch["attention_mask"][index]
    prompt_width = attention_mask.shape[1] - responses.shape[1]
    # Only the prompt width is read by the layout; a view of the mask avoids copying prompts.
    prompts = attention_mask[:, :prompt_width]
    view = DataProto(
        batch=TensorDict(
            {"prompts": prompts, "responses": responses, "attention_mask": attention_mask},
            batch_size=[len(index)],
        )
    )
    return RewardManagerBase.assemble_rm_scores(view, [float(s) for s in scores])


@dataclass
class RewardChunk:
    """Scores of some complete groups of one ticket, ready to be joined to ``batch[indices]``."""

    indices: np.ndarray
    """Sorted int64 positions in the submitted batch."""
    rm_scores: torch.Tensor
    """(len(indices), response_length) float32, laid out like verl's ``assemble_rm_scores``."""
    reward_extra_info: dict[str, np.ndarray]
    """One array per key, aligned with ``indices``; the same keys for every sample."""
    statuses: np.ndarray
    """Status per sample (``ok``, ``timeout``, ``error``, ``invalid``), aligned with ``indices``."""
    remaining: int = 0
    """Samples of the ticket still undelivered after this chunk (0: this was the last chunk)."""

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def is_last(self) -> bool:
        return self.remaining == 0

    def to_data_proto(self) -> DataProto:
        """The chunk in the shape of verl's ``RewardLoopManager.compute_rm_score`` output."""
        return DataProto(
            batch=TensorDict({"rm_scores": self.rm_scores}, batch_size=[len(self)]),
            non_tensor_batch=dict(self.reward_extra_info),
            meta_info={"reward_extra_keys": list(self.reward_extra_info)},
        )
