"""What judging cost: per-sample extras and the per-step ``reward/cost/*`` metrics.

Each sample carries what *its own* calls spent, so that a sum over samples is what the job paid: a
sample that shared another's call in flight (``judge_shared``) or took a cached verdict
(``judge_cache_hit``) spent nothing, and a reply whose verdict was refused (``invalid``) still spent
its tokens. Exactly one sample carries a shared call's cost: the first to take its result
(:class:`PaidOnce`), so a cancelled sample that started the call does not take the cost with it.
Tokens are the ones the judge reports in ``usage``, read by one rule (:func:`whole_count`); a count
that breaks it is counted 0 and said (``judge_usage_error``, ``reward/cost/usage_errors``, a log
line), never silently. A call that timed out or failed with an HTTP error reports none, so it counts
as a call (``attempts``) with no tokens.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "JudgePricing",
    "PaidOnce",
    "add_cost",
    "call_token_bound",
    "cost_metrics",
    "paid_once",
    "reported_total_tokens",
    "spent_extras",
    "unspent_extras",
    "whole_count",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
#: Tokens a chat template may add around each message (role markers, a default system prompt), on
#: top of the message's own bytes, in :func:`call_token_bound`: generous, it only caps nonsense.
_TEMPLATE_TOKENS_PER_MESSAGE = 64
_TEMPLATE_TOKENS = 256
_said: set[str] = set()


@dataclass(frozen=True)
class JudgePricing:
    """Prices per million tokens, in the user's currency (``judge.*_price_per_million``)."""

    prompt: float
    """Price of a million prompt (input) tokens."""
    completion: float
    """Price of a million completion (output) tokens."""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1_000_000


class PaidOnce(Generic[T]):
    """A result several samples take (one judge call's, shared in flight or cached) whose cost exactly
    one of them carries: the first to take it. The sample that started the call may be cancelled
    before it returns; the next to take the result pays instead, so the step's sums stay what the
    judge billed."""

    __slots__ = ("_paid", "value")

    def __init__(self, value: T) -> None:
        self.value = value
        self._paid = False

    def take(self) -> bool:
        """True for the first taker only: it carries the cost, every later one carries none."""
        first = not self._paid
        self._paid = True
        return first


async def paid_once(call: Awaitable[T]) -> PaidOnce[T]:
    """``call``'s result, to be shared as :class:`PaidOnce`."""
    return PaidOnce(await call)


def whole_count(value: Any) -> int | None:
    """A count (tokens, attempts, calls) as a non-negative whole number, else None.

    One rule for every reader: an ``int``, or a float (numpy numbers included) with no fraction,
    since JSON has one number type (a server may write ``100.0``) and verl stacks extras into float
    arrays. A bool, a fraction, a negative, NaN, infinity, text or anything else is no count.
    """
    return _count_or_why(value)[0]


def _count_or_why(value: Any) -> tuple[int | None, str]:
    """:func:`whole_count`'s answer, and why a value is none (empty when it is one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # np.bool_ is no Real either
        return None, f"{_shown(value)} is not a number"
    if isinstance(value, numbers.Integral):
        count = int(value)
        return (count, "") if count >= 0 else (None, f"{count} is negative")
    number = float(value)
    if not math.isfinite(number):
        return None, f"{number} is not finite"
    if not number.is_integer():
        return None, f"{number:g} is not a whole number"
    if number < 0:
        return None, f"{number:g} is negative"
    return int(number), ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_usage(usage: Any) -> tuple[dict[str, int | None], list[str]]:
    """Each usage field's count (None: missing, null or refused) and what was refused."""
    counts: dict[str, int | None] = dict.fromkeys(_USAGE_FIELDS)
    if usage is None:
        return counts, []
    if not isinstance(usage, Mapping):
        return counts, [f"usage is a {type(usage).__name__}, not an object"]
    problems = []
    for name in _USAGE_FIELDS:
        value = usage.get(name)
        if value is None:
            continue
        counts[name], why = _count_or_why(value)
        if why:
            problems.append(f"usage.{name} {why}")
    return counts, problems


def reported_total_tokens(usage: Any) -> int | None:
    """The call's tokens as its ``usage`` reports them (``total_tokens``, else prompt + completion),
    read by :func:`whole_count`'s rule; None when it reports none readable."""
    counts, _ = _read_usage(usage)
    if counts["total_tokens"] is not None:
        return counts["total_tokens"]
    if counts["prompt_tokens"] is None and counts["completion_tokens"] is None:
        return None
    return (counts["prompt_tokens"] or 0) + (counts["completion_tokens"] or 0)


def call_token_bound(body: Mapping[str, Any]) -> int:
    """The most tokens a chat-completion request ``body`` can honestly use: its messages' UTF-8 bytes
    (no tokenizer makes more tokens than bytes) plus a generous margin for the chat template, plus
    ``max_tokens`` (or ``max_completion_tokens``) for each of ``n`` choices. What a reply claims
    beyond it is not charged to the token budget (``tokens_per_minute``): one absurd ``usage`` must
    not stall the job's admission for hours."""
    messages = body.get("messages")
    listed = messages if isinstance(messages, list) else []
    prompt = len(json.dumps(listed, ensure_ascii=False).encode("utf-8"))
    prompt += _TEMPLATE_TOKENS + _TEMPLATE_TOKENS_PER_MESSAGE * len(listed)
    limits = [whole_count(body.get(key)) for key in ("max_tokens", "max_completion_tokens")]
    completion = max((limit for limit in limits if limit is not None), default=0)
    choices = whole_count(body.get("n")) or 1
    return prompt + completion * choices


