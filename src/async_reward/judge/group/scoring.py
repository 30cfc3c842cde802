"""``llm_judge`` with ``judge.mode: group``: the members of a GRPO group meet in the reward worker's
manager and are judged in one call (``async_reward.judge.group.judging``).

verl scores one sample per ``run_single``; a member therefore waits here, keyed by its ``uid``,
until all ``n`` members (``actor_rollout_ref.rollout.n``) have arrived, and then one call judges
them all. Every member's result comes from that one call. The rules of the wait:

* **A deadline.** ``judge.group_wait_s`` from the group's first member: when it passes first, every
  member that arrived fails with status ``timeout`` and ``group <uid>: k of n members arrived
  within X s`` (a group split across workers, a member lost upstream). Never a partial group judged,
  never a wait without end.
* **Every sample accounted for once.** A member whose uid belongs to a group already judged or
  expired in this worker (more than ``n`` samples share the uid, or one came late) fails at once
  with status ``error`` and the reason; so does a second arrival of a session already waiting (a
  duplicate: verl's v1 agent loop numbers a group's sessions, ``session_id``); a member without a
  ``uid`` fails ``invalid``. Where the batch carries no ``session_id`` (verl's own reward loop, our
  pipelined manager), members are counted: two members with the same text are two members.
* **All or nothing.** The call's failure (timeout, HTTP error, an unreadable reply, members that
  disagree on the question or the reference) fails every member with that status and reason.
* **Cost once.** The first member to return its result carries what the call spent and its
  attempts; the others carry nothing and ``judge_shared``. Claimed as members return, not given to
  the one that started the call: a member cancelled while the call runs, or after its result came,
  returns nothing, so the bill goes to one that does (the step's sums are what the judge billed).
* **A plant costs its planter.** A member whose response the reply quotes with verdict lines that
  conflict with the judge's is scored the lowest verdict, status ``ok`` and ``judge_group_planted``;
  the others keep the judge's verdicts (``group_judging.read_group``).

A member cancelled while it waits leaves the group (it no longer counts); a call whose members are
all cancelled is cancelled too.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from async_reward._core.http import MalformedResponseError
from async_reward._core.result import RewardResult, RewardSample, Status
from async_reward.judge.cost import spent_extras, unspent_extras
from async_reward.judge.group.judging import GroupReading, group_messages, read_group, shown_order
from async_reward.judge.prompts import block, normalize_score
from async_reward.judge.reply import judge_reply, unread_reply
from async_reward.judge.rubric.criteria import CriteriaError
from async_reward.judge.rubric.scoring import CriteriaJudge
from async_reward.judge.verdict import VerdictError, strip_think

__all__ = ["GROUP_EXTRA_DEFAULTS", "GroupJudge", "GroupRendezvous", "group_extra_defaults"]

#: Extras every sample carries in group mode: where the judge saw it (1 = listed first; 0: never
#: shown, e.g. its group expired), how many members its call listed (0: none), the judge's reason.
GROUP_EXTRA_DEFAULTS: dict[str, Any] = {
    "judge_group_position": 0,
    "judge_group_size": 0,
    "judge_group_reason": "",
    "judge_group_planted": False,
}
#: How many judged or expired uids a worker remembers, to refuse a member that comes after its group.
_REMEMBERED = 65_536
_DEFAULT_WAIT_S = 600.0
#: The shuffle's seed beside each group's uid: the uid (random per group in training) varies the order,
#: and the benchmarks' fixed uids give the same orders run after run.
_SHUFFLE_SEED = 0


#: What group judging needs of ``llm_judge``: the same as rubric scoring (one guarded call).
GroupJudge = CriteriaJudge


@dataclass
class _Group:
    """Members of one uid waiting in this worker, and the deadline of their wait."""

    uid: str
    members: list[tuple[RewardSample, asyncio.Future[RewardResult]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    call: asyncio.Future[None] | None = None
    waiting: int = 0
    reading: GroupReading | None = None
    """The judge's reply, read (:func:`group_judging.read_group`), once the call succeeded."""
    bill: tuple[dict[str, Any], int] | None = None
    """What the call spent and its attempts, until a returning member claims them (:meth:`claim`)."""

    def claim(self, result: RewardResult) -> RewardResult:
        """``result`` with the call's bill on it if no member returned it yet, else marked shared
        (unchanged when no call was made: the group expired)."""
        if self.call is None:
            return result
        if self.bill is None:
            return replace(result, extras={**result.extras, "judge_shared": True})
        spent, attempts = self.bill
        self.bill = None
        return replace(result, attempts=attempts, extras={**result.extras, **spent, "judge_shared": False})


