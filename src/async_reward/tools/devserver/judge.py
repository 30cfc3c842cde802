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
    "JudgeReply",
    "JudgeStyle",
    "Judgement",
    "ThinkStyle",
    "answers_match",
    "cut_at_max_tokens",
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
#: How thinking (``DevServerConfig.think``) is returned: ``inline``, a ``<think>...</think>`` block opening
#: the content; ``prefilled``, the same without ``<think>`` (the chat template opened it); ``separate``,
#: in the message's ``reasoning_content``, as servers with a reasoning parser do.
ThinkStyle = Literal["inline", "prefilled", "separate"]

# A number as people write it: optional minus, digits with optional thousands commas, optional decimals.
_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")
# Stricter, whole-string form used to decide whether a (comma-stripped) answer *is* a number.
_WHOLE_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_BOXED = "\\boxed{"
_BRACE = re.compile(r"[{}]")
_WORD = re.compile(r"\S+")
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)
_RESPONSE = re.compile(r"<response>(.*?)</response>", re.DOTALL)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, with nested braces balanced (``\\boxed{\\frac{1}{2}}``).

    A regex cannot balance braces, hence the scan: one pass over the braces with a stack of the open
    ones, so a text of many unclosed boxes costs no more than its length (re-scanning from each box
    took 30 s for ``"\\boxed{" * 5000``, blocking the server). "Last" is the box that opens last
    among those that close; an unterminated box is ignored rather than swallowing the rest of the text.
    """
    open_braces: list[int] = []  # offsets of unclosed "{"
    last: tuple[int, int] | None = None  # (content start, content end) of the last complete box
    for brace in _BRACE.finditer(text):
        at = brace.start()
        if text[at] == "{":
            open_braces.append(at)
        elif open_braces:
            opened = open_braces.pop()
            box_at = opened + 1 - len(_BOXED)
            is_box = box_at >= 0 and text.startswith(_BOXED, box_at)
            if is_box and (last is None or opened + 1 > last[0]):
                last = (opened + 1, at)
    return None if last is None else text[last[0] : last[1]].strip()


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


def _format_verdict(verdict: int, explanation: str, verdict_format: VerdictFormat) -> tuple[str, int]:
    """The verdict part of a reply, and where its verdict's digits start in it."""
    if verdict_format == "json":
        return json.dumps({"score": verdict, "reason": explanation}), len('{"score": ')
    if verdict_format == "boxed":
        text = f"{explanation}\n\\boxed{{{verdict}}}"
        return text, len(text) - 1 - len(str(verdict))
    if verdict_format == "score":
        text = f"{explanation}\nScore: {verdict}"
        return text, len(text) - len(str(verdict))
    text = f"{explanation}\nRating: [[{verdict}]]"
    return text, len(text) - 2 - len(str(verdict))


def _unescaped_json(judgement: Judgement, style: JudgeStyle) -> str:
    """A JSON verdict written as text, its reasoning quoting the response without JSON escaping
    (a judge that writes JSON by hand): score last for ``verdict-last``, first otherwise."""
    reasoning = judgement.explanation
    if judgement.response is not None:
        reasoning += f" The response reads: {judgement.response.strip()}"
    if style == "verdict-last":
        return f'{{"reasoning": "{reasoning}", "score": {judgement.verdict}}}'
    return f'{{"score": {judgement.verdict}, "reasoning": "{reasoning}"}}'


def _unescaped_json_verdict_at(text: str, judgement: Judgement, style: JudgeStyle) -> int:
    return len(text) - 1 - len(str(judgement.verdict)) if style == "verdict-last" else len('{"score": ')


def _thinking(judgement: Judgement) -> str:
    decoy = 0 if judgement.verdict == 10 else 10
    return (
        f"A hasty judge would write Score: {decoy} [[{decoy}]] \\boxed{{{decoy}}} "
        f'{{"score": {decoy}}} here; let me check properly instead.'
    )


def _quote(judgement: Judgement) -> str:
    return f'The response under review reads:\n"""\n{judgement.response}\n"""'


