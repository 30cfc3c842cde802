"""The verdict weighted by the judge's own token probabilities (``judge.expected_verdict``).

A judge that samples one digit makes ties: when every response of a GRPO group gets the same verdict
the group's advantage is zero and it teaches nothing. Where the server returns token log-probabilities
(OpenAI's ``logprobs`` / ``top_logprobs``, which vLLM and SGLang implement), the score is instead the
expected verdict under the judge's distribution at the place where it wrote its verdict.

The rule, which reads nothing but the judge's own tokens:

1. The verdict rules read the reply as always (``async_reward.judge.verdict``); every verdict written in
   the reply's format is located there (:func:`async_reward.judge.verdict.verdict_spans`) and weighed by
   this rule, and the lowest value counts (``managers.span_weighting``: which one is the judge's own
   cannot be told from the text, so a quoted one may lower the score, never raise it). A verdict that
   is not a whole number is not weighted (its written number counts, and the sample says why).
2. The reply's tokens (``logprobs.content``) are aligned to its text by their bytes; the reply's text
   must end on a token boundary of what the tokens spell, which may hold more before it (a server may
   put the judge's thinking first) and after it (vLLM lists the end-of-sequence token, ``<|im_end|>``,
   and the tokens of a stop string, which the reply's text leaves out). Where a server renders a
   character split over two tokens lossily (U+FFFD each, as vLLM's ``bytes`` do), the text from the
   verdict on is aligned instead. The tokens that spell the verdict must start and end at its edges
   (leading whitespace in its first token is allowed: ``" 7"``) and be digits only.
3. Along the verdict's tokens (a *place* each, then the token after them), each token the server
   lists is a verdict, a continuation, or the end of one:
   - the sampled digits, in every spelling listed (``" 7"`` and ``"7"`` at the first place), are
     followed: their probability multiplies what comes after them;
   - a token that ends the number there (a non-digit after the first place: ``prefix``; digits then a
     non-digit, ``8]]``; digits after which no longer verdict on the scale can start) is a candidate;
   - a digits-only token a longer verdict could start (``1`` on 0-10 with a digit-splitting tokenizer:
     1, or the first token of 10) was never continued: its probability is shared among the verdicts it
     may be in proportion to the probability the same place lists on each one's neighbours (one below,
     one above) strictly inside the scale: for ``1``, 2's against 9's. That is the premise of a
     judge whose distribution is locally smooth; the scale's ends are no evidence, since a pass/fail
     judge puts its doubt on both. Where no neighbour is listed nothing tells, and the token is left
     out (``mass`` says so). A place that lists a token of several digits (a tokenizer that writes
     ``10`` whole) reads a shorter one as the whole number. So the expectation does not depend on which
     verdict was sampled beyond that split: the place is listed alike whatever was written there,
     and the split is exact wherever the sampled token continued it;
   - non-digit tokens at the first place (no verdict) and verdicts off ``[min_score, max_score]`` are
     dropped. A signed scale is refused at start-up: a ``-``'s continuation is never listed.
   Each candidate's probability is the product of the followed tokens before it and its own.
4. The expected verdict is the probability-weighted mean of the candidates, renormalised over them.
   ``mass`` is the share they covered, ``assumed`` the part of it the neighbour rule shared out, and
   ``favourite`` whether each token that decided the verdict was the likeliest listed: at temperature
   0 one that is not means the server sampled from other probabilities than it reported.

The request asks for the distribution it reads (:func:`distribution_params`): ``top_p`` 1 and no
presence or frequency penalty, OpenAI's own parameters; towards the judge verl serves (vLLM or
SGLang) also ``repetition_penalty`` 1, ``top_k`` -1 and ``min_p`` 0, which OpenAI's API refuses.

A server that returns no log-probabilities leaves the plain verdict, said once in the log and on every
such sample (``judge_weighting``), never a silent mix; one that returns them malformed (a positive or
NaN log-probability, a ``top_logprobs`` that is not a list, ...) too, with its own reason
(``malformed logprobs: <what>``): they are read as they are, never repaired. With a rubric
(``judge.criteria``) the same rule weighs each criterion's verdict at the digits of its own line
(``managers.criteria_weighting``).

Longer than 400 lines: one rule (the expected verdict from token probabilities), with the
alignment of the reply's tokens to its text that the rule cannot do without.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from async_reward._core.start_lines import say_once

__all__ = [
    "MALFORMED_LOGPROBS",
    "NO_LOGPROBS",
    "ExpectedVerdict",
    "ReplyToken",
    "distribution_params",
    "expected_verdict",
    "reply_tokens",
    "say_if_not_favourite",
    "say_unweighted",
    "weighted_extras",
]

#: Why a reply kept its plain verdict when the server sent no token probabilities.
NO_LOGPROBS = "no logprobs in the reply"
#: How the reason starts when it sent them malformed (``malformed logprobs: token 3: logprob nan``).
MALFORMED_LOGPROBS = "malformed logprobs"


def say_unweighted(reason: str) -> None:
    """Say in the log, once per reason, that ``judge.expected_verdict`` is on but a reply kept its
    plain verdict (a user who turned weighting on sees why replies were not weighted; every sample
    says it too, in ``judge_weighting``)."""
    if reason == NO_LOGPROBS:
        say_once(
            "judge.expected_verdict is on, but the judge returned no token probabilities (logprobs): "
            "such replies score their plain verdict (judge_weighting says so on each sample)"
        )
    elif reason.startswith(MALFORMED_LOGPROBS):  # one line, whichever token was malformed
        say_once(
            "judge.expected_verdict is on, but the judge returned malformed token probabilities "
            "(logprobs): such replies score their plain verdict (judge_weighting says what was "
            "malformed on each sample)"
        )
    else:
        say_once(
            f"judge.expected_verdict is on, but a judge reply kept its plain verdict ({reason}); "
            "reward/extra/judge_weighted/mean is the share weighted, judge_weighting each sample's why"
        )


#: Log-probabilities this close are a tie (greedy decoding takes either of them).
_TIE = 1e-5

#: Sampling settings that make the sampled distribution the one the server reports, in OpenAI's own
#: parameters (OpenAI, vLLM, SGLang and llama.cpp's servers take them): no nucleus cut, no penalty.
_OPENAI_NEUTRAL: dict[str, int | float] = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
#: The same for the judge verl serves in the job, with vLLM or SGLang: keys both take, which OpenAI's
#: API refuses (HTTP 400). vLLM otherwise applies the model's generation_config (Qwen2.5's
#: repetition_penalty 1.05, top_k 20); -1 disables top_k in both (SGLang refuses 0).
_SERVED_NEUTRAL: dict[str, int | float] = {"repetition_penalty": 1.0, "top_k": -1, "min_p": 0.0}


def distribution_params(*, served: bool) -> dict[str, int | float]:
    """The request fields ``judge.expected_verdict`` adds, under the user's ``extra_body``: the
    sampler left as the model's distribution, so the verdict written is drawn from the probabilities
    the reply lists. ``served``: the judge verl serves in the job (vLLM or SGLang), which takes more."""
    return {**_OPENAI_NEUTRAL, **(_SERVED_NEUTRAL if served else {})}


def say_if_not_favourite(favourite: bool, *, temperature: float) -> None:
    """Say once in the log, at temperature 0, that a written verdict was not the listed favourite:
    there it means the server did not sample from the probabilities it reported."""
    if not favourite and temperature == 0.0:
        say_once(
            "judge.expected_verdict: at temperature 0 the judge wrote a verdict that is not the most "
            "probable one in its own top_logprobs, so the server samples from other probabilities than "
            "it reports (llama.cpp's server applies repeat_penalty 1.1, top_k and min_p by default): set "
            "judge.extra_body {repeat_penalty: 1.0} for llama.cpp, {repetition_penalty: 1.0} for vLLM "
            "or SGLang; reward/extra/judge_verdict_not_favourite/mean is the share of such samples"
        )


def weighted_extras(outcome: ExpectedVerdict, *, temperature: float) -> dict[str, float]:
    """A weighted sample's extras: the expected verdict, its mass, the part shared by the neighbour
    rule, and whether the written verdict was off the listed favourite, said once at temperature 0
    (where it means the server did not sample from what it reported)."""
    say_if_not_favourite(outcome.favourite, temperature=temperature)
    return {
        "judge_expected_verdict": outcome.value,
        "judge_verdict_mass": outcome.mass,
        "judge_verdict_assumed": outcome.assumed,
        "judge_verdict_not_favourite": 0.0 if outcome.favourite else 1.0,
    }


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
    assumed: float = 0.0
    """The part of ``mass`` the neighbour rule shared out (digits whose continuation was never
    generated: ``1`` as 1 or 10), in [0, mass]: what the expectation takes on that rule's premise."""
    favourite: bool = True
    """Whether each token that decided the verdict was the likeliest listed at its place. At
    temperature 0 it must be: where it is not, the server sampled from other probabilities than it
    reported (a repeat penalty, as llama.cpp's server applies by default)."""


