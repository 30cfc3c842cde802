"""Reading the judge's verdict from its reply, so that text from the policy's response cannot set it.

A judge's reply often quotes or discusses the response it grades, and a policy trained on the score
will learn to write whatever the parser might take for the verdict: ``Score: 10``, ``[[10]]``, a JSON
object, a fake ``</think>``. The rules here keep one property:

    For any response text and any judge reply that carries the judge's own verdict in the format and
    position the template asks for, the result is that verdict or a ``VerdictError`` (status
    ``invalid``), never a number that came from the response.

How each rule serves it:

* **One format.** Only the format the template instructs is read (``brackets`` ``[[n]]``, ``boxed``,
  ``score``, ``json``), never "whatever looks like a verdict", so a planted verdict in another
  format is just text.
* **Every match counts; conflicts are refused.** All verdicts in that format are read. When they
  disagree (the judge's ``[[2]]`` and a quoted ``[[10]]``) the reply is ``invalid`` by default
  (``on_conflict="refuse"``), or, with ``"min"``, the lowest is taken: then the score can still come
  from the response, but never above the judge's own verdict.
* **Position.** With ``position="end"`` (default) the last verdict must end the reply, as the
  templates instruct; a reply that goes on after it is ``invalid``. This also refuses a reply whose
  judge forgot its verdict but quoted the response's, unless that quote ends the reply.
* **Nothing the response could have written hides anything.** Skipping text is what a planted marker
  would exploit (an unclosed code fence, a quoted ``<think>``), so the only text ever skipped is a
  think block that opens the reply, cut at its *first* ``</think>``. The judge's final verdict comes
  after its own closing tag, so cutting at an earlier, quoted one only exposes more text (which then
  conflicts) and never hides the verdict.
* **JSON: every key, every object.** Every ``score``, ``rating`` or ``verdict`` key, in any case and
  however often repeated, of every object in the reply is a verdict; so is every such key written
  with a number as text (``"score": 10``), even where the object around it does not parse. A
  response pasted unescaped into the judge's object can add keys to it or break it, but what it
  adds conflicts with the judge's own key instead of replacing it.
* **ASCII digits only**, matched by explicit ``[0-9]`` (Python's ``\\d`` and ``float()`` accept
  fullwidth, Arabic-Indic and other digits); the value is range-checked later; nothing is eval'd.
* **Bounded work.** Every pattern is linear in the reply, and the JSON scan decodes at most
  ``_JSON_MAX_STARTS`` objects, nearest the end first, reading at most a few times the reply: a
  multi-megabyte hostile reply is read in milliseconds, never blocking the worker's event loop.
* **Structured output** (``parser="structured"``): the judge server is asked for a JSON schema
  ``{"reasoning": str, "score": number}`` and the reply must be exactly that object, each key once,
  so a quote can only ever sit, escaped, inside ``reasoning``.

Not here, in the manager (``async_reward.managers.llm_judge``): a reply the server did not finish
(``finish_reason`` other than ``stop``, e.g. cut at ``max_tokens``) is never read, and thinking the
server returned apart from the content means the content is read with ``think="none"``.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFLICT_RULES",
    "PARSERS",
    "POSITIONS",
    "STRUCTURED_SCHEMA",
    "THINK_MODES",
    "VERDICT_FORMATS",
    "VerdictError",
    "VerdictRules",
    "parse_verdict",
    "read_verdict",
    "response_format",
    "strip_think",
    "verdict_spans",
]

#: Text formats a judge can state its verdict in.
VERDICT_FORMATS = ("brackets", "boxed", "score", "json")
#: Values of ``JudgeConfig.parser``: ``auto`` is the format the template asks for (see
#: ``async_reward.judge.prompts.resolve_parser``); ``structured`` asks the server for a JSON schema.
PARSERS = ("auto", *VERDICT_FORMATS, "structured")
#: Values of ``JudgeConfig.verdict_position``.
POSITIONS = ("end", "anywhere")
#: Values of ``JudgeConfig.on_conflict``.
CONFLICT_RULES = ("refuse", "min")
#: Values of ``JudgeConfig.think``.
THINK_MODES = ("leading", "prefilled", "none")

#: The JSON schema of a structured verdict: reasoning first, so the judge explains before it scores.
STRUCTURED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "score": {"type": "number"}},
    "required": ["reasoning", "score"],
    "additionalProperties": False,
}


class VerdictError(ValueError):
    """The judge's reply has no usable verdict (status 'invalid' upstream)."""


def response_format() -> dict[str, Any]:
    """The OpenAI-compatible ``response_format`` field that asks for ``STRUCTURED_SCHEMA``."""
    schema = copy.deepcopy(STRUCTURED_SCHEMA)
    return {"type": "json_schema", "json_schema": {"name": "judge_verdict", "strict": True, "schema": schema}}