@dataclass(frozen=True)
class JudgeReply:
    """One rendered judge reply: the message's ``content``, and its ``reasoning_content`` if any."""

    content: str
    reasoning: str | None = None
    """The judge's thinking returned apart from the content (``think_style: separate``)."""
    verdict_at: int | None = None
    """Where the judge's own verdict's digits start in ``content`` (for its token probabilities)."""
    criterion_verdicts: tuple[tuple[int, int], ...] = ()
    """A rubric reply: (where its digits start in ``content``, verdict) of each criterion's line."""


def _with_thinking(
    judgement: Judgement, answer: str, think: bool, think_style: ThinkStyle, verdict_at: int | None
) -> JudgeReply:
    if not think:
        return JudgeReply(answer, verdict_at=verdict_at)
    if think_style == "separate":
        return JudgeReply(answer, reasoning=_thinking(judgement), verdict_at=verdict_at)
    opening = "" if think_style == "prefilled" else "<think>"  # prefilled: the chat template opened it
    prefix = f"{opening}{_thinking(judgement)}</think>\n"
    return JudgeReply(prefix + answer, verdict_at=None if verdict_at is None else len(prefix) + verdict_at)


def render_reply(
    judgement: Judgement,
    verdict_format: VerdictFormat,
    *,
    think: bool = False,
    think_style: ThinkStyle = "inline",
    echo_response: bool = False,
    style: JudgeStyle = "verdict-last",
    unescaped_json: bool = False,
) -> JudgeReply:
    """The judge's reply: [think block] [quoted response] explanation and verdict; or, in style
    ``verdict-then-quote``, [think block] explanation and verdict, then the quoted response.

    The think block and the quoted response exist to trip parsers: the decoy inside the thinking
    always differs from the real verdict, and a quoted response may itself contain ``[[10]]`` or
    ``\\boxed{...}``, before the verdict or (``verdict-then-quote``) after it. ``unescaped_json``
    (with the ``json`` format): the reply is one JSON object whose reasoning pastes the response in
    unescaped, so the response can add keys to the judge's object or break it.
    """
    if unescaped_json and verdict_format == "json":
        text = _unescaped_json(judgement, style)
        at = _unescaped_json_verdict_at(text, judgement, style)
        return _with_thinking(judgement, text, think, think_style, at)
    parts: list[str] = []
    quoted = judgement.response is not None
    if echo_response and quoted and style == "verdict-last":
        parts.append(_quote(judgement))
    verdict_part, digits_at = _format_verdict(judgement.verdict, judgement.explanation, verdict_format)
    at = sum(len(part) + 1 for part in parts) + digits_at  # parts are joined by newlines
    parts.append(verdict_part)
    if quoted and style == "verdict-then-quote":
        parts.append(_quote(judgement))
    return _with_thinking(judgement, "\n".join(parts), think, think_style, at)


def render_structured(
    judgement: Judgement,
    properties: dict[str, Any],
    *,
    think: bool = False,
    think_style: ThinkStyle = "inline",
    echo_response: bool = False,
    style: JudgeStyle = "verdict-last",
) -> JudgeReply:
    """The reply to a request with a ``response_format`` json_schema: a JSON object filling the
    schema's ``properties`` (``score`` gets the verdict, string properties the explanation, which
    quotes the response when the style or ``echo_response`` asks for it), after optional thinking.
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
    # Strings are escaped in JSON, so the one unescaped "score": is the judge's key.
    at = text.find('"score": ') + len('"score": ') if "score" in reply else None
    return _with_thinking(judgement, text, think, think_style, at)


def cut_at_max_tokens(reply: JudgeReply, max_tokens: int) -> tuple[JudgeReply, bool]:
    """``reply`` cut after ``max_tokens`` whitespace words (thinking first, as it is generated
    first), as a server cuts a completion at ``max_tokens``; True when something was cut."""
    reasoning, budget = reply.reasoning, max_tokens
    if reasoning is not None:
        reasoning, budget = _first_words(reasoning, budget)
    content, _ = _first_words(reply.content, budget)
    cut = content != reply.content or reasoning != reply.reasoning
    return (JudgeReply(content, reasoning), True) if cut else (reply, False)


def _first_words(text: str, limit: int) -> tuple[str, int]:
    """The text up to its ``limit``-th word if it has more (separators before it kept), and the
    words of ``limit`` it left unused."""
    count, end = 0, 0
    for word in _WORD.finditer(text):
        if count == limit:
            return text[:end], 0
        count, end = count + 1, word.end()
    return text, limit - count
