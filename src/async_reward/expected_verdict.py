"""The verdict weighted by the judge's own token probabilities (``judge.expected_verdict``).

A judge that samples one digit makes ties: when every response of a GRPO group gets the same verdict
the group's advantage is zero and it teaches nothing. Where the server returns token log-probabilities
(OpenAI's ``logprobs`` / ``top_logprobs``, which vLLM and SGLang implement), the score is instead the
expected verdict under the judge's distribution at the place where it wrote its verdict.

The rule, which reads nothing but the judge's own tokens:

1. The verdict rules read the reply as always (``async_reward.verdict``); the verdict's characters are
   located there (:func:`async_reward.verdict.verdict_span`): the last verdict, which the judge wrote
   at the end. A reply with verdicts that disagree, or a verdict that is not a whole number, is not
   weighted (the plain verdict stands, and the sample says why).
2. The reply's tokens (``logprobs.content``) are aligned to its text by their bytes; the reply's text
   must end on a token boundary of what the tokens spell, which may hold more before it (a server may
   put the judge's thinking first) and after it (vLLM lists the end-of-sequence token, ``<|im_end|>``,
   and the tokens of a stop string, which the reply's text leaves out). Where a server renders a
   character split over two tokens lossily (U+FFFD each, as vLLM's ``bytes`` do), the text from the
   verdict on is aligned instead. The tokens that spell the verdict must start and end at its edges
   (leading whitespace in its first token is allowed: ``" 7"``) and be digits only.
3. Along the verdict's tokens, each alternative the server lists is a verdict in its own right:
   - an alternative that starts with digits at position *i* continues the digits written before it
     (``prefix`` + its digits). Where the token ends in a non-digit (``8]]``) the number ended there.
     Where it is digits only, what would have followed was never generated: it is a verdict only when
     no longer number on the scale could start with it, and is dropped otherwise (on a 0-10 scale a
     ``1`` is 1 or the first token of 10, as a digit-splitting tokenizer writes it: weighing it as 1
     scored a judge torn between 9 and 10 near 5);
   - a non-digit alternative after the first position ends the number: ``prefix`` (the ``1`` of a
     ``10`` written as ``1``, ``0`` when ``]]`` was as likely as ``0``);
   - the token after the verdict is read the same way (a digit there would have made a longer one).
   Each candidate's probability is the product of the sampled tokens before it and its own.
   Candidates outside ``[min_score, max_score]``, and non-digit alternatives at the first position
   (no verdict at all), are dropped; the rest are renormalised.
4. The expected verdict is the probability-weighted mean of the candidates. ``mass``, the share of
   probability they covered before renormalising, is kept in the sample's extras.

A server that returns no log-probabilities leaves the plain verdict, said once in the log and on every
such sample (``judge_weighting``), never a silent mix. With a rubric (``judge.criteria``) the same rule
weighs each criterion's verdict at the digits of its own line (``managers.criteria_weighting``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from async_reward.start_lines import say_once

__all__ = [
    "NO_LOGPROBS",
    "ExpectedVerdict",
    "ReplyToken",
    "expected_verdict",
    "reply_tokens",
    "say_unweighted",
]

#: Why a reply kept its plain verdict when the server sent no token probabilities.
NO_LOGPROBS = "no logprobs in the reply"


def say_unweighted(reason: str) -> None:
    """Say in the log, once per reason, that ``judge.expected_verdict`` is on but a reply kept its
    plain verdict (a user who turned weighting on sees why replies were not weighted; every sample
    says it too, in ``judge_weighting``)."""
    if reason == NO_LOGPROBS:
        say_once(
            "judge.expected_verdict is on, but the judge returned no token probabilities (logprobs): "
            "such replies score their plain verdict (judge_weighting says so on each sample)"
        )
    else:
        say_once(
            f"judge.expected_verdict is on, but a judge reply kept its plain verdict ({reason}); "
            "reward/extra/judge_weighted/mean is the share weighted, judge_weighting each sample's why"
        )


@dataclass(frozen=True)
class ReplyToken:
    """One generated token: its bytes, its log-probability and the alternatives the server listed."""

    data: bytes
    """The token's bytes (``bytes`` when the server gives them, else its text in UTF-8)."""
    logprob: float
    """Log-probability of the sampled token."""
    alternatives: tuple[tuple[str, float], ...]
    """(text, log-probability) of the listed alternatives, the sampled token among them."""

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExpectedVerdict:
    """The expected verdict and how much of the judge's probability its candidates covered."""

    value: float
    """Probability-weighted mean of the candidate verdicts (renormalised over them)."""
    mass: float
    """Probability of the candidates before renormalising, in (0, 1]."""


def _token_bytes(entry: Mapping[str, Any]) -> bytes | None:
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw
    ):
        return bytes(raw)
    token = entry.get("token")
    return token.encode("utf-8") if isinstance(token, str) else None


def _logprob(entry: Mapping[str, Any]) -> float | None:
    value = entry.get("logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value <= 0.0 and not math.isnan(value) else None  # -inf allowed: probability 0


def reply_tokens(choice: Any) -> list[ReplyToken] | None:
    """The tokens of a chat-completion choice's ``logprobs.content``; None when the server sent none
    or sent them malformed (the caller then keeps the plain verdict)."""
    logprobs = choice.get("logprobs") if isinstance(choice, Mapping) else None
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list) or not content:
        return None
    tokens: list[ReplyToken] = []
    for entry in content:
        if not isinstance(entry, Mapping):
            return None
        data, logprob = _token_bytes(entry), _logprob(entry)
        if data is None or logprob is None:
            return None
        alternatives: dict[str, float] = {data.decode("utf-8", errors="replace"): logprob}
        for alternative in entry.get("top_logprobs") or ():
            if not isinstance(alternative, Mapping):
                return None
            alt_bytes, alt_logprob = _token_bytes(alternative), _logprob(alternative)
            if alt_bytes is None or alt_logprob is None:
                return None
            alternatives.setdefault(alt_bytes.decode("utf-8", errors="replace"), alt_logprob)
        tokens.append(ReplyToken(data, logprob, tuple(alternatives.items())))
    return tokens


