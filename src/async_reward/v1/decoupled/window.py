"""The decoupled mode's bookkeeping, free of Ray and verl: the window read from prompt tags, how many
prompts to dispatch, and the prompt ledger.

Every prompt group verl dispatches has a prompt key in TransferQueue's ``train`` partition whose tag
verl writes (``status``: pending, running, finished, failure; ``global_steps``: the dispatch step)
and our agent-loop worker adds to (:mod:`async_reward.v1.decoupled.agent_loop`):

* ``gen_done`` / ``gen_n``: sessions that left generation (generated or failed there) / all of them;
* ``unscored``: sessions generated and not yet scored (the group's share of the reward backlog);
* ``gen_version``: the oldest policy version that generated a token of the group;
* ``failure_reason``: why the group failed (``generation_error``, ``reward_error``).

One listing of those tags gives the whole pipeline's state (:class:`WindowState`), from which the
trainer decides how many prompts to dispatch (:func:`top_up_count`) and the sampler which groups at
their staleness limit a sample waits for (:func:`groups_to_wait_for`). The :class:`PromptLedger`
accounts every dispatched prompt exactly once: trained, evicted with a reason, or still in flight, and
reconciles that against the prompt keys TransferQueue lists.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from async_reward.v1.decoupled.config import DecoupledWindows

__all__ = [
    "EVICTION_REASONS",
    "LedgerReport",
    "PromptLedger",
    "WindowState",
    "dispatch_blocker",
    "groups_to_wait_for",
    "reward_room",
    "top_up_count",
]

logger = logging.getLogger(__name__)

#: Reasons a dispatched group can leave without being trained (``ledger/evicted/<reason>``).
EVICTION_REASONS = ("stale", "dapo", "generation_error", "reward_error", "failure", "untrained")


@dataclass(frozen=True)
class WindowState:
    """The pipeline at one listing of the prompt tags."""

    generating: int
    """Groups pending or with a session still generating: the generation window's occupancy."""
    backlog: int
    """Sessions generated and not yet scored (the reward backlog)."""
    pending_groups: int
    """Groups with a session generated and not yet terminal (waiting for scores)."""
    sampleable: int
    """Groups terminal (finished or failed) and not yet sampled or evicted."""
    in_flight: frozenset[str]
    """Every prompt key in the partition: dispatched and not yet sampled or evicted."""

    @property
    def outstanding(self) -> int:
        return len(self.in_flight)

    @classmethod
    def from_tags(cls, tags: Mapping[str, Mapping[str, Any]]) -> WindowState:
        """From one ``tq.kv_list`` of a partition (prompt keys and trajectory keys mixed)."""
        generating = backlog = pending = sampleable = 0
        uids = []
        for key, tag in tags.items():
            if not tag.get("is_prompt", False):
                continue
            uids.append(key)
            status = tag.get("status")
            if status in ("finished", "failure"):
                sampleable += 1
                continue
            done, size = int(tag.get("gen_done") or 0), tag.get("gen_n")
            if status == "pending" or size is None or done < int(size):
                generating += 1
            unscored = int(tag.get("unscored") or 0)
            backlog += unscored
            if done > 0:
                pending += 1
        return cls(generating, backlog, pending, sampleable, frozenset(uids))


def dispatch_blocker(state: WindowState, windows: DecoupledWindows) -> str | None:
    """Why no prompt may be dispatched now (the ``decoupled/<reason>_s`` timer charged), or None.

    * ``window_full``: G groups generating.
    * ``backpressure``: the reward pipeline at its bound: no group's sessions fit in ``R + G x n``
      beside the backlog and the groups generating (:func:`reward_room`; dispatch pauses, nothing is
      dropped).
    * ``sampleable_full``: S scored groups wait for the trainer and more are on their way (groups
      generating or scoring). With none on their way the window refills, so a sampler that needs
      more than S groups for one sample never waits for ever.
    * ``outstanding_full``: H groups dispatched and not yet trained (the staleness bound).
    """
    if state.generating >= windows.generation_window:
        return "window_full"
    if reward_room(state, windows) <= 0:
        return "backpressure"
    if state.sampleable >= windows.sampleable_buffer and (state.generating or state.pending_groups):
        return "sampleable_full"
    if state.outstanding >= windows.outstanding_cap:
        return "outstanding_full"
    return None


def reward_room(state: WindowState, windows: DecoupledWindows) -> int:
    """Groups that may still enter the reward pipeline: its bound is ``R + G x n`` sessions, the
    backlog plus the sessions of the groups generating (``n`` each, at most), so
    ``floor((R + G x n - backlog) / n) - generating``.

    While the backlog is at most R this is at least the window's free places (dispatch is as the
    window allows); above R each ``n`` sessions of backlog take one group's place, so dispatch follows
    the judge: a group goes out as the judge finishes a group's worth of sessions. A hard stop at R
    (the rule before) let the backlog swing between R and ``R + G x n``: the rollout idle while it
    drained, then the whole window at once, and a judge faster than one generation starved at the
    bottom of each swing (balanced regime: service busy 93-95 %, steps alternating between about
    2.5x and 1x the bound in the reward-bound one).
    """
    n = windows.rollout_n
    return (windows.reward_backlog + windows.generation_window * n - state.backlog) // n - state.generating