def spent_extras(usage: Any, pricing: JudgePricing | None) -> dict[str, Any]:
    """The cost extras of one judge reply, from its ``usage`` (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens``, read by :func:`whole_count`'s rule; ``total_tokens``
    defaults to the sum). A field missing or null counts 0; one that breaks the rule counts 0 too,
    and ``judge_usage_error`` says which and why (logged once per field). ``judge_cost`` only when
    ``pricing`` is set."""
    counts, problems = _read_usage(usage)
    prompt = counts["prompt_tokens"] or 0
    completion = counts["completion_tokens"] or 0
    total = counts["total_tokens"] if counts["total_tokens"] is not None else prompt + completion
    for problem in problems:
        _say_once(problem.split(" ", 1)[0], problem)
    said = "; ".join(problems) + ("; counted 0" if problems else "")
    if pricing is not None and total > prompt + completion and not problems:
        # e.g. a server that reports total_tokens alone: the money would read low, unseen
        said = (
            f"usage.total_tokens {total} exceeds prompt + completion ({prompt + completion}): "
            "judge_cost prices the split tokens only"
        )
        if "unpriced" not in _said:
            _said.add("unpriced")
            logger.warning("the judge server's reply reports %s", said)
    extras: dict[str, Any] = {
        "judge_prompt_tokens": prompt,
        "judge_completion_tokens": completion,
        "judge_tokens": total,
        "judge_cache_hit": False,
        "judge_usage_error": said,
    }
    if pricing is not None:
        extras["judge_cost"] = pricing.cost(prompt, completion)
    return extras


def _say_once(field: str, problem: str) -> None:
    """Log a usage ``field`` the judge server gets wrong, once per field per process: every reply
    of that server will carry it, and each sample says so in its extras."""
    if field not in _said:
        _said.add(field)
        logger.warning(
            "the judge server's reply reports %s: counted 0 tokens (each sample says so in "
            "judge_usage_error; reward/cost/usage_errors counts them)",
            problem,
        )


def unspent_extras(pricing: JudgePricing | None, *, cache_hit: bool = False) -> dict[str, Any]:
    """The cost extras of a sample that made no call of its own (a shared call, a cached verdict, a
    failure before any reply)."""
    extras = spent_extras(None, pricing)
    extras["judge_cache_hit"] = cache_hit
    return extras


def cost_metrics(extra_infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per-step sums: ``reward/cost/calls`` (attempts, i.e. requests sent, retries included, over every
    manager), ``reward/cost/shared`` (samples that shared an identical call in flight), and, for
    samples that carry them (``llm_judge``), ``reward/cost/{prompt_tokens,completion_tokens,tokens,
    cache_hits}``, ``reward/cost/usage_errors`` (samples whose ``usage`` broke the counting rule) and,
    with prices set, ``reward/cost/money``. Counts are read by :func:`whole_count` (a NaN a sample
    was filled with counts 0)."""
    calls = shared = prompt = completion = tokens = cache_hits = usage_errors = 0
    money = 0.0
    judged = priced = False
    for info in extra_infos:
        calls += whole_count(info.get("attempts")) or 0
        shared += bool(info.get("judge_shared", False))
        if "judge_prompt_tokens" in info:
            judged = True
            prompt += whole_count(info.get("judge_prompt_tokens")) or 0
            completion += whole_count(info.get("judge_completion_tokens")) or 0
            tokens += whole_count(info.get("judge_tokens")) or 0
            cache_hits += bool(info.get("judge_cache_hit", False))
            usage_errors += bool(isinstance(info.get("judge_usage_error"), str) and info["judge_usage_error"])
        cost = info.get("judge_cost")
        if isinstance(cost, numbers.Real) and not isinstance(cost, bool) and math.isfinite(float(cost)):
            priced = True
            money += float(cost)
    metrics = {"reward/cost/calls": float(calls), "reward/cost/shared": float(shared)}
    if judged:
        metrics.update(
            {
                "reward/cost/prompt_tokens": float(prompt),
                "reward/cost/completion_tokens": float(completion),
                "reward/cost/tokens": float(tokens),
                "reward/cost/cache_hits": float(cache_hits),
                "reward/cost/usage_errors": float(usage_errors),
            }
        )
    if priced:
        metrics["reward/cost/money"] = money
    return metrics


def add_cost(totals: dict[str, float], info: Mapping[str, Any]) -> None:
    """Add one sample's cost (:func:`cost_metrics` of it alone) to running ``totals``: for a consumer
    that must not keep every sample's extras (a long offline run, a ticket released once delivered)."""
    for name, value in cost_metrics([info]).items():
        totals[name] = totals.get(name, 0.0) + value
