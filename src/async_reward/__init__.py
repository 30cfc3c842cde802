"""async-reward: asyncio-native reward managers for verl's Reward Loop.

Importing the package registers our managers with verl's registry (``async_naive``,
``async_rate_limited``, ``async_remote``, ``llm_judge``, ``async_stateful``, ``async_composite``). In
a Ray worker process (where our setup hook imports it) they are registered as soon as verl's
reward-manager package loads instead, so that a worker that never loads verl does not pay for it
(:mod:`async_reward.worker_imports`); their names here load on first use. The public API is what
this module lists in ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from async_reward.config import AsyncRewardConfig, ConfigError, load_config
from async_reward.integration import SETUP_HOOK, prepare_verl_config, ray_runtime_env, setup_worker
from async_reward.result import RewardResult, RewardSample, Status
from async_reward.worker_imports import in_ray_worker, register_managers_with_verls_registry

#: The public names that import verl, and their modules: loaded on first use in a Ray worker.
_VERL_NAMES = {
    **dict.fromkeys(
        (
            "MANAGER_NAMES",
            "AsyncCompositeRewardManager",
            "AsyncNaiveRewardManager",
            "AsyncRateLimitedRewardManager",
            "AsyncRemoteRewardManager",
            "AsyncRewardManager",
            "AsyncStatefulRewardManager",
            "LLMJudgeRewardManager",
            "RewardScoringError",
        ),
        "async_reward.managers",
    ),
    "register_manager": "async_reward.registry",
}

register_managers_with_verls_registry()
if TYPE_CHECKING or not in_ray_worker():
    from async_reward.managers import (
        MANAGER_NAMES,
        AsyncCompositeRewardManager,
        AsyncNaiveRewardManager,
        AsyncRateLimitedRewardManager,
        AsyncRemoteRewardManager,
        AsyncRewardManager,
        AsyncStatefulRewardManager,
        LLMJudgeRewardManager,
        RewardScoringError,
    )
    from async_reward.registry import register_manager


def __getattr__(name: str) -> Any:
    """A public name of :data:`_VERL_NAMES` (or a submodule) used in a Ray worker before verl loaded."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _VERL_NAMES.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as missing:
        if missing.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__version__ = "0.1.0"

__all__ = [
    "MANAGER_NAMES",
    "SETUP_HOOK",
    "AsyncCompositeRewardManager",
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


def _bind_submodules_loaded_before() -> None:
    """Make every ``async_reward.<name>`` module already imported an attribute of this package.

    The command line's front door (``async_reward_cli.import_command_line``) imports its modules
    before this ``__init__`` runs, under a package module it then drops; Python does not bind a
    submodule found in ``sys.modules`` to a new package object, so ``async_reward.config`` (in a
    user's scorer run by ``async-reward score``, say) would raise ``AttributeError`` without this."""
    import sys

    prefix = __name__ + "."
    for name, module in list(sys.modules.items()):
        child = name[len(prefix) :]
        if name.startswith(prefix) and module is not None and "." not in child:
            globals().setdefault(child, module)


_bind_submodules_loaded_before()