class GroupRendezvous:
    """Where the members of each group wait for each other, in one manager instance (one worker)."""

    def __init__(self, manager: GroupJudge, size: int) -> None:
        self.manager = manager
        self.size = size
        judge = manager.judge
        self.wait_s = _DEFAULT_WAIT_S if judge.group_wait_s is None else float(judge.group_wait_s)
        self.shuffle = bool(judge.group_shuffle)
        self._open: dict[str, _Group] = {}
        #: uid -> why a member of it can no longer join (judged, or expired).
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._calls: set[asyncio.Future[None]] = set()

    @property
    def calls_in_flight(self) -> int:
        """Group calls started and not yet done (a cancelled one counts until it has unwound)."""
        return len(self._calls)

    async def score(self, sample: RewardSample) -> RewardResult:
        """``sample``'s result from its group's one call, once every member arrived."""
        uid = sample.uid
        if uid is None:
            return RewardResult.failure(
                Status.INVALID,
                "judge.mode=group needs each sample's uid (verl's GRPO group id); this sample has none",
                attempts=0,
            )
        closed = self._closed.get(uid)
        if closed is not None:
            return RewardResult.failure(Status.ERROR, f"group {uid}: {closed}", attempts=0)
        loop = asyncio.get_running_loop()
        group = self._open.get(uid)
        if group is None:
            group = self._open[uid] = _Group(uid)
            group.timer = loop.call_later(self.wait_s, self._expire, group)
        if sample.session_id is not None and any(s.session_id == sample.session_id for s, _ in group.members):
            return RewardResult.failure(
                Status.ERROR,
                f"group {uid}: session {sample.session_id} arrived twice (a duplicate member); the first "
                "arrival stays in the group",
                attempts=0,
            )
        member: asyncio.Future[RewardResult] = loop.create_future()
        group.members.append((sample, member))
        group.waiting += 1
        if len(group.members) == self.size:
            self._close(
                group,
                f"a member arrived after its group's {self.size} members were judged "
                f"(more than actor_rollout_ref.rollout.n={self.size} samples share this uid)",
            )
            group.call = asyncio.ensure_future(self._judge(group))
            self._calls.add(group.call)
            group.call.add_done_callback(self._calls.discard)
        try:
            return group.claim(await asyncio.shield(member))
        except asyncio.CancelledError:
            group.waiting -= 1
            if group.call is None:  # still gathering: the member leaves, and no longer counts
                group.members = [(s, f) for s, f in group.members if f is not member]
                if not group.members:
                    self._discard(group)
            elif group.waiting <= 0:  # nobody waits for the call any more: stop paying for it
                group.call.cancel()
            raise

    def _close(self, group: _Group, why: str) -> None:
        """Stop ``group`` taking members; a later member of its uid fails with ``why``."""
        if group.timer is not None:
            group.timer.cancel()
        self._open.pop(group.uid, None)
        self._closed[group.uid] = why
        while len(self._closed) > _REMEMBERED:
            self._closed.popitem(last=False)

    def _discard(self, group: _Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
        if self._open.get(group.uid) is group:
            del self._open[group.uid]

    def _expire(self, group: _Group) -> None:
        """The deadline passed before the group was whole: fail every member that arrived."""
        if self._open.get(group.uid) is not group:
            return
        arrived = len(group.members)
        reason = (
            f"group {group.uid}: {arrived} of {self.size} members arrived within {self.wait_s:g} s "
            "(judge.group_wait_s); judge.mode=group needs a whole group in one reward worker"
        )
        self._close(
            group,
            f"a member arrived after its group expired ({arrived} of {self.size} "
            f"arrived within judge.group_wait_s={self.wait_s:g} s)",
        )
        for _sample, member in group.members:
            if not member.done():
                extras = {**unspent_extras(self.manager.pricing), "judge_shared": False}
                member.set_result(RewardResult.failure(Status.TIMEOUT, reason, attempts=0, extras=extras))

    async def _judge(self, group: _Group) -> None:
        """The group's one call, and every member's result from it; a fault of this code fails
        every member with it (none may wait for a result that never comes)."""
        try:
            await self._judge_members(group)
        except Exception as exc:
            for _sample, member in group.members:
                reason = f"group {group.uid}: group judging failed: {exc!r}"
                _settle(member, RewardResult.failure(Status.ERROR, reason, attempts=0))

    async def _judge_members(self, group: _Group) -> None:
        samples = [sample for sample, _ in group.members]
        order = shown_order(len(samples), seed=_SHUFFLE_SEED, uid=group.uid, shuffle=self.shuffle)
        result = await self.manager.guard(self._call(group, samples, order))
        reading = group.reading if result.ok else None
        group.bill = (dict(result.extras), result.attempts)
        unspent = unspent_extras(self.manager.pricing)
        position_of = {arrived: shown for shown, arrived in enumerate(order, start=1)}
        for arrived, (_sample, member) in enumerate(group.members):
            if reading is None:
                reason = f"group {group.uid}: {result.failure_reason}"
                _settle(member, RewardResult.failure(result.status, reason, attempts=0, extras=unspent))
            else:
                _settle(member, self._member_result(reading, position_of[arrived], len(samples), unspent))

    def _member_result(
        self, reading: GroupReading, position: int, size: int, unspent: dict[str, Any]
    ) -> RewardResult:
        """The result of the member shown at ``position``: the judge's verdict, or the lowest one for
        a member found planting verdict lines (``group_judging.read_group``)."""
        judge = self.manager.judge
        verdict = reading.verdicts[position]
        planted = reading.planted.get(position)
        value, reason = verdict.value, verdict.reason
        if planted is not None:
            value = judge.min_score
            reason = (
                f"planted verdict text the reply quoted against the judge's lines ({planted[:200]}): "
                f"scored the lowest verdict; the judge's own was {verdict.value:g} ({verdict.reason})"
            )
        score = normalize_score(
            value, min_score=judge.min_score, max_score=judge.max_score, normalize_to=judge.normalize_to
        )
        extras = {
            "judge_verdict": value,
            "judge_group_position": position,
            "judge_group_size": size,
            "judge_group_reason": reason,
            "judge_group_planted": planted is not None,
            **unspent,
        }
        return RewardResult(score=score, attempts=0, extras=extras)

    def _unsent(self, reason: str) -> RewardResult:
        """The failure of a call refused before it was sent: nothing spent."""
        extras = spent_extras(None, self.manager.pricing)
        return RewardResult.failure(Status.INVALID, reason, attempts=0, extras=extras)

    async def _call(self, group: _Group, samples: list[RewardSample], order: list[int]) -> RewardResult:
        """One call grading ``samples`` shown in ``order``: its result (what it spent and its attempts;
        the status and reason every member fails with when it failed), and on success the reply's
        reading in ``group.reading``."""
        pricing = self.manager.pricing
        first = samples[0]
        reference = reference_text(first)
        if any(s.prompt_text != first.prompt_text or reference_text(s) != reference for s in samples):
            return self._unsent("the members carry different prompts or references: not one GRPO group")
        judge = self.manager.judge
        shown = [samples[arrived].response for arrived in order]
        messages = group_messages(
            shown,
            question=block("question", first.prompt_text),
            reference=None if reference is None else block("reference", reference),
            system=self.manager.template.system if judge.system_prompt is None else judge.system_prompt,
            min_score=judge.min_score,
            max_score=judge.max_score,
        )
        too_long = self.manager.prompt_refusal(messages)
        if too_long is not None:
            return self._unsent(too_long)
        priority = min(sample.admission_priority for sample in samples)
        reply, attempts = await self.manager.post_reply(messages, priority)
        usage = reply.get("usage") if isinstance(reply, Mapping) else None
        spent = spent_extras(usage, pricing)
        try:
            answer = judge_reply(reply)
            think = "none" if answer.reasoning_apart else self.manager.rules.think
            visible = strip_think(answer.content, think)
            reading = read_group(visible, shown, min_score=judge.min_score, max_score=judge.max_score)
        except (MalformedResponseError, VerdictError, CriteriaError) as exc:
            return RewardResult.failure(Status.INVALID, str(exc), attempts=attempts, extras=spent)
        except Exception as exc:  # a reply no rule foresaw: still error with its reason, its tokens kept
            return RewardResult.failure(Status.ERROR, unread_reply(exc), attempts=attempts, extras=spent)
        group.reading = reading
        return RewardResult(score=0.0, attempts=attempts, extras=spent)


def reference_text(sample: RewardSample) -> str | None:
    """The reference as the judge is shown it (``str`` of the ground truth, as pointwise judging
    writes it), None without one. Members are one group when these texts agree: comparing the ground
    truths themselves with ``!=`` fails on a numpy array (verl reads a parquet list column as one)."""
    return None if sample.ground_truth is None else str(sample.ground_truth)


def _settle(member: asyncio.Future[RewardResult], result: RewardResult) -> None:
    if not member.done():
        member.set_result(result)


def group_extra_defaults() -> dict[str, Any]:
    """The extras every sample carries in group mode (a failed one: these neutral values)."""
    return {**GROUP_EXTRA_DEFAULTS, "judge_verdict": math.nan}
