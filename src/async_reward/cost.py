"""What judging cost: per-sample extras and the per-step ``reward/cost/*`` metrics.

Each sample carries what *its own* calls spent, so that a sum over samples is what the job paid: a
sample that shared another's call in flight (``judge_shared``) or took a cached verdict
(``judge_cache_hit``) spent nothing, and a reply whose verdict was refused (``invalid``) still spent
its tokens. Tokens are the ones the judge reports in ``usage``; a call that timed out or failed with
an HTTP error reports none, so it counts as a call (``attempts``) with no tokens.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JudgePricing",
    "add_cost",
    "cost_metrics",
    "spent_extras",
    "unspent_extras",
]


@dataclass(frozen=True)
class JudgePricing:
    """Prices per million tokens, in the user's currency (``judge.*_price_per_million``)."""

    prompt: float
    """Price of a million prompt (input) tokens."""
    completion: float
    """Price of a million completion (output) tokens."""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1_000_000


def spent_extras(usage: Any, pricing: JudgePricing | None) -> dict[str, Any]:
    """The cost extras of one judge reply, from its ``usage`` (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens``; a field missing or not a non-negative integer counts 0,
    and ``total_tokens`` defaults to the sum). ``judge_cost`` only when ``pricing`` is set."""
    fields = usage if isinstance(usage, Mapping) else {}
    prompt = _count(fields.get("prompt_tokens"))
    completion = _count(fields.get("completion_tokens"))
    total = _count(fields.get("total_tokens")) or prompt + completion
    extras: dict[str, Any] = {
        "judge_prompt_tokens": prompt,
        "judge_completion_tokens": completion,
        "judge_tokens": total,
        "judge_cache_hit": False,
    }
    if pricing is not None:
        extras["judge_cost"] = pricing.cost(prompt, completion)
    return extras


def unspent_extras(pricing: JudgePricing | None, *, cache_hit: bool = False) -> dict[str, Any]:
    """The cost extras of a sample that made no call of its own (a shared call, a cached verdict, a
    failure before any reply)."""
    extras = spent_extras(None, pricing)
    extras["judge_cache_hit"] = cache_hit
    return extras


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def cost_metrics(extra_infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per-step sums: ``reward/cost/calls`` (attempts, retries included, over every manager),
    ``reward/cost/shared`` (samples that shared an identical call in flight), and, for samples that
    carry them (``llm_judge``), ``reward/cost/{prompt_tokens,completion_tokens,tokens,cache_hits}``
    and, with prices set, ``reward/cost/money``."""
    calls = shared = prompt = completion = tokens = cache_hits = 0
    money = 0.0
    judged = priced = False
    for info in extra_infos:
        calls += _count(_integer(info.get("attempts")))
        shared += bool(info.get("judge_shared", False))
        if "judge_prompt_tokens" in info:
            judged = True
            prompt += _count(_integer(info.get("judge_prompt_tokens")))
            completion += _count(_integer(info.get("judge_completion_tokens")))
            tokens += _count(_integer(info.get("judge_tokens")))
            cache_hits += bool(info.get("judge_cache_hit", False))
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


def _integer(value: Any) -> Any:
    """numpy integers (verl stacks extras into arrays) as Python ints; anything else unchanged."""
    if hasattr(value, "item") and not isinstance(value, bool | int | float):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
