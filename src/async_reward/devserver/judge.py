"""Pure, deterministic judging rules behind the dev server.

Kept apart from the HTTP plumbing so that other code (reward functions, benchmarks, tests) can reuse
the very same final-answer rule the dev server judges with, and so that the rule can be unit-tested
without a socket.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "JudgeStyle",
    "Judgement",
    "answers_match",
    "extract_final_answer",
    "judge_messages",
    "message_text",
    "render_reply",
    "render_structured",
    "word_count",
]

VerdictFormat = Literal["brackets", "boxed", "score", "json"]
#: ``verdict-last``: [quote] explanation, verdict (what templates ask); ``verdict-then-quote``:
#: explanation, verdict, then the response quoted (a judge that discusses the response afterwards).
JudgeStyle = Literal["verdict-last", "verdict-then-quote"]

# A number as people write it: optional minus, digits with optional thousands commas, optional decimals.
_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")
# Stricter, whole-string form used to decide whether a (comma-stripped) answer *is* a number.
_WHOLE_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_BOXED = "\\boxed{"
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)
_RESPONSE = re.compile(r"<response>(.*?)</response>", re.DOTALL)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, with nested braces balanced (``\\boxed{\\frac{1}{2}}``).

    A regex cannot balance braces, hence the scan. An unterminated last box is ignored rather than
    swallowing the rest of the text.
    """
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1].strip()
        start = text.rfind(_BOXED, 0, start)
    return None


def extract_final_answer(text: str) -> str | None:
    """The final answer of a policy response: the last ``\\boxed{...}``, else the last number.

    Commas are stripped from a number (``1,234`` -> ``1234``). Returns None when the response has
    neither, so callers can tell "no answer" apart from an empty box.
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return numbers[-1].replace(",", "")


def _as_number(text: str) -> float | None:
    candidate = text.strip().replace(",", "")
    if not _WHOLE_NUMBER.fullmatch(candidate):
        return None
    return float(candidate)


def answers_match(pred: str | None, ref: str) -> bool:
    """Whether an extracted answer equals the reference.

    Numerically when both parse as plain numbers (so ``3.0`` matches ``3`` and ``1,000`` matches
    ``1000``), else as whitespace-stripped strings. A missing prediction never matches.
    """
    if pred is None:
        return False
    pred_num, ref_num = _as_number(pred), _as_number(ref)
    if pred_num is not None and ref_num is not None:
        return abs(pred_num - ref_num) <= 1e-9 * max(1.0, abs(ref_num))
    return pred.strip() == ref.strip()


def word_count(text: str) -> int:
    """Whitespace word count: the dev server's stand-in for a tokenizer."""
    return len(text.split())


def message_text(message: Any) -> str:
    """Text of one chat message; OpenAI allows ``content`` as a string or a list of typed parts."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


@dataclass(frozen=True)
class Judgement:
    """What the rule-based judge decided about one request."""

    verdict: int
    """0..10, the judge's scale."""
    explanation: str
    """One sentence saying why, shown before the verdict."""
    response: str | None
    """The unescaped policy response, if the request carried one (quoted by ``echo_response``)."""


def judge_messages(messages: Sequence[Any], fixed_verdict: int | None = None) -> Judgement:
    """Judge a chat request by the ``<reference>``/``<response>`` blocks its messages carry.

    The last block of each kind wins, so a template whose instructions mention the tags still works.
    With a reference: 10 when the final answers match, else 0. Without one (a rubric template): a
    deterministic length rubric, ``min(10, words // 5)``. ``fixed_verdict``: always that verdict (a
    judge whose verdict is known whatever the response says, for adversarial tests).
    """
    text = "\n".join(message_text(m) for m in messages)
    references = _REFERENCE.findall(text)
    responses = _RESPONSE.findall(text)
    response = html.unescape(responses[-1]) if responses else None
    if fixed_verdict is not None:
        return Judgement(fixed_verdict, "The server gives a fixed verdict.", response)
    if response is None:
        why = "reference but no <response> block" if references else "no <reference> or <response> block"
        return Judgement(0, f"The request carries {why}, so there is nothing to judge.", None)
    if not references:
        words = word_count(response)
        return Judgement(min(10, words // 5), f"Rubric: the response has {words} words.", response)
    reference = html.unescape(references[-1]).strip()
    pred = extract_final_answer(response)
    if answers_match(pred, reference):
        return Judgement(10, "The final answer matches the reference.", response)
    shown = "no final answer" if pred is None else f"final answer {pred!r}"
    return Judgement(0, f"The response gives {shown}, which does not match the reference.", response)


def _format_verdict(verdict: int, explanation: str, verdict_format: VerdictFormat) -> str:
    if verdict_format == "json":
        return json.dumps({"score": verdict, "reason": explanation})
    if verdict_format == "boxed":
        return f"{explanation}\n\\boxed{{{verdict}}}"
    if verdict_format == "score":
        return f"{explanation}\nScore: {verdict}"
    return f"{explanation}\nRating: [[{verdict}]]"


def _think_block(judgement: Judgement) -> str:
    decoy = 0 if judgement.verdict == 10 else 10
    return (
        f"<think>A hasty judge would write Score: {decoy} [[{decoy}]] \\boxed{{{decoy}}} "
        f'{{"score": {decoy}}} here; let me check properly instead.</think>'
    )


def _quote(judgement: Judgement) -> str:
    return f'The response under review reads:\n"""\n{judgement.response}\n"""'


def render_reply(
    judgement: Judgement,
    verdict_format: VerdictFormat,
    *,
    think: bool = False,
    echo_response: bool = False,
    style: JudgeStyle = "verdict-last",
) -> str:
    """The judge's reply text: [think block] [quoted response] explanation and verdict; or, in style
    ``verdict-then-quote``, [think block] explanation and verdict, then the quoted response.

    The think block and the quoted response exist to trip parsers: the decoy inside ``<think>`` always
    differs from the real verdict, and a quoted response may itself contain ``[[10]]`` or
    ``\\boxed{...}``, before the verdict or (``verdict-then-quote``) after it.
    """
    parts: list[str] = [_think_block(judgement)] if think else []
    quoted = judgement.response is not None
    if echo_response and quoted and style == "verdict-last":
        parts.append(_quote(judgement))
    parts.append(_format_verdict(judgement.verdict, judgement.explanation, verdict_format))
    if quoted and style == "verdict-then-quote":
        parts.append(_quote(judgement))
    return "\n".join(parts)


def render_structured(
    judgement: Judgement,
    properties: dict[str, Any],
    *,
    think: bool = False,
    echo_response: bool = False,
    style: JudgeStyle = "verdict-last",
) -> str:
    """The reply to a request with a ``response_format`` json_schema: a JSON object filling the
    schema's ``properties`` (``score`` gets the verdict, string properties the explanation, which
    quotes the response when the style or ``echo_response`` asks for it), after an optional think block.
    """
    explanation = judgement.explanation
    if judgement.response is not None and (echo_response or style == "verdict-then-quote"):
        explanation = f"{explanation} {_quote(judgement)}"
    reply: dict[str, Any] = {}
    for name, spec in properties.items():
        if name == "score":
            reply[name] = judgement.verdict
        elif isinstance(spec, dict) and spec.get("type") == "string":
            reply[name] = explanation
    text = json.dumps(reply, ensure_ascii=False)
    return f"{_think_block(judgement)}\n{text}" if think else text