def top_up_count(state: WindowState, windows: DecoupledWindows) -> int:
    """Prompts to dispatch now: fill the generation window, as far as :func:`reward_room` and the
    outstanding cap allow, unless :func:`dispatch_blocker` says why not.

    Counting the sessions still generating against R alone capped the rollout at ``reward_backlog``
    sessions (steps at 1.2-2.1x their bound in the five regimes of ``docs/benchmarks.md``), and capping
    each top-up by ``ceil((R - backlog) / n)`` made the reward-bound regime slower; the bound of the
    reward pipeline is ``R + G x n`` (the backlog never exceeds it).
    """
    if dispatch_blocker(state, windows) is not None:
        return 0
    free = windows.generation_window - state.generating
    room = windows.outstanding_cap - state.outstanding
    return max(0, min(free, room, reward_room(state, windows)))


def groups_to_wait_for(
    awaiting_judge: Iterable[str],
    sampleable: Iterable[str],
    spans: Mapping[str, int],
    threshold: int,
    sample_size: int,
    slots_left: int,
) -> list[str]:
    """The groups at their staleness limit that a sample must wait for, or ``[]`` to sample now.

    A group's *span* is verl's ``global_steps - entry + 1``; at ``span == threshold`` the current step
    is its last: not trained in it, it is evicted ``stale`` at the next. ``awaiting_judge`` are the
    groups generated (every session), not failed, and not yet scored; ``sampleable`` the scored ones.
    The sample takes ``sample_size`` groups oldest first (so the scored groups at their limit first)
    and leaves ``slots_left - sample_size`` places in this step. It must wait while the groups at their
    limit that would be left after it (those awaiting the judge, and the scored ones it cannot take)
    outnumber those places: verl's dropless ``wait`` rule, narrowed to groups that only wait for the
    judge and to the step's last places, so a step trains younger groups while the slow one finishes
    and waits only when it must.

    When the groups at their limit outnumber the places left even after every one is scored, waiting
    saves as many as fit and the rest are evicted ``stale``: the bound's limit (see
    :mod:`async_reward.v1.decoupled.config`).
    """
    waiting = sorted(uid for uid in awaiting_judge if spans.get(uid) == threshold)
    if not waiting:
        return []
    ready = sum(1 for uid in sampleable if spans.get(uid) == threshold)
    left_after = len(waiting) + max(0, ready - sample_size)
    return waiting if left_after > max(0, slots_left - sample_size) else []


@dataclass
class LedgerReport:
    """One reconciliation of the ledger with the prompt keys TransferQueue lists."""

    unaccounted: list[str] = field(default_factory=list)
    """Dispatched prompts neither trained, evicted nor listed by TransferQueue: lost."""
    unknown: list[str] = field(default_factory=list)
    """Prompts TransferQueue lists that the ledger never saw dispatched."""
    double_counted: list[str] = field(default_factory=list)
    """Prompts settled (trained or evicted) twice, or settled without being open."""
    listed: int = 0
    """Prompt keys TransferQueue listed (in flight: dispatched, not yet sampled or evicted)."""

    @property
    def ok(self) -> bool:
        return not (self.unaccounted or self.unknown or self.double_counted)

    def describe(self) -> str:
        parts = []
        for name in ("unaccounted", "unknown", "double_counted"):
            values = getattr(self, name)
            if values:
                parts.append(f"{len(values)} {name} (e.g. {sorted(values)[:3]})")
        return "; ".join(parts) or "balanced"


