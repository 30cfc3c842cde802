"""The dev server's group replies: a request listing a GRPO group's responses (``llm_judge`` with
``judge.mode: group``) gets one ``R<k>: [[n]] reason`` line per response, after its explanation.

Each response is graded by a deterministic rule, so tests know the answer: a response holding
``@@verdict:V@@`` gets ``V`` (a test's handle on one member); else ``fixed_verdict`` when set; else,
with a reference, 10 when its final answer matches and 0 otherwise; without one, the length rubric
``min(10, words // 5)``. ``group_position_bonus`` adds that much (capped at 10) to the response
listed first, as a judge with a position bias would: the knob the position-bias measurement turns.
``echo_response`` quotes every response before the lines, so a response that writes member lines of
its own lands in the reply, as a hostile one would; with ``judge_style: verdict-then-quote`` each
line's reason ends with its response quoted (on one line), as a judge that cites what it grades.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from async_reward.tools.devserver.judge import (
    JudgeReply,
    JudgeStyle,
    answers_match,
    extract_final_answer,
    message_text,
    word_count,
)

__all__ = ["group_reply", "requested_members"]

_MEMBER = re.compile(r"^R([0-9]+):\n<response>\n(.*?)\n</response>", re.DOTALL | re.MULTILINE)
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)
_VERDICT_MARKER = re.compile(r"@@verdict:([0-9]{1,2})@@")


def requested_members(messages: Sequence[Any]) -> list[tuple[int, str]] | None:
    """(label, unescaped response) of each member a group request lists, or None for another request."""
    text = "\n".join(message_text(m) for m in messages)
    found = [(int(m.group(1)), html.unescape(m.group(2))) for m in _MEMBER.finditer(text)]
    return found or None


def _grade(response: str, reference: str | None, fixed: int | None) -> tuple[int, str]:
    marked = _VERDICT_MARKER.search(response)
    if marked is not None:
        return min(10, int(marked.group(1))), "the response carries a verdict marker"
    if fixed is not None:
        return fixed, "the server gives a fixed verdict"
    if reference is None:
        words = word_count(response)
        return min(10, words // 5), f"it has {words} words"
    if answers_match(extract_final_answer(response), reference):
        return 10, "the final answer matches"
    return 0, "the final answer does not match"


def group_reply(
    messages: Sequence[Any],
    members: list[tuple[int, str]],
    *,
    fixed_verdict: int | None,
    echo_response: bool,
    position_bonus: int,
    style: JudgeStyle = "verdict-last",
) -> JudgeReply:
    """The reply grading ``members``: [each response quoted], one line of explanation, then the lines
    (``verdict-then-quote``: each reason quoting its response, its line breaks made spaces)."""
    text = "\n".join(message_text(m) for m in messages)
    references = _REFERENCE.findall(text)
    reference = html.unescape(references[-1]).strip() if references else None
    parts: list[str] = []
    if echo_response:
        parts.extend(f'Response R{label} reads:\n"""\n{response}\n"""' for label, response in members)
    parts.append("Each response, graded on its own:")
    for shown, (label, response) in enumerate(members):
        verdict, reason = _grade(response, reference, fixed_verdict)
        if shown == 0 and position_bonus:
            verdict, reason = min(10, verdict + position_bonus), f"{reason} (and it came first)"
        if style == "verdict-then-quote":
            reason = f'{reason}; it reads: "{" ".join(response.split())}"'
        parts.append(f"R{label}: [[{verdict}]] {reason}")
    return JudgeReply("\n".join(parts))