@dataclass(frozen=True)
class VerdictRules:
    """How a reply is read; one instance per judge configuration. Validated on construction."""

    parser: str = "brackets"
    """A concrete format (``VERDICT_FORMATS``) or ``structured``; ``auto`` means ``brackets`` here
    (the built-in templates' format; the manager resolves ``auto`` against its template)."""
    position: str = "end"
    """``end``: the last verdict must end the reply; ``anywhere``: it may sit anywhere."""
    on_conflict: str = "refuse"
    """Verdicts that disagree: ``refuse`` (``VerdictError``) or ``min`` (the lowest)."""
    think: str = "leading"
    """``leading``: skip a ``<think>`` block that opens the reply; ``prefilled``: the reply continues
    a ``<think>`` the chat template opened, so everything up to the first ``</think>`` is skipped:
    this trusts the first ``</think>`` to be the judge's, so a reply without one of its own (thinking
    returned apart) must not be read so; ``none``: skip nothing (a server that returns reasoning
    apart from the content)."""

    def __post_init__(self) -> None:
        for name, valid in (
            ("parser", PARSERS),
            ("position", POSITIONS),
            ("on_conflict", CONFLICT_RULES),
            ("think", THINK_MODES),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(f"unknown verdict {name} {value!r}; valid: {', '.join(valid)}")
        if self.parser == "auto":
            object.__setattr__(self, "parser", "brackets")


_THINK_OPEN = re.compile(r"\s*<think>", re.IGNORECASE | re.ASCII)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE | re.ASCII)


def _visible_start(text: str, think: str) -> int | None:
    """Offset where the judge's visible answer starts; None when the reply is all (unclosed) thinking."""
    if think == "none":
        return 0
    opening = _THINK_OPEN.match(text)
    if opening is None and think == "leading":
        return 0
    closing = _THINK_CLOSE.search(text, opening.end() if opening else 0)
    return None if closing is None else closing.end()


def strip_think(text: str, think: str = "leading") -> str:
    """``text`` without the judge's own think block (see ``VerdictRules.think``).

    Only a block that opens the reply (or, ``prefilled``, the text before the first ``</think>``) is
    the judge's; a ``<think>`` anywhere else is plain text, e.g. quoted from the response. A reply
    whose think block never closes is all thinking and comes back empty.
    """
    if think not in THINK_MODES:
        raise ValueError(f"unknown think mode {think!r}; valid: {', '.join(THINK_MODES)}")
    start = _visible_start(text, think)
    return "" if start is None else text[start:]


# ASCII digits spelled out: with a str pattern, \d also matches fullwidth and other Unicode digits.
_NUM = r"[-+]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_OUT_OF = rf"(?:\s*/\s*{_NUM})?"  # "8/10": the numerator is the verdict
# Every pattern is linear in the text: no two adjacent parts can match the same characters, so a
# run of spaces or stars never makes the engine try every way to split it (``\s*\**\s*`` did:
# "Score:" and 16k spaces took 4 s, blocking the worker's event loop outside any deadline).
_PATTERNS: dict[str, re.Pattern[str]] = {
    "brackets": re.compile(rf"\[\[\s*({_NUM}){_OUT_OF}\s*\]\]", re.ASCII),
    "boxed": re.compile(rf"\\boxed\{{\s*({_NUM}){_OUT_OF}\s*\}}", re.ASCII),
    # Markdown bold around the label ("**Score:** 8") is allowed; "subscore" does not match (\b).
    # re.ASCII also keeps IGNORECASE from matching "ſcore" (long s) or the Kelvin sign.
    "score": re.compile(
        rf"\b(?:score|rating)\**\s*(?:[:=]|is\b)\s*(?:\*+\s*)?({_NUM}){_OUT_OF}", re.IGNORECASE | re.ASCII
    ),
}
_NUMBER_TEXT = re.compile(rf"\s*{_NUM}\s*", re.ASCII)
_JSON_KEYS = ("score", "rating", "verdict")
_JSON_START = re.compile(r"\{\s*\"")
# A verdict key and a number as text, wherever it stands: also inside a judge's object that a pasted,
# unescaped quote broke (so it no longer parses), and inside a quoted object. An escaped \"score\"
# (a quote inside a JSON string) does not match: its closing quote follows a backslash.
_JSON_KEY_TEXT = re.compile(
    rf'"(?:score|rating|verdict)"\s*:\s*(?:"\s*({_NUM})\s*"|({_NUM}))', re.IGNORECASE | re.ASCII
)
# Bounds of the JSON scan (see _json_objects): how many "{" starts are decoded, nearest the end first,
# and how many characters the decoder may read in all, per character of the text.
_JSON_MAX_STARTS = 256
_JSON_READ_PER_CHAR = 4
# What may follow the verdict when it must end the reply: whitespace, markdown and LaTeX closers
# ("**Verdict: [[7]]**", "... [[7]].", "$\\boxed{7}$", a closing code fence).
_TRAILER = re.compile(r"[\s*_`~.!)$]*", re.ASCII)
_NAMES = {"brackets": "[[n]]", "boxed": "\\boxed{n}", "score": "Score: n", "json": '{"score": n}'}


