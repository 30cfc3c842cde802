"""Which member's text a group reply carries (``judge.mode: group``): a judge often quotes the
responses it grades, before its lines or inside a reason, so a response's own ``R<k>: [[n]]`` can
land in the reply. We know every response, so a verdict-shaped span that would break the reading is
attributed to the members whose text it is a quote of (``group_judging.read_group`` then scores
them the lowest verdict and reads the judge's lines for the others).

Attribution takes the narrowest evidence, because blaming a member that planted nothing lowers its
reward, and with it the group's mean: the planter's GRPO advantage rises. Texts are compared once
folded (:func:`folded`: look-alike digits and brackets, character references, format characters,
spacing):

* **A span with a member label before its ``[[``** (``R2: [[1]]``, in a reason or disagreeing
  with the final block elsewhere) is blamed on each member whose text holds the whole span: an
  exact quote. Code that merely shares its number (a matrix ``[[1, 2]]``, an index ``x[idx[0]]``)
  is no quote of ``R2: [[1]]``.
* Only when no member holds it (a judge that misquoted: ``[[10.0]]`` for ``[[10]]``) is it blamed
  on the members that write that label before double brackets, and failing those, on the members
  that open double brackets with that number. Such a rule can match an innocent member as well, and
  all its matches are blamed: refusing the reply instead would fail the whole group, and under
  ``on_failure: exclude`` (or a fallback score) a wrong planter would escape its negative advantage
  entirely, which no misquote should buy it.
* **Brackets in a reason without a label** (a lone ``[[`` / ``]]``, ``[[text]]``, or even a whole
  ``[[7]]``) claim no member's verdict: the reader takes each line's first ``[[n]]``, after its
  label. Held by some member's text (or, for a whole ``[[n]]``, some member opens double brackets
  with n: a misquote), the span is made inert and nobody is blamed (a judge citing ``x[idx[0]]``, a
  matrix or a ``[[0]]`` from the code it grades: blaming every member holding ``[[0]]`` would hit
  innocents, and a planter gains nothing from such a span); explained by none, it stays and the
  reader refuses the reply (the judge's own doing, such as a second verdict on a line).

Lines a judge quotes among or after its own (:func:`without_quoted_lines`) are set aside only when
they hold double brackets, and blamed on the members holding them only when they write a member
label before them. Attribution only ever turns text inert and marks its writers: it never writes a verdict.
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
#: A double-bracket pair that reads as a verdict once :func:`_compact`: a number, maybe out of a scale
#: (``[[7]]``, ``[[7/10]]``).
_VERDICT_TOKEN = re.compile(
    r"\[\[\s*([-+]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+))\s*(?:/\s*[0-9]+(?:\.[0-9]+)?\s*)?\]\]", re.ASCII
)
#: A member label right before a reply's ``[[`` (the reader's spellings), glued to a word before it
#: or not (``correctR2: [[3]]``, a quote whose line breaks the judge dropped, still names R2: the
#: longer span is the narrower evidence).
_LABEL_BEFORE = re.compile(r"R([0-9]{1,3})\**\s*:\s*$", re.ASCII)
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
        """The numbers it opens double brackets with (``[[10]]``, ``[[ 1e1 ]]``, ``[[10/10]]``, and
        ``[[1, 2]]`` too: only a fallback for a misquoted span looks here)."""
        return frozenset(float(number) for number in _WRITTEN_NUMBER.findall(self.compact))

    @cached_property
    def brackets(self) -> bool:
        """Whether it holds double brackets at all, in any spelling."""
        return "[[" in self.compact or "]]" in self.compact

    def holds(self, span: str) -> bool:
        """Whether ``span`` (already :func:`_compact`) is a quote of this response: it holds the
        whole span once both are folded."""
        return span in self.compact

    def explains(self, span: str, number: float | None) -> bool:
        """Whether an unlabelled ``span`` of a reason (already :func:`_compact`; ``number``: the
        verdict it reads as, if any) can come from this response: it holds the span, or opens double
        brackets with that number (a misquote: ``[[10.0]]`` for ``[[10]]``)."""
        return self.holds(span) or (number is not None and number in self.numbers)


def _writers(span: str, label: int | None, number: float | None, writings: Sequence[MemberText]) -> list[int]:
    """The members (1-based) a verdict-shaped ``span`` of the reply (``R<label>: [[number``; already
    :func:`_compact`) is blamed on: those holding it whole; when none does (a misquote), those
    writing that label before double brackets; failing those, those opening double brackets with
    that number. Each fallback keeps all its matches (the module docstring says why)."""
    exact = [member for member, writing in enumerate(writings, 1) if writing.holds(span)]
    if exact:
        return exact
    if label is not None:
        labelled = [member for member, writing in enumerate(writings, 1) if label in writing.labels]
        if labelled:
            return labelled
    if number is None:
        return []
    return [member for member, writing in enumerate(writings, 1) if number in writing.numbers]


def _verdict_shaped(compact: str) -> bool:
    """Whether ``compact`` (:func:`_compact` text) writes a member label before double brackets:
    what can claim a member's verdict (brackets without a label cannot: the reader's lines start with
    ``R<k>:``)."""
    return _WRITTEN_LABEL.search(compact) is not None


class _Span(NamedTuple):
    """A verdict-shaped span of a reply that the reader would refuse."""

    start: int
    end: int
    label: int | None
    """The member label written before its ``[[``, if any."""
    number: float | None
    """The number it reads as, if it is a whole verdict (``[[n]]``) or a labelled one (``R<k>: [[n]]``)."""
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
    """``visible`` with every span that would break the reading and that a response explains made
    inert (its brackets turned to parentheses, offsets kept), and what each member planted (the
    verdict-shaped spans blamed on it, by the module docstring's rules; bare brackets are made inert
    and blamed on nobody). Nothing changes where the final block cannot be read: the reader then
    says why.

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
        if span.label is None:  # in a reason, no label: a verdict for nobody, so blamed on nobody
            writers, inert = [], any(writing.explains(compact, span.number) for writing in writings)
        else:
            writers = _writers(compact, span.label, span.number, writings)
            inert = bool(writers)
        for member in writers:
            planted.setdefault(member, []).append(written.strip()[:40])
        if inert:
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
    """``visible`` with the lines that quote a response (quote marks around them aside) and hold
    double brackets blanked among and after the last ones left, one per member (where the reader
    looks for the judge's lines), and the members blamed with the lines: those holding a blanked
    line that writes a member label before them. A line without double brackets is never blanked
    (it cannot be a planted verdict line: left where the judge's lines should be, the reply stays
    unreadable, the judge's doing), and a blanked line without a label (a quoted matrix) is blamed
    on nobody."""
    suspects = [writing for writing in writings if writing.brackets]
    text = list(visible)
    quoted: dict[int, list[str]] = {}
    kept = 0
    for start, line in reversed(_stripped_lines(visible) if suspects else []):
        if kept == len(writings):
            break
        compact = _compact(line).strip(_QUOTE_MARKS)
        if ("[[" in compact or "]]" in compact) and any(writing.holds(compact) for writing in suspects):
            text[start : start + len(line)] = " " * len(line)
            if _verdict_shaped(compact):
                for member, writing in enumerate(writings, 1):
                    if writing.holds(compact):
                        quoted.setdefault(member, []).append(line[:40])
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
            verdict = _VERDICT_TOKEN.fullmatch(_compact(token.group()))
            before = max(reason_start, token.start() - _LABEL_REACH)
            labelled = _LABEL_BEFORE.search(visible[before : token.start()])
            yield _Span(
                token.start() if labelled is None else before + labelled.start(),
                token.end(),
                None if labelled is None else int(labelled.group(1)),
                None if verdict is None else float(verdict.group(1)),
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
