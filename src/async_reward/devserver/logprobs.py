"""Token log-probabilities for the dev server's replies (``logprobs`` / ``top_logprobs``).

The dev server has no model, so it has no tokens: it splits a reply into words, numbers, runs of
whitespace and single punctuation marks (a number is one token, as in tokenizers with whole-number
tokens), gives each the probability 1, except the judge's own verdicts (the one verdict of a reply,
or each criterion's on a rubric reply's lines), whose tokens get ``verdict_probability`` and share the
rest evenly with the verdicts one below and one above (within 0-10; at an end of the scale, the two
nearest: 0 shares with 1 and 2, so a client meets the ``1`` that may be the start of ``10``) as
alternatives. Digits anywhere else (a quoted response's ``C1: [[10]]``) are certain. Entries are
shaped as OpenAI's and vLLM's chat completions return them (``token``, ``logprob``, ``bytes``,
``top_logprobs``); with ``end_token`` the last entry is that token, left out of the reply's text, as
vLLM lists the end-of-sequence token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["reply_logprobs"]

_TOKEN = re.compile(r"[0-9]+|[^\W\d_]+|\s+|.", re.DOTALL)
_SCALE = (0, 10)


def _entry(token: str, logprob: float, alternatives: list[tuple[str, float]], top: int) -> dict[str, Any]:
    listed = sorted(alternatives, key=lambda item: -item[1])[:top]
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode("utf-8")),
        "top_logprobs": [
            {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))} for text, value in listed
        ],
    }


def _neighbours(verdict: int) -> list[int]:
    """The verdicts that share the rest of the probability: one below and one above, or at an end of
    the scale the two nearest on its one side."""
    low, high = _SCALE
    if verdict <= low:
        return [low + 1, low + 2]
    if verdict >= high:
        return [high - 1, high - 2]
    return [verdict - 1, verdict + 1]


def reply_logprobs(
    content: str,
    verdicts: Sequence[tuple[int, int]],
    probability: float,
    top: int,
    end_token: str = "",
) -> dict[str, Any]:
    """``choice.logprobs`` for ``content``: every token certain but each verdict's digits of
    ``verdicts`` ((offset in ``content``, verdict) pairs), which get ``probability`` and their
    neighbours the rest; then ``end_token`` when given."""
    uncertain = dict(verdicts)
    entries: list[dict[str, Any]] = []
    for match in _TOKEN.finditer(content):
        token = match.group()
        verdict = uncertain.get(match.start())
        if verdict is not None and token == str(verdict):
            neighbours = _neighbours(verdict)
            rest = (1.0 - probability) / len(neighbours)
            alternatives = [(token, math.log(probability))]
            alternatives += [(str(v), math.log(rest)) for v in neighbours if rest > 0.0]
            entries.append(_entry(token, math.log(probability), alternatives, top))
        else:
            entries.append(_entry(token, 0.0, [(token, 0.0)], top))
    if end_token:
        entries.append(_entry(end_token, 0.0, [(end_token, 0.0)], top))
    return {"content": entries}