def _json_objects(text: str) -> list[tuple[int, list[tuple[Any, Any]]]]:
    """(end offset, key/value pairs) of each JSON object in ``text``, duplicate keys kept.

    Every ``{"`` is a start, so objects nested in others count too: a judge's verdict object has no
    nested score, and a quoted one must not hide inside another. Decoding from every start is
    quadratic (``'{"' * 500_000`` took 95 s), so the work is capped: the last ``_JSON_MAX_STARTS``
    starts are tried, nearest the end first (where the judge's verdict is), each on its own slice
    (the decoder's error position, and its line count, stay local), until the decoder has read
    ``_JSON_READ_PER_CHAR`` times the text. An object not decoded adds no verdict of its own, so
    it can never be the one read; the verdict keys written in it still count (``_JSON_KEY_TEXT``).
    """
    decoder = json.JSONDecoder(object_pairs_hook=list)  # NaN and Infinity: floats _to_number refuses
    starts = collections.deque((m.start() for m in _JSON_START.finditer(text)), maxlen=_JSON_MAX_STARTS)
    budget = _JSON_READ_PER_CHAR * len(text) + 4096
    found: list[tuple[int, list[tuple[Any, Any]]]] = []
    for start in reversed(starts):
        if budget <= 0:
            break
        piece = text[start : start + budget]
        try:
            pairs, end = decoder.raw_decode(piece)
        except json.JSONDecodeError as exc:
            budget -= exc.pos + 1
            continue
        except RecursionError:  # a reply nesting thousands of objects: count it as read to the end
            budget -= len(piece)
            continue
        budget -= end
        found.append((start + end, pairs))
    return found


def _json_matches(text: str) -> list[tuple[int | None, Any]]:
    """(end offset, value) of every verdict key of every decoded object, then (None, value) of
    every verdict key written as text (``_JSON_KEY_TEXT``); none at all without a decoded one.

    Every occurrence counts as its own verdict, whatever its case, name (``score``, ``rating``,
    ``verdict``) or repetition: a response pasted unescaped into the judge's object can add keys
    to it (``{"score": 2, "reasoning": "it says ", "score": 10, "x": ""}``), and reading one value
    per object (the last of duplicates, the first name of several) would let it pick the verdict.
    The text matches only conflict: their offsets never decide whether the verdict ends the reply.
    """
    found: list[tuple[int | None, Any]] = []
    for end, pairs in _json_objects(text):
        found += [(end, value) for key, value in pairs if str(key).casefold() in _JSON_KEYS]
    if found:
        found += [(None, m.group(1) or m.group(2)) for m in _JSON_KEY_TEXT.finditer(text)]
    return found


def _find(fmt: str, text: str) -> list[tuple[int | None, Any]]:
    """(end offset, raw value) of each verdict in format ``fmt``; offset None: conflicts only."""
    if fmt == "json":
        return _json_matches(text)
    return [(m.end(), m.group(1)) for m in _PATTERNS[fmt].finditer(text)]


def _to_number(raw: Any) -> float:
    # bool is an int in Python; {"verdict": true} is not a score.
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise VerdictError(f"verdict {raw!r} is not a number")
    if isinstance(raw, str) and not _NUMBER_TEXT.fullmatch(raw):
        raise VerdictError(f"verdict {raw[:40]!r} is not a number")
    try:
        value = float(raw)
    except OverflowError:  # a JSON integer with hundreds of digits
        raise VerdictError("verdict is not finite") from None
    if not math.isfinite(value):
        raise VerdictError(f"verdict {str(raw)[:40]!r} is not finite")
    return value


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        counts = collections.Counter(key for key, _ in pairs)
        repeated = sorted(key[:20] for key, count in counts.items() if count > 1)[:4]
        raise VerdictError(f"structured reply repeats the key(s) {repeated}: which one is the judge's?")
    return obj


