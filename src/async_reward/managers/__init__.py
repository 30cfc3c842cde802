"""Reward managers registered with verl on import, by name (``reward.reward_manager.name``).

Internal: the names are the interface (and :class:`async_reward.AsyncRewardManager` to subclass,
exported by :mod:`async_reward`), not these module paths ("What is public" in
docs/package_structure.md).
"""

from __future__ import annotations

from async_reward.managers.base import AsyncRewardManager, RewardScoringError
from async_reward.managers.composite import AsyncCompositeRewardManager
from async_reward.managers.llm_judge import LLMJudgeRewardManager
from async_reward.managers.naive import AsyncNaiveRewardManager
from async_reward.managers.rate_limited import AsyncRateLimitedRewardManager
from async_reward.managers.remote import AsyncRemoteRewardManager
from async_reward.managers.stateful import AsyncStatefulRewardManager

__all__ = [
    "MANAGER_NAMES",
    "AsyncCompositeRewardManager",
    "AsyncNaiveRewardManager",
    "AsyncRateLimitedRewardManager",
    "AsyncRemoteRewardManager",
    "AsyncRewardManager",
    "AsyncStatefulRewardManager",
    "LLMJudgeRewardManager",
    "RewardScoringError",
]

#: The names our managers are registered under in verl's registry.
MANAGER_NAMES = (
    "async_naive",
    "async_rate_limited",
    "async_remote",
    "llm_judge",
    "async_stateful",
    "async_composite",
)
