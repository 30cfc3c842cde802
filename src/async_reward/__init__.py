"""async-reward: asyncio-native reward managers for verl's Reward Loop.

Importing the package registers our managers with verl's registry (``async_naive``,
``async_rate_limited``, ``async_remote``, ``llm_judge``, ``async_stateful``, ``async_composite``). In
a Ray worker process (where our setup hook imports it) they are registered as soon as verl's
reward-manager package loads instead, so that a worker that never loads verl does not pay for it
(:mod:`async_reward.wiring.worker_imports`); their names here load on first use. The public API
is what this module lists in ``__all__``, the subclass contract of :class:`AsyncRewardManager`
(docs/extending.md), and the packages ``async_reward.config``, ``async_reward.v1`` and
``async_reward.testing``; modules under ``_core`` and names starting with ``_`` are internal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from async_reward import _moved
from async_reward._core.result import RewardResult, RewardSample, Status
from async_reward.config import AsyncRewardConfig, ConfigError, load_config
from async_reward.wiring.worker_imports import in_ray_worker, register_managers_with_verls_registry

_moved.install()

#: Public names loaded on first use, and their modules: the managers import verl (deferred in a Ray
#: worker until verl loads, :mod:`async_reward.wiring.worker_imports`), and the launcher helpers
#: import the trainer modes' settings, which a process that only scores never needs.
_LAZY_NAMES = {
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
    "register_manager": "async_reward.managers.registry",
    **dict.fromkeys(
        ("SETUP_HOOK", "prepare_verl_config", "ray_runtime_env", "setup_worker"),
        "async_reward.wiring.integration",
    ),
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
    from async_reward.managers.registry import register_manager
if TYPE_CHECKING:
    from async_reward.wiring.integration import SETUP_HOOK, prepare_verl_config, ray_runtime_env, setup_worker


def __getattr__(name: str) -> Any:
    """A public name of :data:`_LAZY_NAMES`, imported on first use. Only those: a submodule is
    imported by its own path (``import async_reward.tools.cli``), never found by attribute here."""
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
