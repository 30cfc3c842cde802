"""Idempotent registration of our managers in verl's reward-manager registry.

verl's ``register(name)`` raises when a *different* class object is registered under a name that is
taken. That happens legitimately: ``verl.utils.import_utils.load_extern_object`` re-executes a user's
file under a fresh module name each time it is called, creating a new class object with the same
definition. ``register_manager`` treats a class with the same qualified name and origin file as the
same registration, and still refuses a genuine collision (another class under a taken name).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

__all__ = ["VERL_BUILTIN_NAMES", "register_manager"]

#: Names verl registers itself; ours must differ.
VERL_BUILTIN_NAMES = frozenset({"naive", "rate_limited", "remote", "dapo", "gdpo"})

_C = TypeVar("_C", bound=type)


def _origin(cls: type) -> tuple[str, str | None]:
    try:
        source_file = inspect.getsourcefile(cls)
    except TypeError:
        source_file = None
    return cls.__qualname__, source_file


def register_manager(name: str) -> Callable[[_C], _C]:
    """Register ``cls`` with verl under ``name``; re-registering the same definition is a no-op.

    Raises:
        ValueError: ``name`` is one of verl's own names, or another class already holds it.
    """

    def decorator(cls: _C) -> _C:
        # Imported here, not at the top: importing verl's registry loads verl's reward-manager package,
        # whose load imports our managers in a Ray worker (async_reward.wiring.worker_imports), and they
        # import this module: it must not be the one half-initialised then.
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, register

        if name in VERL_BUILTIN_NAMES:
            raise ValueError(f"{name!r} is one of verl's built-in reward managers; choose another name")
        existing = REWARD_MANAGER.get(name)
        if existing is cls:
            return cls
        if existing is not None:
            if _origin(existing) == _origin(cls):
                # Same definition re-executed (load_extern_object): keep the first registration so
                # every process resolves the name to one class.
                return cls
            raise ValueError(
                f"reward manager name {name!r} is already registered to {existing.__module__}."
                f"{existing.__qualname__}; choose another name"
            )
        register(name)(cls)
        return cls

    return decorator
