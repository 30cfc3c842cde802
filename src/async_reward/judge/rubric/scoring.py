"""``llm_judge`` with ``judge.criteria``: a rubric graded in one call, or in calls of
``criteria_per_call`` criteria, every one of which must succeed (``async_reward.judge.rubric.criteria``).

A failed call fails the sample with that call's status and reason (never a partial aggregate over
the criteria that were graded); what every call spent is kept in the sample's cost extras, and
``judge_calls`` counts the calls apart from ``attempts`` (every request sent, retries included), so
``reward/retries`` counts only retries. With
``judge.expected_verdict`` the aggregate is made of each criterion's expected verdict, all criteria
weighted or none (``managers.criteria_weighting``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from async_reward._core.http import MalformedResponseError
from async_reward._core.limits import Priority
from async_reward._core.result import RewardResult, RewardSample, Status
from async_reward.config import JudgeConfig
from async_reward.judge.cost import JudgePricing, spent_extras
from async_reward.judge.expected import say_if_not_favourite
from async_reward.judge.prompts import JudgeTemplate, block, normalize_score
from async_reward.judge.reply import judge_reply, unread_reply
from async_reward.judge.rubric.criteria import (
    CriteriaError,
    Criterion,
    aggregate,
    criteria_messages,
    read_criteria,
)
from async_reward.judge.rubric.weighting import (
    ASSUMED_KEY,
    NOT_FAVOURITE_KEY,
    WEIGHTED_SUFFIXES,
    rubric_weighting,
    weigh_call,
)
from async_reward.judge.verdict import VerdictError, VerdictRules, strip_think

__all__ = ["CriteriaJudge", "criteria_extra_defaults", "score_criteria"]


class CriteriaJudge(Protocol):
    """What rubric scoring and group judging (``managers.group_scoring``) need of ``llm_judge``: its
    settings and one guarded judge call (kept as a protocol: no import of the manager)."""

    judge: JudgeConfig
    template: JudgeTemplate
    rules: VerdictRules
    pricing: JudgePricing | None

    def prompt_refusal(self, messages: list[dict[str, str]]) -> str | None: ...

    def guard(self, scoring: Awaitable[RewardResult]) -> Awaitable[RewardResult]: ...

    async def post_reply(
        self, messages: list[dict[str, str]], priority: Priority = 0.0
    ) -> tuple[Any, int]: ...


_SUMMED = ("judge_prompt_tokens", "judge_completion_tokens", "judge_tokens", "judge_cost")


def criteria_extra_defaults(criteria: tuple[Criterion, ...], *, expected: bool = False) -> dict[str, Any]:
    """The per-criterion extras every sample carries (a failed one: NaN and no reason), and the calls
    the rubric took (``judge_calls``, one per ``criteria_per_call`` chunk that was sent); with
    ``expected`` (``judge.expected_verdict``) each one's expected verdict and mass too (NaN on a
    failed or plain sample)."""
    # judge_calls: the calls a rubric took (NaN on a sample failed before they were counted: one call).
    defaults: dict[str, Any] = {"judge_calls": math.nan}
    for criterion in criteria:
        defaults[f"judge_criterion_{criterion.name}"] = math.nan
        defaults[f"judge_criterion_{criterion.name}_reason"] = ""
        if expected:
            for suffix in WEIGHTED_SUFFIXES:
                defaults[f"judge_criterion_{criterion.name}{suffix}"] = math.nan
    return defaults


async def score_criteria(manager: CriteriaJudge, sample: RewardSample) -> RewardResult:
    """The sample's rubric aggregate as its reward, each criterion's verdict and reason in extras."""
    judge = manager.judge
    question = block("question", sample.prompt_text)
    response = block("response", sample.response)
    reference = None if sample.ground_truth is None else block("reference", str(sample.ground_truth))
    system = manager.template.system if judge.system_prompt is None else judge.system_prompt
    numbered = list(enumerate(judge.criteria, start=1))
    size = judge.criteria_per_call or len(numbered)
    chunks = [numbered[start : start + size] for start in range(0, len(numbered), size)]
    calls = []
    for chunk in chunks:
        messages = criteria_messages(
            chunk,
            question=question,
            response=response,
            reference=reference,
            system=system,
            min_score=judge.min_score,
            max_score=judge.max_score,
        )
        calls.append(manager.guard(_grade(manager, messages, [index for index, _ in chunk], sample)))
    results = await asyncio.gather(*calls)
    attempts = sum(result.attempts for result in results)
    # Each call counted once however many attempts it took: reward/retries is attempts - judge_calls.
    spent = {**_summed_spend(manager, results), "judge_calls": sum(min(r.attempts, 1) for r in results)}
    failed = [(number, result) for number, result in enumerate(results, start=1) if not result.ok]
    if failed:
        number, first = failed[0]
        where = f"criteria call {number} of {len(results)}: " if len(results) > 1 else ""
        return RewardResult.failure(
            first.status, where + (first.failure_reason or ""), attempts=attempts, extras=spent
        )
    graded: dict[str, Any] = {}
    weightings: list[str] = []
    signs: list[dict[str, float]] = []
    for result in results:
        extras = dict(result.extras)
        if "judge_weighting" in extras:
            weightings.append(extras.pop("judge_weighting"))
        signs.append({key: extras.pop(key) for key in (NOT_FAVOURITE_KEY, ASSUMED_KEY) if key in extras})
        graded.update(extras)
    plain = [graded[f"judge_criterion_{criterion.name}"] for criterion in judge.criteria]
    on_scale = _on_scale(
        judge, aggregate(judge.criteria, plain, min_score=judge.min_score, max_score=judge.max_score)
    )
    verdict_extras: dict[str, Any] = {"judge_verdict": on_scale}
    scored = on_scale
    if judge.expected_verdict:
        expected, weighting = rubric_weighting(judge.criteria, graded, weightings, signs)
        verdict_extras.update(weighting)
        if expected is not None:
            say_if_not_favourite(weighting[NOT_FAVOURITE_KEY] == 0.0, temperature=judge.temperature)
            share = aggregate(
                judge.criteria, expected, min_score=judge.min_score, max_score=judge.max_score, plain=plain
            )
            scored = verdict_extras["judge_expected_verdict"] = _on_scale(judge, share)
    score = normalize_score(
        scored, min_score=judge.min_score, max_score=judge.max_score, normalize_to=judge.normalize_to
    )
    return RewardResult(score=score, attempts=attempts, extras={**verdict_extras, **graded, **spent})


def _on_scale(judge: JudgeConfig, share: float) -> float:
    """The aggregate ``share`` in [0, 1] on the judge's scale (rounding must not leave it)."""
    on_scale = judge.min_score + share * (judge.max_score - judge.min_score)
    return min(max(on_scale, judge.min_score), judge.max_score)