def _is_digits(text: str) -> bool:
    return bool(text) and text.isascii() and text.isdigit()


def _leading_digits(text: str) -> str:
    """The ASCII digits ``text`` starts with (``"0]]"``: ``"0"``; ``"]]"``: ``""``)."""
    end = 0
    while end < len(text) and "0" <= text[end] <= "9":
        end += 1
    return text[:end]


def _verdict_offset(content: str, tokens: Sequence[ReplyToken], spelled: bytes, start: int) -> int | None:
    """The byte offset, in ``spelled`` (what ``tokens`` spell), of the verdict at character ``start``
    of ``content``; None where the tokens do not spell the reply.

    The reply's text must end on a token boundary: tokens after it are the server's own (vLLM lists
    the end-of-sequence token and a stop string's tokens, which the text leaves out), tokens before it
    may be the judge's thinking. The last such place counts. Where the whole text is not found there
    (a server that renders a character split over tokens as U+FFFD), the text from the verdict on is
    looked for the same way: the verdict's own tokens are what the rule needs."""
    ends, position = {0}, 0
    for token in tokens:
        position += len(token.data)
        ends.add(position)
    whole, before = content.encode("utf-8"), len(content[:start].encode("utf-8"))
    for piece, lead in ((whole, before), (content[start:].encode("utf-8"), 0)):
        at = spelled.rfind(piece)
        while at >= 0:
            if at + len(piece) in ends:
                return at + lead
            at = spelled.rfind(piece, 0, at + len(piece) - 1)
    return None


def _ends_there(alternative: str, number: str, max_score: float) -> bool:
    """Whether an alternative token that brings the digits of ``number`` ends the verdict there: it
    holds a non-digit after its digits, or no longer number on the scale starts with ``number`` (its
    continuation was never generated: on a 0-10 scale a lone ``1`` may be 1 or the start of 10)."""
    if _leading_digits(alternative) != alternative:
        return True
    return number.startswith("0") or int(number) * 10 > max_score


def expected_verdict(
    content: str,
    tokens: Sequence[ReplyToken],
    span: tuple[int, int],
    *,
    min_score: float,
    max_score: float,
) -> ExpectedVerdict | str:
    """The expected verdict for the digits at ``span`` of ``content`` (see the module docstring), or
    why it cannot be had (a short reason; the plain verdict then stands)."""
    start, end = span
    written = content[start:end]
    if not _is_digits(written):
        return "verdict is not a whole number"
    spelled = b"".join(token.data for token in tokens)
    start_b = _verdict_offset(content, tokens, spelled, start)
    if start_b is None:
        return "tokens do not spell the reply"
    end_b = start_b + len(written)  # ASCII digits: one byte each
    position, first = 0, None
    for index, token in enumerate(tokens):
        token_end = position + len(token.data)
        if first is None and token_end > start_b:
            lead = spelled[position:start_b]
            if position > start_b or lead.strip():
                return "verdict shares a token with text before it"
            first = index
        if first is not None and token_end >= end_b:
            if token_end != end_b:
                return "verdict shares a token with text after it"
            last = index
            break
        position = token_end
    else:
        return "verdict not found in the tokens"
    assert first is not None
    verdict_tokens = list(tokens[first : last + 1])
    following = tokens[last + 1] if last + 1 < len(tokens) else None
    return _weigh(verdict_tokens, following, min_score=min_score, max_score=max_score)


def _weigh(
    verdict_tokens: list[ReplyToken],
    following: ReplyToken | None,
    *,
    min_score: float,
    max_score: float,
) -> ExpectedVerdict | str:
    """Candidates along the sampled digits, then the token after them (rule 3)."""
    candidates: dict[int, float] = {}

    def add(value_text: str, probability: float) -> None:
        value = int(value_text)
        if min_score <= value <= max_score and probability > 0.0:
            candidates[value] = candidates.get(value, 0.0) + probability

    path_probability, prefix = 1.0, ""
    for index, token in enumerate(verdict_tokens):
        sampled = token.text.lstrip() if index == 0 else token.text
        if not _is_digits(sampled):
            return "verdict token is not digits"
        for text, logprob in token.alternatives:
            alternative = text.lstrip() if index == 0 else text
            if alternative == sampled:
                continue  # followed along the path
            probability = path_probability * math.exp(logprob)
            digits = _leading_digits(alternative)
            if digits:
                if _ends_there(alternative, prefix + digits, max_score):
                    add(prefix + digits, probability)
            elif index > 0:
                add(prefix, probability)  # the number ended before this position
        path_probability *= math.exp(token.logprob)
        prefix += sampled
    if following is None:
        add(prefix, path_probability)
    else:
        for text, logprob in following.alternatives:
            digits = _leading_digits(text)
            if not digits or _ends_there(text, prefix + digits, max_score):
                add(prefix + digits, path_probability * math.exp(logprob))
    mass = sum(candidates.values())
    if mass <= 0.0:
        return "no candidate verdict has probability"
    value = sum(verdict * probability for verdict, probability in candidates.items()) / mass
    # A mean of verdicts on the scale is on the scale; rounding can put it 1e-15 past an end, which
    # the verdict's range check would refuse (found by the property test).
    value = min(max(value, min_score), max_score)
    return ExpectedVerdict(value=value, mass=min(mass, 1.0))
