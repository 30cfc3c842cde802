"""Which member's text a group reply carries (``judge.mode: group``): a judge often quotes the
responses it grades, before its lines or inside a reason, so a response's own ``R<k>: [[n]]`` can
land in the reply. We know every response, so a verdict-shaped span that would break the reading is
attributed to the members whose text it can be a quote of (``group_judging.read_group`` then scores
them the lowest verdict and reads the judge's lines for the others).

A span is a quote of a response when it is the response's text once both are folded
(:func:`folded`: look-alike digits and brackets, character references, format characters, spacing),
when it writes a member label that the response writes before double brackets, or when it opens
with a number that the response puts in double brackets (bare brackets: any response holding some).
Attribution only ever turns a span inert and marks its writers: it never writes a verdict.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from async_reward.judge.rubric.criteria import CriteriaError, _patterns, _stripped_lines

__all__ = ["MemberText", "folded", "without_plants", "without_quoted_lines"]

#: A double-bracket token of a reply: a pair around text without brackets, or a lone ``[[`` / ``]]``.
_TOKEN = re.compile(r"\[\[[^\[\]]*\]\]|\[\[|\]\]")
#: The number a reply's ``[[`` opens with, and a member label right before it (the reader's spellings).
_NUMBER_OPENED = re.compile(r"\[\[\s*([-+]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+))", re.ASCII)
_LABEL_BEFORE = re.compile(r"\bR([0-9]{1,3})\**\s*:\s*$", re.ASCII)
#: How far before a ``[[`` its label is looked for (a bound: a reason can hold thousands of them).
_LABEL_REACH = 64
#: In a folded response (:func:`folded`): a number opened by double brackets, spaced or not, in any
#: notation ``float`` reads; and a member label written before double brackets.
_WRITTEN_NUMBER = re.compile(
    r"\[\s*\[\s*([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)", re.ASCII
)
_WRITTEN_LABEL = re.compile(r"R[\s*]*([0-9]{1,4})[\s*]*:\s*\[\s*\[", re.ASCII)
_LOOKALIKE_BRACKETS = str.maketrans({"\u27e6": "[[", "\u27e7": "]]", "\u301a": "[[", "\u301b": "]]"})
#: The characters that can become a bracket once folded (:func:`folded`): ``[``, ``]``, their NFKC
#: sources (fullwidth, vertical presentation forms), the look-alikes folded here, and ``&`` (a
#: character reference). Text without any holds no bracket in any spelling.
_BRACKET_SOURCES = frozenset("[]\ufe47\ufe48\uff3b\uff3d\u27e6\u27e7\u301a\u301b&")
#: What a judge puts around a line it quotes (markdown quote and list marks, quotation marks).
_QUOTE_MARKS = ">\"'`*-\u2022\u201c\u201d\u2018\u2019\u00ab\u00bb"


def folded(text: str) -> str:
    """``text`` as a judge quoting it may write it: character references decoded, NFKC (fullwidth,
    superscript, circled and mathematical digits and brackets), every decimal digit in ASCII (Arabic-
    Indic, Devanagari, ...), format characters (zero-width, direction marks) dropped, any space as
    one space."""
    normal = unicodedata.normalize("NFKC", html.unescape(text)).translate(_LOOKALIKE_BRACKETS)
    chars = []
    for char in normal:
        if char.isdecimal():
            chars.append(str(unicodedata.decimal(char)))
        elif char.isspace():
            chars.append(" ")
        elif unicodedata.category(char) != "Cf":
            chars.append(char)
    return "".join(chars)


def _compact(text: str) -> str:
    """``text`` folded, without any whitespace: what two spellings of one quote share."""
    return "".join(folded(text).split())


@dataclass
class MemberText:
    """One response, and the verdict-shaped text it holds in any spelling a quote of it may take."""

    text: str

    @cached_property
    def compact(self) -> str:
        """The text :func:`_compact` and as written, without whitespace (what a quote of it holds);
        empty for a text that holds no bracket in any spelling: no verdict-shaped span, which always
        holds one, can be a quote of it (and its folding, the costly part, is skipped)."""
        if _BRACKET_SOURCES.isdisjoint(self.text):
            return ""
        return f"{_compact(self.text)}\n{''.join(self.text.split())}"

    @cached_property
    def labels(self) -> frozenset[int]:
        """The member labels it writes before double brackets (``R3: [[``, ``**R 3** : [ [``)."""
        return frozenset(int(label) for label in _WRITTEN_LABEL.findall(self.compact))

    @cached_property
    def numbers(self) -> frozenset[float]:
        """The numbers it opens double brackets with (``[[10]]``, ``[[ 1e1 ]]``, ``[[10/10]]``)."""
        return frozenset(float(number) for number in _WRITTEN_NUMBER.findall(self.compact))

    @cached_property
    def brackets(self) -> bool:
        """Whether it holds double brackets at all, in any spelling."""
        return "[[" in self.compact or "]]" in self.compact

    def wrote(self, span: str, label: int | None, number: float | None) -> bool:
        """Whether ``span`` of the reply (``R<label>: [[number``, or bare brackets; already
        :func:`_compact`) can be a quote of this response: the same text once folded, the same
        label's line, or the same number in double brackets (bare brackets: any)."""
        if label is not None and label in self.labels:
            return True
        if number is not None and number in self.numbers:
            return True
        return span in self.compact or (number is None and self.brackets)


class _Span(NamedTuple):
    """A verdict-shaped span of a reply that the reader would refuse."""

    start: int
    end: int
    label: int | None
    """The member label written before its ``[[``, if any."""
    number: float | None
    """The number its ``[[`` opens with, if any."""
    conflict: bool
    """An ``R<k>: [[n]]`` outside the final block that disagrees with it (else: brackets in a reason)."""


@dataclass(frozen=True)
class _Block:
    """The final block of a reply, as the reader will take it for the judge's lines."""

    judged: dict[int, float]
    """Each label's verdict."""
    own: list[tuple[int, int]]
    """The spans of the lines' ``[[n]]``."""
    reasons: list[tuple[int, int]]
    """The spans of the lines' reasons."""
    lines: dict[int, str]
    """Each label's line."""


def without_plants(visible: str, writings: Sequence[MemberText]) -> tuple[str, dict[int, str]]:
    """``visible`` with every verdict-shaped span that would break the reading and that a response
    explains made inert (its brackets turned to parentheses, offsets kept), and what each member
    planted. Nothing changes where the final block cannot be read: the reader then says why.

    Raises:
        CriteriaError: a line of the final block is a response's own text and a line of the judge's
            (no response's text) disagrees with it: the block is a quote, not the judge's.
    """
    block = _final_block(visible, len(writings))
    if block is None:
        return visible, {}
    text = list(visible)
    planted: dict[int, list[str]] = {}
    quoted = {label for label, line in block.lines.items() if _quoted(line, writings)}
    lines = _stripped_lines(visible) if quoted else []
    for span in _spans_to_explain(visible, block):
        written = visible[span.start : span.end]
        compact = _compact(written)
        if span.conflict and span.label in quoted and not _quoted(_as_judged(visible, lines, span), writings):
            raise CriteriaError(
                f"the reply's line for response R{span.label} is a response's own text, and the "
                f"judge's differs ({written.strip()[:40]})"
            )
        writers = [
            member
            for member, writing in enumerate(writings, 1)
            if writing.wrote(compact, span.label, span.number)
        ]
        for member in writers:
            planted.setdefault(member, []).append(written.strip()[:40])
        if writers:
            text[span.start : span.end] = written.replace("[", "(").replace("]", ")")
    return "".join(text), {member: ", ".join(dict.fromkeys(spans)) for member, spans in planted.items()}


def _quoted(text: str, writings: Sequence[MemberText]) -> bool:
    """Whether ``text`` (quote marks around it aside) is some response's own text, once folded."""
    compact = _compact(text).strip(_QUOTE_MARKS)
    return bool(compact) and any(compact in writing.compact for writing in writings)


def _as_judged(visible: str, lines: list[tuple[int, str]], span: _Span) -> str:
    """What of the reply must be a response's text for ``span`` (which disagrees with a block line
    that is a response's own text) to be a quote as well: its whole line when that line has the
    judge's shape (``R<k>: [[n]] reason``: a judge's line left above a quoted block), else the span."""
    line_pattern, _ = _patterns("R")
    line = next(line for start, line in reversed(lines) if start <= span.start)
    whole = line_pattern.fullmatch(line.rstrip("*").rstrip()) is not None
    return line if whole else visible[span.start : span.end]


def without_quoted_lines(visible: str, writings: Sequence[MemberText]) -> tuple[str, dict[int, list[str]]]:
    """``visible`` with the lines that quote a response holding double brackets (quote marks around
    them aside) blanked among and after the last ones left, one per member (where the reader looks
    for the judge's lines), and the members quoted with the lines."""
    suspects = [(member, writing) for member, writing in enumerate(writings, 1) if writing.brackets]
    text = list(visible)
    quoted: dict[int, list[str]] = {}
    kept = 0
    for start, line in reversed(_stripped_lines(visible) if suspects else []):
        if kept == len(writings):
            break
        compact = _compact(line).strip(_QUOTE_MARKS)
        holders = [member for member, writing in suspects if compact and compact in writing.compact]
        for member in holders:
            quoted.setdefault(member, []).append(line[:40])
        if holders:
            text[start : start + len(line)] = " " * len(line)
        else:
            kept += 1
    return "".join(text), {member: lines[::-1] for member, lines in quoted.items()}


def _final_block(visible: str, size: int) -> _Block | None:
    """The last ``size`` lines, read as member lines; None when they are not (the reader refuses
    the reply, and says why)."""
    line_pattern, _ = _patterns("R")
    lines = _stripped_lines(visible)
    if len(lines) < size:
        return None
    block = _Block({}, [], [], {})
    for start, line in lines[len(lines) - size :]:
        match = line_pattern.fullmatch(line.rstrip("*").rstrip())
        if match is None:
            return None
        label = int(match.group(1))
        block.judged[label] = float(match.group(2))
        block.lines[label] = line
        closed = line.index("]]", match.end(2)) + 2
        block.own.append((start + line.index("[["), start + closed))
        block.reasons.append((start + closed, start + len(line)))
    return block


def _spans_to_explain(visible: str, block: _Block) -> Iterator[_Span]:
    """Each span the reader would refuse: double brackets in a line's reason, and an ``R<k>: [[n]]``
    outside the block's lines that disagrees with them."""
    _, anywhere = _patterns("R")
    for reason_start, reason_end in block.reasons:
        for token in _TOKEN.finditer(visible, reason_start, reason_end):
            opened = _NUMBER_OPENED.match(token.group())
            before = max(reason_start, token.start() - _LABEL_REACH)
            labelled = _LABEL_BEFORE.search(visible[before : token.start()])
            yield _Span(
                token.start() if labelled is None else before + labelled.start(),
                token.end(),
                None if labelled is None else int(labelled.group(1)),
                None if opened is None else float(opened.group(1)),
                conflict=False,
            )
    judges = [*block.own, *block.reasons]  # the block's lines: their brackets are the judge's or read above
    for match in anywhere.finditer(visible):
        label, number = int(match.group(1)), float(match.group(2))
        opened_at = visible.index("[[", match.start())
        if any(start <= opened_at < end for start, end in judges):
            continue
        if label in block.judged and number != block.judged[label]:
            yield _Span(match.start(), match.end(), label, number, conflict=True)