class PromptLedger:
    """Every dispatched prompt accounted once, reconciled against TransferQueue at each step's end.

    A prompt is *open* from its dispatch until it is settled: evicted (with a reason) by the sampler,
    or sampled into a training batch and then, at the step's end, trained (its uid is in the batch
    handed to the actor) or evicted ``untrained`` (dropped after sampling: every session excluded).
    Counts are kept, not the settled uids, so memory does not grow with the run.

    :meth:`check` compares the open prompts with the prompt keys TransferQueue lists (a sampled or
    evicted group's key is cleared; a dispatched one's is there until then): an open prompt it does
    not list is *lost* (closed, counted once), a listed prompt never dispatched is *unknown* (adopted,
    counted once), and a settlement of a prompt not open is *double counted*. :meth:`balanced` holds
    only while none of the three ever happened and the counts agree with TransferQueue:
    ``dispatched + carried over == trained + evicted + listed (+ sampled, not yet trained)``, where
    ``listed`` is TransferQueue's count at the last check, not the ledger's own.
    """

    def __init__(self) -> None:
        self._open: dict[str, str] = {}
        self._order: dict[str, int] = {}
        self._dispatches = 0
        self._sampled: set[str] = set()
        self._double: list[str] = []
        self._listed = 0
        self.refill_credit = 0
        """Groups evicted whose replacement the window has not dispatched yet."""
        self.counts: Counter[str] = Counter()

    def dispatched(self, uids: Iterable[str], reason: str) -> None:
        """New prompts sent to generation (``reason``: ``window`` or ``refill``)."""
        for uid in uids:
            if uid in self._open:
                self._double.append(uid)
                continue
            self._open[uid] = reason
            self._order[uid] = self._dispatches
            self._dispatches += 1
            self.counts[f"dispatched/{reason}"] += 1
            self.counts["dispatched"] += 1

    def carried_over(self, uids: Iterable[str]) -> None:
        """Prompts found in flight at start (restored from a checkpoint): open, not new dispatches."""
        for uid in uids:
            if uid not in self._open:
                self._open[uid] = "carried_over"
                self._order[uid] = self._dispatches
                self._dispatches += 1
                self.counts["carried_over"] += 1

    def dispatch_order(self, uid: str) -> int:
        """Position of an open prompt among all dispatches (the sampler's tie-break: first in, first
        trained among groups of one policy version); unknown prompts come last."""
        return self._order.get(uid, self._dispatches)

    def take_refills(self, count: int) -> int:
        """Of ``count`` prompts about to be dispatched, how many replace evicted ones."""
        refills = min(count, self.refill_credit)
        self.refill_credit -= refills
        return refills

    def evicted(self, uid: str, reason: str) -> None:
        """A group cleared without training (``reason`` in :data:`EVICTION_REASONS`)."""
        self._order.pop(uid, None)
        if self._open.pop(uid, None) is None:
            self._double.append(uid)
            return
        self.counts[f"evicted/{reason}"] += 1
        self.counts["evicted"] += 1

    def sampled(self, uids: Iterable[str]) -> None:
        """Groups handed out for training (their prompt keys leave TransferQueue)."""
        for uid in uids:
            self._order.pop(uid, None)
            if self._open.pop(uid, None) is None or uid in self._sampled:
                self._double.append(uid)
            else:
                self._sampled.add(uid)

    def step_trained(self, trained_uids: Iterable[str]) -> None:
        """The step's batch went to the actor: its uids are trained; the rest sampled this step were
        dropped after sampling (every session without a loss token) and count as ``untrained``."""
        trained = set(trained_uids)
        for uid in trained - self._sampled:
            self._double.append(uid)
        for uid in self._sampled:
            if uid in trained:
                self.counts["trained"] += 1
            else:
                self.counts["evicted/untrained"] += 1
                self.counts["evicted"] += 1
        self._sampled.clear()

    def check(self, in_flight: Iterable[str]) -> LedgerReport:
        """Reconcile the open prompts with ``in_flight``, the prompt keys TransferQueue lists: lost
        ones are closed (counted once), unknown ones adopted (counted once, then accounted like any
        other), double counts reported; see the class docstring."""
        present = set(in_flight)
        report = LedgerReport(
            unaccounted=sorted(set(self._open) - present),
            unknown=sorted(present - set(self._open)),
            double_counted=sorted(self._double),
            listed=len(present),
        )
        for uid in report.unaccounted:
            del self._open[uid]
            self._order.pop(uid, None)
        for uid in report.unknown:
            self._open[uid] = "unknown"
            self._order[uid] = self._dispatches
            self._dispatches += 1
        self._listed = len(present)
        self.counts["lost"] += len(report.unaccounted)
        self.counts["unknown"] += len(report.unknown)
        self.counts["double_counted"] += len(report.double_counted)
        self._double.clear()
        return report

    @property
    def in_flight(self) -> int:
        """Prompts in flight as TransferQueue listed them at the last check, plus those sampled and
        not yet trained (their keys already left TransferQueue)."""
        return self._listed + len(self._sampled)

    def metrics(self, report: LedgerReport) -> dict[str, float]:
        """``ledger/*``: cumulative counts, ``in_flight`` as TransferQueue listed it, and this check's
        unaccounted (lost + unknown) and double-counted prompts."""
        counts = self.counts
        metrics = {
            "ledger/dispatched": float(counts["dispatched"]),
            "ledger/carried_over": float(counts["carried_over"]),
            "ledger/refilled": float(counts["dispatched/refill"]),
            "ledger/trained": float(counts["trained"]),
            "ledger/evicted": float(counts["evicted"]),
            "ledger/in_flight": float(self.in_flight),
            "ledger/unaccounted": float(len(report.unaccounted) + len(report.unknown)),
            "ledger/double_counted": float(len(report.double_counted)),
            "ledger/balanced": float(self.balanced()),
        }
        for reason in EVICTION_REASONS:
            metrics[f"ledger/evicted/{reason}"] = float(counts[f"evicted/{reason}"])
        return metrics

    def balanced(self) -> bool:
        """No prompt ever lost, unknown or double counted, and ``dispatched + carried over == trained
        + evicted + in flight`` with in flight as TransferQueue listed it at the last :meth:`check`.

        Either part alone can miss a fault: a lost and an unknown prompt in one check cancel in the
        counts, and a double count changes no count."""
        c = self.counts
        if c["lost"] or c["unknown"] or c["double_counted"]:
            return False
        return c["dispatched"] + c["carried_over"] == c["trained"] + c["evicted"] + self.in_flight
