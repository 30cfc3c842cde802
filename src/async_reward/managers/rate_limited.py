"""``async_rate_limited``: ``async_naive`` under concurrency + job-wide RPM + TPM admission."""

from __future__ import annotations

from typing import ClassVar

from async_reward.managers.naive import AsyncNaiveRewardManager
from async_reward.managers.registry import register_manager

__all__ = ["AsyncRateLimitedRewardManager"]


@register_manager("async_rate_limited")
class AsyncRateLimitedRewardManager(AsyncNaiveRewardManager):
    """The user's function behind the full admission order: concurrency slot, request budget, token
    budget. Unlike verl's ``rate_limited``, the budgets are the whole job's, split over
    ``reward.num_workers`` processes, instead of each process holding the full budget."""

    uses_rate_budgets: ClassVar[bool] = True
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset()  # set on each class, not inherited