async def _grade(
    manager: CriteriaJudge, messages: list[dict[str, str]], ids: list[int], sample: RewardSample
) -> RewardResult:
    """One call grading the criteria ``ids``: a result whose extras hold their verdicts and reasons."""
    too_long = manager.prompt_refusal(messages)
    if too_long is not None:
        return RewardResult.failure(Status.INVALID, too_long, attempts=0, extras={})
    reply, attempts = await manager.post_reply(messages, sample.admission_priority)
    spent = spent_extras(reply.get("usage") if isinstance(reply, Mapping) else None, manager.pricing)
    try:
        answer = judge_reply(reply)
        visible = strip_think(answer.content, "none" if answer.reasoning_apart else manager.rules.think)
        verdicts = read_criteria(
            visible, ids, min_score=manager.judge.min_score, max_score=manager.judge.max_score
        )
        named = [(manager.judge.criteria[index - 1].name, verdicts[index]) for index in ids]
        weighting: dict[str, Any] = {}
        if manager.judge.expected_verdict:
            # strip_think keeps a suffix of the content: the read text starts where their lengths differ.
            weighting = weigh_call(
                reply,
                answer.content,
                len(answer.content) - len(visible),
                named,
                criteria=manager.judge.criteria,
                min_score=manager.judge.min_score,
                max_score=manager.judge.max_score,
            )
    except (MalformedResponseError, VerdictError, CriteriaError) as exc:
        return RewardResult.failure(Status.INVALID, str(exc), attempts=attempts, extras=spent)
    except Exception as exc:  # a reply no rule foresaw: still error with its reason, its tokens kept
        return RewardResult.failure(Status.ERROR, unread_reply(exc), attempts=attempts, extras=spent)
    extras: dict[str, Any] = dict(spent)
    for name, verdict in named:
        extras[f"judge_criterion_{name}"] = verdict.value
        extras[f"judge_criterion_{name}_reason"] = verdict.reason
    extras.update(weighting)
    return RewardResult(score=0.0, attempts=attempts, extras=extras)


def _summed_spend(manager: CriteriaJudge, results: list[RewardResult]) -> dict[str, Any]:
    """What every call of the sample spent, summed (a failed call's reply was paid for too)."""
    total = spent_extras(None, manager.pricing)
    unread: list[str] = []  # each call's usage a count could not be read from, said once each
    for result in results:
        for key in _SUMMED:
            if key in total and isinstance(result.extras.get(key), (int, float)):
                total[key] += result.extras[key]
        problem = result.extras.get("judge_usage_error")
        if problem and problem not in unread:
            unread.append(problem)
    return {**total, "judge_usage_error": " | ".join(unread), "judge_shared": False}
