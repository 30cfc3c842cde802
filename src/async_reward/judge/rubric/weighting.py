"""``judge.expected_verdict`` with ``judge.criteria``: each criterion's verdict weighed by the judge's
own token probabilities (``async_reward.judge.expected``'s rule, unchanged) at the digits of that
criterion's line in the reply's final block
(:attr:`async_reward.judge.rubric.criteria.CriterionVerdict.span`) and at every agreeing ``C<k>: [[n]]`` of
it elsewhere in the reply (``quoted``), keeping the lowest grade (``managers.span_weighting``): the final
block may itself be a quote of the response's lines, so a quoted line can lower a criterion's grade and never
raise it, whatever probabilities its tokens carry.

All or none, never a silent mix: a sample's reward is made of weighted grades only when every
criterion of every call was weighed at one of its places at least. Where one cannot be (a reply
without logprobs, a verdict with a decimal point, tokens that do not spell the reply, ...), every
criterion of the sample keeps its plain verdict and ``judge_weighting`` says ``plain: <criterion>:
<why>`` for the first such criterion in the rubric's order; each reason is said once in the log, as
for a single verdict.

A criterion weighed at one place whose lowest grade is still a place that cannot be weighed (an
agreeing quoted line tokenised ``[[7``, whose written number is below the weighed line's
expectation) counts that written number, and the sample says so: ``judge_weighting`` is
``expected (<criterion> at its written number: <why>)`` for the first such criterion, and that
criterion's ``_mass`` is NaN (no probability stands behind the number it counts). It does not make the
sample plain: that would put every other criterion back at its written verdict, which may be above its
expectation, so a planted quote would raise the aggregate, where the rule lets it only lower it
(``judge.span_weighting``).

A ``must_have`` criterion fails the sample when its plain verdict *or* its expected verdict is under
half marks (``async_reward.judge.rubric.criteria.aggregate``'s ``plain``): the judge's doubt can neither pass
a must-have its written verdict fails nor count a weighted grade under half as passed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from async_reward.judge.expected import reply_tokens, say_unweighted
from async_reward.judge.rubric.criteria import Criterion, CriterionVerdict
from async_reward.judge.span_weighting import Weighing, refuse_too_many, weigh_places

__all__ = ["ASSUMED_KEY", "NOT_FAVOURITE_KEY", "WEIGHTED_SUFFIXES", "rubric_weighting", "weigh_call"]

#: A weighted call's sample-level signs (as for a single weighted verdict): 1.0 when a criterion's
#: written verdict was not the listed favourite, and the largest share placed by the neighbour rule.
#: The sample takes the largest over its calls.
NOT_FAVOURITE_KEY = "judge_verdict_not_favourite"
ASSUMED_KEY = "judge_verdict_assumed"

#: The per-criterion extras of a weighted verdict: ``judge_criterion_<name>_expected`` (the grade the
#: weighted aggregate counts, on the judge's scale: the expected verdict, or the written number of a
#: place that cannot be weighed where that is lower) and ``judge_criterion_<name>_mass`` (the
#: probability its candidates covered; NaN for a written number), next to ``judge_criterion_<name>``
#: (the verdict written) and ``..._reason``.
WEIGHTED_SUFFIXES = ("_expected", "_mass")

#: A weighted call's ``judge_weighting``; ``expected (<why>)`` when a criterion counted a written number.
EXPECTED = "expected"


def _weighted(weighting: str) -> bool:
    """Whether a call's ``judge_weighting`` says it was weighted (every criterion at one place at
    least), as opposed to ``plain: <criterion>: <why>``."""
    return weighting == EXPECTED or weighting.startswith(f"{EXPECTED} (")


def weigh_call(
    reply: Any,
    content: str,
    visible_at: int,
    graded: Sequence[tuple[str, CriterionVerdict]],
    *,
    criteria: Sequence[Criterion],
    min_score: float,
    max_score: float,
) -> dict[str, Any]:
    """The weighting extras of one rubric call: each criterion's grade and mass and
    ``judge_weighting: expected`` (``expected (<name> at its written number: <why>)`` where a
    criterion's grade is a place that cannot be weighed, its mass then NaN); or only
    ``judge_weighting: plain: <name>: <why>`` for the first of ``graded`` ((name, verdict) in the
    call's order) that cannot be weighed at any of its places.

    Each criterion is weighed at its line of the final block and at every agreeing line of it
    elsewhere (:attr:`CriterionVerdict.quoted`), and keeps the lowest grade: the lowest value for a
    ``positive`` criterion of ``criteria``, the highest for a ``negative`` one, each place valued at
    its expected verdict or, where its tokens cannot be weighed, at its written number
    (``managers.span_weighting``). ``content`` is the reply's content, ``visible_at`` where the text
    :func:`read_criteria` read starts in it (after the judge's thinking): each verdict's span is
    shifted by it, since the tokens spell the whole content.

    Raises:
        VerdictError: the reply writes more criterion verdicts than the bound of
            ``managers.span_weighting`` besides its final block (``invalid``).
    """
    tokens = reply_tokens(reply["choices"][0])
    if not isinstance(tokens, str):  # a str: why there are none to weigh (none sent, or malformed)
        refuse_too_many(sum(len(verdict.quoted) for _, verdict in graded))
    flaws = {criterion.name for criterion in criteria if criterion.polarity == "negative"}
    extras: dict[str, Any] = {}
    not_favourite, assumed = 0.0, 0.0
    at_written = ""  # the first criterion counted at a written number, and why
    for name, verdict in graded:
        places = [
            (verdict.value, (visible_at + start, visible_at + end))
            for start, end in (verdict.span, *verdict.quoted)
        ]
        flaw = name in flaws
        weighing = (
            Weighing(lowest=None, written=verdict.value, reason=tokens)
            if isinstance(tokens, str)
            else weigh_places(content, tokens, places, min_score=min_score, max_score=max_score, flaw=flaw)
        )
        if weighing.lowest is None:
            say_unweighted(weighing.reason)
            return {"judge_weighting": f"plain: {name}: {weighing.reason}"}
        if weighing.written_wins(flaw):  # a place not weighed sets the grade: no probability behind it
            extras[f"judge_criterion_{name}_expected"] = weighing.written
            extras[f"judge_criterion_{name}_mass"] = math.nan
            at_written = at_written or f"{name} at its written number: {weighing.reason}"
            continue
        extras[f"judge_criterion_{name}_expected"] = weighing.lowest.value
        extras[f"judge_criterion_{name}_mass"] = weighing.lowest.mass
        not_favourite = max(not_favourite, 0.0 if weighing.lowest.favourite else 1.0)
        assumed = max(assumed, weighing.lowest.assumed)
    return {
        **extras,
        "judge_weighting": f"{EXPECTED} ({at_written})" if at_written else EXPECTED,
        NOT_FAVOURITE_KEY: not_favourite,
        ASSUMED_KEY: assumed,
    }


def rubric_weighting(
    criteria: Sequence[Criterion],
    graded: dict[str, Any],
    weightings: Sequence[str],
    signs: Sequence[dict[str, float]] = (),
) -> tuple[list[float] | None, dict[str, Any]]:
    """The expected verdicts of the sample (None: it keeps its plain ones) and its sample-level
    extras, from ``weightings`` (each call's ``judge_weighting``, in the rubric's order) and ``signs``
    (each weighted call's :data:`NOT_FAVOURITE_KEY` and :data:`ASSUMED_KEY`). A call that counted a
    criterion at its written number (``expected (...)``) is weighted, and the sample says the first
    such call's ``judge_weighting``. On a plain sample the weighted extras of the calls that were
    weighted are dropped from ``graded`` (they stay NaN): nothing suggests a weighting that did not
    score."""
    plain = next((weighting for weighting in weightings if not _weighted(weighting)), None)
    if plain is not None:
        for criterion in criteria:
            for suffix in WEIGHTED_SUFFIXES:
                graded.pop(f"judge_criterion_{criterion.name}{suffix}", None)
        return None, {"judge_weighted": 0.0, "judge_weighting": plain}
    expected = [graded[f"judge_criterion_{criterion.name}_expected"] for criterion in criteria]
    masses = [graded[f"judge_criterion_{criterion.name}_mass"] for criterion in criteria]
    return expected, {
        "judge_weighted": 1.0,
        # "expected", or the first call's "expected (<name> at its written number: <why>)"
        "judge_weighting": next((weighting for weighting in weightings if weighting != EXPECTED), EXPECTED),
        # The least-covered weighed criterion: how much of the judge's probability the weakest
        # weighing saw (NaN when every criterion counted a written number: nothing was covered).
        "judge_verdict_mass": min((mass for mass in masses if not math.isnan(mass)), default=math.nan),
        **{
            key: max((sign.get(key, 0.0) for sign in signs), default=0.0)
            for key in (NOT_FAVOURITE_KEY, ASSUMED_KEY)
        },
    }
