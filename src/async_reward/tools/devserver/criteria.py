"""The dev server's rubric replies: a request listing criteria (``llm_judge`` with ``judge.criteria``)
gets one ``C<k>: [[n]] reason`` line per criterion, after its explanation.

Each criterion is graded by a deterministic rule, so tests know the answer: a description that
quotes a word in single quotes (``The response mentions 'five'``) gets 10 when the response contains
that word (case-insensitive) and 0 otherwise; any other description gets the correctness rule
(the response's final answer against the reference: 10 or 0). ``fixed_verdict`` grades every
criterion with that verdict; a description holding ``@@verdict:V@@`` gets ``V`` written as given
(``7.5`` too, as a judge that gives half marks writes it): a test's handle on one criterion.
``echo_response`` quotes the response before the lines, so a response
that writes criterion lines of its own lands in the reply, as a hostile one would. With logprobs,
each criterion line's verdict token is the uncertain one (``devserver.logprobs``), never a quoted one.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from async_reward.tools.devserver.judge import (
    Judgement,
    JudgeReply,
    answers_match,
    extract_final_answer,
    judge_messages,
    message_text,
)

__all__ = ["criteria_reply", "requested_criteria"]

_CRITERIA = re.compile(r"Criteria:\n((?:C[0-9]+: .*\n?)+)")
_CRITERION = re.compile(r"C([0-9]+): (.*)")
_QUOTED_WORD = re.compile(r"'([^'\s]+)'")
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)
_VERDICT_MARKER = re.compile(r"@@verdict:([0-9]{1,3}(?:\.[0-9]{1,3})?)@@")


def requested_criteria(messages: Sequence[Any]) -> list[tuple[int, str]] | None:
    """(id, description) of each criterion a request lists, or None for a single-verdict request."""
    text = "\n".join(message_text(m) for m in messages)
    found = _CRITERIA.search(text)
    if found is None:
        return None
    return [(int(m.group(1)), m.group(2)) for m in _CRITERION.finditer(found.group(1))]


def _grade(
    description: str, judgement: Judgement, reference: str | None, fixed: int | None
) -> tuple[int | str, str]:
    marked = _VERDICT_MARKER.search(description)
    if marked is not None:
        return marked.group(1), "the description sets this verdict"
    if fixed is not None:
        return fixed, "the server gives a fixed verdict"
    response = judgement.response or ""
    word = _QUOTED_WORD.search(description)
    if word is not None:
        present = word.group(1).casefold() in response.casefold()
        return (10, f"the response mentions {word.group(1)}") if present else (0, f"no {word.group(1)} in it")
    if reference is None:
        return 0, "no reference to check the answer against"
    correct = answers_match(extract_final_answer(response), reference)
    return (10, "the final answer matches") if correct else (0, "the final answer does not match")


def criteria_reply(
    messages: Sequence[Any],
    criteria: list[tuple[int, str]],
    *,
    fixed_verdict: int | None,
    echo_response: bool,
) -> JudgeReply:
    """The reply grading ``criteria``: [the response quoted], one line of explanation, then the lines."""
    judgement = judge_messages(messages, None)
    text = "\n".join(message_text(m) for m in messages)
    references = _REFERENCE.findall(text)
    reference = html.unescape(references[-1]).strip() if references else None
    parts = []
    if echo_response and judgement.response is not None:
        parts.append(f'The response under review reads:\n"""\n{judgement.response}\n"""')
    parts.append("Each criterion, graded on its own:")
    verdicts: list[tuple[int, int]] = []
    for index, description in criteria:
        verdict, reason = _grade(description, judgement, reference, fixed_verdict)
        line_at = sum(len(part) + 1 for part in parts)  # parts are joined by newlines
        if isinstance(verdict, int):  # a marked verdict is written as given, its tokens certain
            verdicts.append((line_at + len(f"C{index}: [["), verdict))
        parts.append(f"C{index}: [[{verdict}]] {reason}")
    return JudgeReply("\n".join(parts), criterion_verdicts=tuple(verdicts))