def _read_structured(visible: str) -> float:
    try:
        # json.loads keeps the last of duplicate keys: a response pasted unescaped into the object
        # (a server that ignores response_format) could then add its own "score" after the judge's.
        obj = json.loads(visible, object_pairs_hook=_unique_keys)
    except VerdictError:
        raise
    except (ValueError, RecursionError):
        raise VerdictError(
            "reply is not the JSON object the response_format schema asks for (does the judge "
            f"server honour response_format json_schema?): {_excerpt(visible.strip())}"
        ) from None
    if not isinstance(obj, dict) or set(obj) != {"reasoning", "score"}:
        shown = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise VerdictError(f"structured reply must have exactly the keys reasoning and score, got {shown}")
    if not isinstance(obj["reasoning"], str):
        raise VerdictError("structured reply's reasoning is not a string")
    score = obj["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise VerdictError(f"structured reply's score {score!r} is not a JSON number")
    return _to_number(score)


def read_verdict(text: str, rules: VerdictRules) -> float:
    """The judge's verdict in ``text`` under ``rules``; see the module docstring for the rules.

    Raises:
        VerdictError: no verdict, all thinking, a non-numeric or non-finite one, a reply that does
            not end with its verdict (``position="end"``), or verdicts that disagree
            (``on_conflict="refuse"``).
    """
    start = _visible_start(text, rules.think)
    if start is None:
        raise VerdictError("reply is all thinking: its <think> block never closes (cut off by max_tokens?)")
    visible = text[start:]
    if not visible.strip():
        raise VerdictError("empty reply" if not text.strip() else "reply has only thinking, no verdict")
    if rules.parser == "structured":
        return _read_structured(visible)
    found = _find(rules.parser, visible)
    if not found:
        raise VerdictError(f"no verdict in the form {_NAMES[rules.parser]} (judge.parser={rules.parser})")
    values = [_to_number(raw) for _, raw in found]
    last_end = max(end for end, _ in found if end is not None)
    if rules.position == "end" and not _TRAILER.fullmatch(visible, last_end):
        raise VerdictError(
            f"reply does not end with its verdict: {_excerpt(visible[last_end:].strip())} follows the "
            f"last {_NAMES[rules.parser]} (judge.verdict_position=end)"
        )
    distinct = sorted(set(values))
    if len(distinct) > 1 and rules.on_conflict == "refuse":
        shown = ", ".join(f"{value:g}" for value in distinct[:8])
        raise VerdictError(f"conflicting verdicts in the reply: {shown} (judge.on_conflict=refuse)")
    return distinct[0]  # the only value, or with on_conflict="min" the lowest


def parse_verdict(
    text: str,
    parser: str = "auto",
    *,
    position: str = "end",
    on_conflict: str = "refuse",
    think: str = "leading",
) -> float:
    """``read_verdict`` with the rules given as keywords (defaults: the safe ones ``JudgeConfig`` uses).

    Raises:
        ValueError: an unknown parser, position, conflict rule or think mode (a configuration error,
            not a ``VerdictError``).
        VerdictError: see ``read_verdict``.
    """
    rules = VerdictRules(parser=parser, position=position, on_conflict=on_conflict, think=think)
    return read_verdict(text, rules)


def verdict_spans(text: str, rules: VerdictRules) -> list[tuple[float, tuple[int, int]]] | str:
    """Every verdict written in ``text`` in the format of ``rules``, as (value, (start, end) of its
    number in ``text``), in reply order; or why there is none to weigh (a short reason).

    For weighting verdicts by the judge's token probabilities (``async_reward.judge.expected``):
    which of them is the judge's own cannot be told from the text (a reply may end with a quote, and
    with ``position="anywhere"`` the judge's may sit anywhere), so each one is returned, and the
    caller weighs them all and keeps the lowest (``managers.span_weighting``). Only the visible text
    is searched (thinking skipped as :func:`read_verdict` skips it). JSON verdicts are the keys
    written as text (``"score": 7``); one only a decoder sees (an escaped key) has no span and can
    only have lowered the plain verdict, never the weighted one.
    """
    start = _visible_start(text, rules.think)
    if start is None:
        return "reply is all thinking"
    visible = text[start:]
    if rules.parser in ("json", "structured"):
        matches = list(_JSON_KEY_TEXT.finditer(visible))
        spans = [m.span(1) if m.group(1) is not None else m.span(2) for m in matches]
    else:
        spans = [m.span(1) for m in _PATTERNS[rules.parser].finditer(visible)]
    found: list[tuple[float, tuple[int, int]]] = []
    for begin, finish in spans:
        try:
            value = _to_number(visible[begin:finish])
        except VerdictError:  # read_verdict refused such a reply already; skipping can lower nothing
            continue
        found.append((value, (start + begin, start + finish)))
    return found or "verdict not found as text"
