"""Token log-probabilities for the dev server's replies (``logprobs`` / ``top_logprobs``).

The dev server has no model, so it has no tokens: it splits a reply into words, numbers, runs of
whitespace and single punctuation marks, and gives each the probability 1, except the judge's own
verdicts (the one verdict of a reply, or each criterion's on a rubric reply's lines). Those follow a
distribution over the verdicts 0-10: by default the written verdict gets ``verdict_probability`` and
shares the rest evenly with the verdicts one below and one above (at an end of the scale, the two
nearest: 0 shares with 1 and 2); ``verdict_distribution`` gives the judge's whole distribution
instead, whichever verdict the reply writes. Digits anywhere else (a quoted ``C1: [[10]]``) are
certain. How that distribution is listed is what real tokenizers and servers vary (:class:`Emulation`):

* ``logprobs_digits: whole``: a number is one token (as tokenizers with whole-number tokens write
  it), listed beside the other verdicts' tokens; ``split``: one digit a token (as Qwen, Llama 2 and
  Mistral tokenizers write numbers), each place listing the conditional probabilities the
  distribution gives it: at the first digit ``1`` holds P(1) + P(10), after a written ``1`` the
  ``0`` of 10 and the token after the verdict (``]``) as the end of a 1;
* ``logprobs_space_share``: that share of each first token's probability is listed under a second
  spelling with a leading space (``" 7"`` beside ``"7"``), as tokenizers with both list them;
* ``repeat_penalty`` above 1 (llama.cpp's server samples with 1.1 unless the request says otherwise)
  and no ``repeat_penalty`` / ``repetition_penalty`` of 1 in the request: the verdict written is not
  the listed favourite (its probability and the likeliest other verdict's are swapped), as a server
  does that samples with a penalty and reports the log-probabilities from before it.

Entries are shaped as OpenAI's and vLLM's chat completions return them (``token``, ``logprob``,
``bytes``, ``top_logprobs``); with ``end_token`` the last entry is that token, left out of the reply's
text, as vLLM lists the end-of-sequence token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_reward.tools.devserver.config import DevServerConfig

__all__ = ["Emulation", "reply_logprobs", "verdict_distribution"]

_WHOLE = re.compile(r"[0-9]+|[^\W\d_]+|\s+|.", re.DOTALL)
_SPLIT = re.compile(r"[0-9]|[^\W\d_]+|\s+|.", re.DOTALL)
_SCALE = (0, 10)
#: The probability of a written verdict that ``verdict_distribution`` leaves out (a log needs > 0).
_ABSENT = 1e-6
#: The request keys that set the penalty: llama.cpp's name and vLLM's / SGLang's.
_PENALTY_KEYS = ("repeat_penalty", "repetition_penalty")


@dataclass(frozen=True)
class Emulation:
    """How a verdict's probabilities are tokenised and reported (see the module docstring)."""

    split_digits: bool = False
    space_share: float = 0.0
    distribution: Mapping[int, float] | None = None
    penalised: bool = False

    @classmethod
    def of(cls, config: DevServerConfig, payload: Mapping[str, Any]) -> Emulation:
        """The emulation ``config`` asks for, for a request ``payload`` (which may set the penalty)."""
        penalty = config.repeat_penalty
        for key in _PENALTY_KEYS:
            value = payload.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                penalty = float(value)
        return cls(
            split_digits=config.logprobs_digits == "split",
            space_share=config.logprobs_space_share,
            distribution=config.verdict_distribution,
            penalised=penalty > 1.0,
        )


def verdict_distribution(
    verdict: int, probability: float, emulation: Emulation = Emulation()
) -> dict[int, float]:
    """The judge's distribution over verdicts for a reply that writes ``verdict``: the configured one
    (the written verdict added at :data:`_ABSENT` when it leaves it out), else ``probability`` on it
    and the rest shared by its neighbours; penalised, the written verdict's and the likeliest other
    verdict's probabilities swapped (the written one is then not the favourite)."""
    if emulation.distribution is not None:
        weights = {value: weight for value, weight in emulation.distribution.items() if weight > 0.0}
        weights.setdefault(verdict, _ABSENT)
    else:
        neighbours = _neighbours(verdict)
        rest = (1.0 - probability) / len(neighbours)
        weights = {verdict: probability, **{value: rest for value in neighbours if rest > 0.0}}
    total = sum(weights.values())
    distribution = {value: weight / total for value, weight in weights.items()}
    others = [value for value in distribution if value != verdict]
    if emulation.penalised and others:
        rival = max(others, key=lambda value: (distribution[value], -value))
        mine, theirs = distribution[verdict], distribution[rival]
        if mine >= theirs:  # the written verdict is the favourite before the penalty: it must not be
            distribution[verdict], distribution[rival] = (theirs if theirs < mine else mine / 2), mine
            total = sum(distribution.values())
            distribution = {value: p / total for value, p in distribution.items()}
    return distribution


