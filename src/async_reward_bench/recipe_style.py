"""Recipe-style admission: batch k+1's scoring starts only once every sample of batch k is scored.

The recipe's ``RayAsyncRewardAgent`` has one proxy thread that takes a request (a whole batch) off its
pending queue, submits all of its samples, and waits for all of them before taking the next one; the
trainer meanwhile reads completed groups off a queue. :class:`SequentialRewards` reproduces exactly
that over our pipeline: one relay thread submits the held batches one at a time to the real manager
and forwards each complete group as it arrives. What it gives up is ours to measure: while batch k's
last requests drain, the service's free slots idle instead of starting batch k+1.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from async_reward._core.result import neutral_value
from async_reward.training.schedule import RewardSource

__all__ = ["SequentialRewards"]


@dataclass(eq=False)
class _Held:
    """A batch waiting for its turn, then the groups relayed from the real ticket."""

    batch: Any
    group_key: str
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """When the relay began submitting it to the inner source (``timing_s/reward_held`` ends here)."""
    inner: Any = None
    groups: deque[Any] = field(default_factory=deque)
    """The inner source's chunks, one complete group each."""
    ready: int = 0
    left: int = 0
    error: BaseException | None = None


class SequentialRewards:
    """A ``RewardSource`` that scores one batch at a time over ``inner`` (the recipe's admission)."""

    def __init__(self, inner: RewardSource) -> None:
        self.inner = inner
        self._cond = threading.Condition()
        self._pending: deque[_Held] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._relay, name="recipe-style-relay", daemon=True)
        self._thread.start()

    def submit(self, batch: Any, group_key: str = "uid") -> _Held:
        held = _Held(batch=batch, group_key=group_key, left=len(batch))
        with self._cond:
            if self._closed:
                raise RuntimeError("SequentialRewards is closed")
            self._pending.append(held)
            self._cond.notify_all()
        return held

    def get_chunk(self, ticket: _Held, n_samples: int, timeout: float | None = None) -> Any:
        """The fewest relayed groups holding at least ``n_samples`` samples (the rest, when fewer)."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: ticket.error is not None or ticket.ready >= min(n_samples, ticket.left), timeout
            ):
                raise TimeoutError(f"no chunk of {n_samples} samples within {timeout} s")
            if ticket.error is not None:
                raise ticket.error
            parts: list[Any] = []
            taken = 0
            while taken < min(n_samples, ticket.left):
                part = ticket.groups.popleft()
                parts.append(part)
                taken += len(part)
            ticket.ready -= taken
            ticket.left -= taken
            return _merge(parts, ticket.left)

    def ticket_metrics(self, ticket: _Held) -> dict[str, float]:
        metrics = dict(self.inner.ticket_metrics(ticket.inner)) if ticket.inner is not None else {}
        start = ticket.started_at if ticket.started_at is not None else time.monotonic()
        metrics["timing_s/reward_held"] = start - ticket.submitted_at
        return metrics

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _relay(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._pending))
                if self._closed:
                    return
                held = self._pending.popleft()
            try:
                # Read before the inner submit, so held + the inner submit-to-done time never
                # overstates when the batch's last reward was scored (structure.schedule_facts).
                started = time.monotonic()
                held.inner = self.inner.submit(held.batch, held.group_key)
                held.started_at = started
                remaining = len(held.batch)
                while remaining:
                    # n=1: the next complete group as soon as it is scored, like the recipe's queue.
                    group = self.inner.get_chunk(held.inner, 1)
                    remaining = int(getattr(group, "remaining", remaining - len(group.indices)))
                    with self._cond:
                        held.groups.append(group)
                        held.ready += len(group.indices)
                        self._cond.notify_all()
            except BaseException as exc:  # handed to the trainer's get_chunk, never swallowed
                with self._cond:
                    held.error = exc
                    self._cond.notify_all()


def _merge(parts: list[Any], remaining: int) -> Any:
    """The inner source's chunks as one, of their own type (the legacy manager's ``RewardChunk``, which
    this module does not import: the benchmark imports without the legacy trainer)."""
    if len(parts) == 1:
        parts[0].remaining = remaining
        return parts[0]
    indices = np.concatenate([p.indices for p in parts])
    order = np.argsort(indices, kind="stable")
    # A key first seen in a later group (e.g. ``failure_reason``) is filled with its neutral value.
    neutral = {k: neutral_value(v[0]) for p in parts for k, v in p.reward_extra_info.items() if len(v)}
    extras = {
        key: np.concatenate(
            [p.reward_extra_info.get(key, np.full(len(p.indices), default, dtype=object)) for p in parts]
        )[order]
        for key, default in neutral.items()
    }
    return type(parts[0])(
        indices=indices[order],
        rm_scores=torch.cat([p.rm_scores for p in parts])[torch.from_numpy(order)],
        reward_extra_info=extras,
        statuses=np.concatenate([p.statuses for p in parts])[order],
        remaining=remaining,
    )
