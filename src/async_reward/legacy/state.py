"""Driver-side state of one submitted batch (a ticket): results, progress and metrics.

Mutated only under the manager's lock; kept apart from the threading and Ray plumbing so the
metrics and result recording read as plain bookkeeping.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from verl import DataProto

from async_reward._core.result import ScoredFloat, Status
from async_reward.judge.cost import add_cost, cost_metrics
from async_reward.legacy.chunks import ChunkBook, GroupLayout, neutral_value
from async_reward.training.metrics import sample_retries, status_metrics

__all__ = ["RewardChunkTimeout", "Ticket", "TicketError", "TicketState"]


@dataclass(frozen=True)
class Ticket:
    """Handle of one submitted batch; pass it to ``get_chunk`` and ``ticket_metrics``."""

    seq: int
    """Submission number within its manager (1, 2, ...): lower numbers get scoring slots first."""
    num_samples: int
    """Samples in the submitted batch."""
    manager_id: str = field(repr=False)
    """Identifies the manager that issued it, so a ticket of another manager is refused."""


class RewardChunkTimeout(TimeoutError):
    """``get_chunk`` gave up waiting; the ticket is still valid and a later call may succeed."""

    def __init__(self, ticket: Ticket, n_samples: int, timeout: float, pending: int, ready: int) -> None:
        super().__init__(
            f"ticket {ticket.seq}: no chunk of {n_samples} samples within {timeout:.3g} s; "
            f"{pending} of {ticket.num_samples} samples still pending, {ready} ready in complete groups"
        )
        self.ticket, self.pending, self.ready = ticket, pending, ready


class TicketError(ValueError):
    """A ticket a manager cannot serve: unknown, of another manager, finished or cancelled."""


@dataclass(eq=False)
class TicketState:
    """Everything the driver knows about one ticket."""

    ticket: Ticket
    layout: GroupLayout
    data: DataProto | None
    """The shipped part of the batch (``responses``, ``attention_mask``, ``prompts``, non-tensors);
    kept until the ticket finishes so a dead worker's samples can be re-sent."""
    ranks: np.ndarray
    """Scoring order of each sample within the ticket (group-major)."""
    fallback_score: float
    exclude_failures: bool = False
    """``on_failure: exclude``: a sample no worker could score is flagged ``excluded`` too."""
    book: ChunkBook = field(init=False)
    scores: list[Any] = field(init=False)
    extras: list[dict[str, Any] | None] = field(init=False)
    run_s: np.ndarray = field(init=False)
    known_extras: dict[str, Any] = field(default_factory=dict)
    status_counts: Counter[str] = field(default_factory=Counter)
    excluded: int = 0
    """Samples flagged ``excluded`` (``on_failure: exclude``): the trainer gives them no gradient."""
    retries: int = 0
    cost: dict[str, float] = field(default_factory=lambda: cost_metrics([]))
    """What scoring this ticket's samples cost so far (``reward/cost/*``, summed as results arrive:
    the per-sample extras are released once delivered)."""
    postprocess_spec: tuple[str, ...] | None = None
    error: str | None = None
    """First sample whose ``run_single`` raised (e.g. ``on_failure: raise``): get_chunk raises it."""
    submitted_at: float = field(default_factory=time.monotonic)
    done_at: float | None = None
    blocked_s: float = 0.0

    def __post_init__(self) -> None:
        n = self.layout.num_samples
        self.book = ChunkBook(self.layout)
        self.scores = [None] * n
        self.extras = [None] * n
        self.run_s = np.full(n, math.nan)

    def record(self, index: int, payload: dict[str, Any]) -> bool:
        """Store one worker result; False when the sample already had one (a re-sent duplicate)."""
        if not self.book.record(index):
            return False
        if "error" in payload:
            self.error = self.error or f"sample {index}: {payload['error']}"
            payload = self.failure_payload(f"run_single raised: {payload['error']}", payload.get("run_s"))
        score = payload["reward_score"]
        info = payload.get("reward_extra_info") or {}
        self.scores[index] = score
        self.extras[index] = info
        run_s = payload.get("run_s")
        if run_s is not None:
            self.run_s[index] = float(run_s)
        self.status_counts[str(info.get("status", Status.OK.value))] += 1
        self.excluded += info.get("excluded") is True
        self.retries += sample_retries(info)
        add_cost(self.cost, info)
        for key, value in info.items():
            if key not in self.known_extras:
                # A sample without a status comes from a manager that reports none: it scored fine.
                self.known_extras[key] = Status.OK.value if key == "status" else neutral_value(value)
        spec = getattr(score, "postprocess_spec", None)
        if spec is not None and self.postprocess_spec is None:
            self.postprocess_spec = spec
        if self.book.num_pending == 0:
            self.done_at = time.monotonic()
        return True

    def failure_payload(self, reason: str, run_s: float | None = None) -> dict[str, Any]:
        """A result for a sample no worker could score: the fallback score with status ``error``.

        The score is flagged as failed and carries the ticket's post-processor (when any sample showed
        one), so group post-processing (e.g. group-mean imputation) treats it like any failure.
        """
        return {
            "reward_score": ScoredFloat(
                self.fallback_score, failed=True, postprocess_spec=self.postprocess_spec
            ),
            "reward_extra_info": {
                "status": Status.ERROR.value,
                "latency_s": 0.0,
                "attempts": 0,
                "failure_reason": reason[:256],
                "excluded": self.exclude_failures,
            },
            "run_s": run_s,
        }

    def release(self) -> None:
        """Drop the per-sample data once every sample is delivered; metrics stay available."""
        self.data = None
        self.scores = []
        self.extras = []

    def metrics(self, in_flight: int) -> dict[str, float]:
        """verl-style metrics of this ticket (see ``PipelinedRewardLoopManager.ticket_metrics``)."""
        end = self.done_at if self.done_at is not None else time.monotonic()
        metrics = {
            "timing_s/reward_submit_to_done": end - self.submitted_at,
            "timing_s/reward_blocked": self.blocked_s,
            **status_metrics(self.status_counts, self.run_s, self.retries, self.excluded),
            **self.cost,
        }
        pending = self.book.num_pending
        in_flight = min(in_flight, pending)
        metrics["reward/in_flight"] = float(in_flight)
        metrics["reward/queued"] = float(pending - in_flight)
        return metrics
