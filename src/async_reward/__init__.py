"""async-reward: asyncio-native reward managers for verl's Reward Loop.

Importing the package registers our managers with verl's registry (``async_naive``,
``async_rate_limited``, ``async_remote``, ``llm_judge``, ``async_stateful``). The public API is what
this module lists in ``__all__``.
"""

from __future__ import annotations

from async_reward.config import AsyncRewardConfig, ConfigError, load_config
from async_reward.integration import SETUP_HOOK, prepare_verl_config, ray_runtime_env, setup_worker
from async_reward.managers import (
    MANAGER_NAMES,
    AsyncNaiveRewardManager,
    AsyncRateLimitedRewardManager,
    AsyncRemoteRewardManager,
    AsyncRewardManager,
    AsyncStatefulRewardManager,
    LLMJudgeRewardManager,
    RewardScoringError,
)
from async_reward.registry import register_manager
from async_reward.result import RewardResult, RewardSample, Status

__version__ = "0.1.0"

__all__ = [
    "MANAGER_NAMES",
    "SETUP_HOOK",
    "AsyncNaiveRewardManager",
    "AsyncRateLimitedRewardManager",
    "AsyncRemoteRewardManager",
    "AsyncRewardConfig",
    "AsyncRewardManager",
    "AsyncStatefulRewardManager",
    "ConfigError",
    "LLMJudgeRewardManager",
    "RewardResult",
    "RewardSample",
    "RewardScoringError",
    "Status",
    "__version__",
    "load_config",
    "prepare_verl_config",
    "ray_runtime_env",
    "register_manager",
    "setup_worker",
]