def _neighbours(verdict: int) -> list[int]:
    """The verdicts that share the rest of the probability: one below and one above, or at an end of
    the scale the two nearest on its one side."""
    low, high = _SCALE
    if verdict <= low:
        return [low + 1, low + 2]
    if verdict >= high:
        return [high - 1, high - 2]
    return [verdict - 1, verdict + 1]


def _entry(token: str, alternatives: Sequence[tuple[str, float]], top: int) -> dict[str, Any]:
    """One ``logprobs.content`` entry: ``token`` sampled, ``alternatives`` its place's (text,
    probability) pairs, the sampled one among them (probability 1 when it is not)."""
    probabilities = dict(alternatives)
    logprob = _log(probabilities.get(token, 1.0))
    listed = sorted(probabilities.items(), key=lambda item: -item[1])[:top]
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode("utf-8")),
        "top_logprobs": [
            {"token": text, "logprob": _log(p), "bytes": list(text.encode("utf-8"))} for text, p in listed
        ],
    }


def _log(probability: float) -> float:
    return math.log(probability) if probability < 1.0 else 0.0


def _mass(distribution: Mapping[int, float], prefix: str) -> float:
    """The probability of the verdicts written with ``prefix`` first."""
    return sum(p for value, p in distribution.items() if str(value).startswith(prefix))


def _places(
    written: str, distribution: Mapping[int, float], following: str | None, emulation: Emulation
) -> list[list[tuple[str, float]]]:
    """The listing at each token place of the verdict ``written`` (one place, or one a digit), then,
    with split digits, at the token after it (``following``, the end of the number; None: no such
    token): (text, probability) pairs."""
    if not emulation.split_digits:
        return [_spelled_twice([(str(value), p) for value, p in distribution.items()], emulation)]
    places: list[list[tuple[str, float]]] = []
    for index in range(len(written) + 1):
        prefix = written[:index]
        total = _mass(distribution, prefix)
        if total <= 0.0:  # a written verdict whose weight underflowed: its tokens stay certain
            break
        listing = [(digit, _mass(distribution, prefix + digit) / total) for digit in "0123456789"]
        if index > 0 and following is not None and int(prefix) in distribution and str(int(prefix)) == prefix:
            listing.append((following, distribution[int(prefix)] / total))
        listing = [(text, p) for text, p in listing if p > 0.0]
        if index == len(written) and following is None:
            break
        places.append(_spelled_twice(listing, emulation) if index == 0 else listing)
    return places


def _spelled_twice(listing: list[tuple[str, float]], emulation: Emulation) -> list[tuple[str, float]]:
    """``listing`` with ``space_share`` of each token's probability under its space-led spelling."""
    share = emulation.space_share
    if share <= 0.0:
        return listing
    return [pair for text, p in listing for pair in ((text, p * (1.0 - share)), (" " + text, p * share))]


def _tokens(content: str, emulation: Emulation) -> Iterator[tuple[int, str]]:
    pattern = _SPLIT if emulation.split_digits else _WHOLE
    return ((match.start(), match.group()) for match in pattern.finditer(content))


def reply_logprobs(
    content: str,
    verdicts: Sequence[tuple[int, int]],
    probability: float,
    top: int,
    end_token: str = "",
    emulation: Emulation = Emulation(),
) -> dict[str, Any]:
    """``choice.logprobs`` for ``content``: every token certain but the digits of each verdict of
    ``verdicts`` ((offset in ``content``, verdict) pairs), and with split digits the token after it,
    listed by :func:`_places` from :func:`verdict_distribution`; then ``end_token`` when given."""
    uncertain = dict(verdicts)
    tokens = list(_tokens(content, emulation))
    if end_token:
        tokens.append((len(content), end_token))
    listings: dict[int, list[tuple[str, float]]] = {}
    for index, (offset, token) in enumerate(tokens):
        verdict = uncertain.get(offset)
        if verdict is None or index in listings:
            continue
        written = str(verdict)
        if emulation.split_digits and content.startswith(written, offset):
            count = len(written)
        elif token == written:
            count = 1
        else:
            continue
        following = tokens[index + count][1] if index + count < len(tokens) else None
        distribution = verdict_distribution(verdict, probability, emulation)
        for place, listing in enumerate(_places(written, distribution, following, emulation)):
            listings[index + place] = listing
    return {
        "content": [
            _entry(token, listings.get(index, [(token, 1.0)]), top) for index, (_, token) in enumerate(tokens)
        ]
    }