def _token_bytes(entry: Mapping[str, Any]) -> bytes | None:
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw
    ):
        return bytes(raw)
    token = entry.get("token")
    return token.encode("utf-8") if isinstance(token, str) else None


def _shown(value: Any) -> str:
    """``value`` as a reason shows it: as the server's JSON spells it where it is null, and short,
    since a reason lands in a per-sample extra."""
    text = "null" if value is None else f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _logprob(entry: Mapping[str, Any]) -> float | str:
    """The entry's log-probability, or what is wrong with it. A positive one is refused, never read
    as 0: a log-softmax (``x - max - log(sum(exp(x - max)))``) gives none, so a server that sends one
    reports something other than the distribution the rule reads."""
    value = entry.get("logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"logprob {_shown(value)}"
    try:  # a JSON integer past float's range (-10**400) overflows here, never later in the weighing
        number = float(value)
    except OverflowError:
        return f"logprob {_shown(value)} is out of range"
    if math.isnan(number):
        return f"logprob {_shown(value)}"
    if number > 0.0:
        return f"logprob {_shown(number)} is above 0"
    return number  # -inf allowed for an alternative: probability 0 (not for a sampled token)


def _alternatives(entry: Mapping[str, Any], where: str) -> list[tuple[bytes, float]] | str:
    """The (bytes, log-probability) of the alternatives ``entry`` lists, or what is malformed in them
    (``where``: the token's place, for the reason)."""
    listed = entry.get("top_logprobs")
    if listed is None:
        return []
    if not isinstance(listed, list):
        return f"{where}: top_logprobs is {type(listed).__name__}, not a list"
    alternatives: list[tuple[bytes, float]] = []
    for number, alternative in enumerate(listed):
        read = _entry(alternative, f"{where}, alternative {number}")
        if isinstance(read, str):
            return read
        alternatives.append(read)
    return alternatives


def _entry(entry: Any, where: str) -> tuple[bytes, float] | str:
    """A listed token's (bytes, log-probability), or what is malformed in it (``where``: its place)."""
    if not isinstance(entry, Mapping):
        return f"{where}: {type(entry).__name__}, not an object"
    data, logprob = _token_bytes(entry), _logprob(entry)
    if data is None:
        return f"{where}: no text"
    if isinstance(logprob, str):
        return f"{where}: {logprob}"
    return data, logprob


def _reply_token(entry: Any, index: int) -> ReplyToken | str:
    """The ``index``-th ``logprobs.content`` entry, or what is malformed in it: every field the rule
    reads is checked here, since a shape it cannot read must leave the plain verdict, never raise."""
    where = f"token {index}"
    read = _entry(entry, where)
    if isinstance(read, str):
        return read
    data, logprob = read
    if logprob == -math.inf:  # the server sampled it, so it cannot have had probability 0
        return f"{where}: the sampled token has logprob -inf"
    listed = _alternatives(entry, where)
    if isinstance(listed, str):
        return listed
    alternatives: dict[str, float] = {data.decode("utf-8", errors="replace"): logprob}
    for alt_bytes, alt_logprob in listed:
        alternatives.setdefault(alt_bytes.decode("utf-8", errors="replace"), alt_logprob)
    return ReplyToken(data, logprob, tuple(alternatives.items()))


def reply_tokens(choice: Any) -> list[ReplyToken] | str:
    """The tokens of a chat-completion choice's ``logprobs.content``, or why the plain verdict stays:
    :data:`NO_LOGPROBS` when the server sent none (no ``logprobs``, no ``content`` in it, or an empty
    one), ``malformed logprobs: <what>`` when it sent them in a shape or with values the rule cannot
    read (a positive or NaN log-probability, a ``top_logprobs`` that is not a list, ...). The two
    are told apart: the first sends an operator after a server that ignores ``logprobs``, the second
    after one that reports them wrongly."""
    logprobs = choice.get("logprobs") if isinstance(choice, Mapping) else None
    if logprobs is None:
        return NO_LOGPROBS
    if not isinstance(logprobs, Mapping):
        return f"{MALFORMED_LOGPROBS}: logprobs is {type(logprobs).__name__}, not an object"
    content = logprobs.get("content")
    if content is None or (isinstance(content, list) and not content):
        return NO_LOGPROBS
    if not isinstance(content, list):
        return f"{MALFORMED_LOGPROBS}: content is {type(content).__name__}, not a list"
    tokens: list[ReplyToken] = []
    for index, entry in enumerate(content):
        token = _reply_token(entry, index)
        if isinstance(token, str):
            return f"{MALFORMED_LOGPROBS}: {token}"
        tokens.append(token)
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


@dataclass(frozen=True)
class _Scale:
    low: float
    high: float

    def holds(self, value: int) -> bool:
        return self.low <= value <= self.high

    def inside(self, value: int) -> bool:
        """Strictly inside: the ends are where a pass/fail judge puts its doubt (0 or 10), so a verdict
        listed there tells nothing about where an ambiguous digit between them lies."""
        return self.low < value < self.high

    def may_continue(self, number: str) -> bool:
        """Whether a longer verdict on the scale starts with the digits ``number``."""
        return not number.startswith("0") and int(number) * 10 <= self.high

    def beyond(self, number: str) -> bool:
        """Whether the digits ``number`` are too many for any verdict on the scale (and too many to
        turn into an int cheaply: Python refuses more than 4300 digits)."""
        return len(number.lstrip("0")) > len(f"{self.high:.0f}")

    def reads_as(self, number: str, value: int) -> bool:
        """Whether ``value`` on the scale is written with the digits ``number`` first."""
        return self.holds(value) and str(value).startswith(number)


@dataclass
class _Place:
    """What the tokens listed at one place of the verdict say (rule 3)."""

    ended: dict[int, float] = field(default_factory=dict)
    """Verdicts ending at this place, other than the sampled digits: probability at this place."""
    open: list[tuple[str, float]] = field(default_factory=list)
    """Digits-only alternatives a longer verdict could start (continuation never generated)."""
    evidence: dict[int, float] = field(default_factory=dict)
    """Every verdict this place's listing decides (``ended``, and the sampled digits where no longer
    verdict could follow them): the same whichever of them was sampled."""
    branch: float = 0.0
    """Probability of the sampled digits at this place, every spelling of them together."""


def _read_place(token: ReplyToken, prefix: str, sampled: str | None, first: bool, scale: _Scale) -> _Place:
    """The listing at one place: after the digits ``prefix``, with ``sampled`` the digits written
    there (None: the token after the verdict, where every listed token is a candidate)."""
    place = _Place()
    listing = [(text.lstrip() if first else text, math.exp(logprob)) for text, logprob in token.alternatives]
    # A tokenizer with multi-digit tokens (Llama 3's: 0 to 999) writes 10 as ``10``, never ``1`` ``0``:
    # a shorter run of digits listed beside a longer one is the whole number.
    longest = max(len(_leading_digits(text)) for text, _ in listing)
    for text, probability in listing:
        digits = _leading_digits(text)
        number = prefix + digits
        if scale.beyond(number):
            continue  # off the scale, whatever follows
        # An empty token ("" : a SentencePiece space or a special token rendered empty) adds no digit:
        # it ends the number, never continues it.
        whole = bool(digits) and digits == text and len(digits) == longest and scale.may_continue(number)
        if sampled is not None and text == sampled:
            place.branch += probability
            if not whole:
                place.evidence[int(number)] = place.evidence.get(int(number), 0.0) + probability
        elif not digits and not prefix:
            continue  # no number at all
        elif whole:
            place.open.append((number, probability))
        else:  # the number ends here: ``prefix`` (a non-digit), or ``prefix`` + digits
            for verdicts in (place.ended, place.evidence):
                verdicts[int(number)] = verdicts.get(int(number), 0.0) + probability
    return place


def _neighbour_shares(number: str, evidence: Mapping[int, float], scale: _Scale) -> dict[int, float]:
    """How an alternative ``number`` whose continuation was never generated is shared among the
    verdicts it may start (``1``: 1 or 10): in proportion to the listed probability of each one's
    neighbours (one below, one above) inside the scale. Empty where none is listed: nothing tells."""
    weights: dict[int, float] = {}
    for verdict, probability in evidence.items():
        if not scale.inside(verdict):
            continue
        for reading in (verdict - 1, verdict + 1):
            if scale.reads_as(number, reading):
                weights[reading] = weights.get(reading, 0.0) + probability
    total = sum(weights.values())
    return {reading: weight / total for reading, weight in weights.items()} if total > 0.0 else {}


def _is_favourite(token: ReplyToken, deciding: Callable[[str], bool]) -> bool:
    """Whether no listed token that ``deciding`` says would write another verdict is more probable
    than the sampled one (a tie is no sign: greedy decoding takes either)."""
    rivals = [logprob for text, logprob in token.alternatives if text != token.text and deciding(text)]
    return not rivals or max(rivals) <= token.logprob + _TIE


def _longer_verdict(prefix: str, text: str, scale: _Scale) -> bool:
    """Whether the token ``text`` after the verdict's digits ``prefix`` would have written a longer
    verdict on the scale."""
    number = prefix + _leading_digits(text)
    return number != prefix and not scale.beyond(number) and scale.holds(int(number))


def _weigh(
    verdict_tokens: list[ReplyToken],
    following: ReplyToken | None,
    *,
    min_score: float,
    max_score: float,
) -> ExpectedVerdict | str:
    """Candidates along the sampled digits, then the token after them (rule 3)."""
    scale = _Scale(min_score, max_score)
    candidates: dict[int, float] = {}
    assumed = 0.0

    def add(place: _Place, path: float) -> None:
        nonlocal assumed
        for verdict, probability in place.ended.items():
            _add(candidates, scale, verdict, path * probability)
        for number, probability in place.open:
            for verdict, share in _neighbour_shares(number, place.evidence, scale).items():
                assumed += _add(candidates, scale, verdict, path * probability * share)

    path, prefix, favourite = 1.0, "", True
    for index, token in enumerate(verdict_tokens):
        sampled = token.text.lstrip() if index == 0 else token.text
        if not _is_digits(sampled):
            return "verdict token is not digits"
        favourite &= _is_favourite(token, lambda text: True)
        place = _read_place(token, prefix, sampled, index == 0, scale)
        add(place, path)
        path *= place.branch
        prefix += sampled
    if following is None:
        _add(candidates, scale, int(prefix), path)
    else:
        favourite &= _is_favourite(following, lambda text: _longer_verdict(prefix, text, scale))
        add(_read_place(following, prefix, None, False, scale), path)
    mass = sum(candidates.values())
    if mass <= 0.0:
        return "no candidate verdict has probability"
    value = sum(verdict * probability for verdict, probability in candidates.items()) / mass
    # A mean of verdicts on the scale is on the scale; rounding can put it 1e-15 past an end, which
    # the verdict's range check would refuse (found by the property test).
    value = min(max(value, min_score), max_score)
    return ExpectedVerdict(value=value, mass=min(mass, 1.0), assumed=min(assumed, mass), favourite=favourite)


def _add(candidates: dict[int, float], scale: _Scale, verdict: int, probability: float) -> float:
    """Count ``probability`` for ``verdict`` when it is on the scale; what was counted."""
    if not scale.holds(verdict) or probability <= 0.0:
        return 0.0
    candidates[verdict] = candidates.get(verdict, 0.0) + probability
    return probability
