"""What a process pays for our setup hook or verl plugin: nothing of verl until verl needs us.

The setup hook (``async_reward.wiring.integration.setup_worker``) runs in every worker process of a job, and
our verl plugin (:mod:`async_reward.wiring.verl_plugin`) in every process that imports verl:
the reward and agent-loop workers that use our managers, and also TransferQueue's controller and
storage units, servers and every other actor, which never do. Importing our managers imports verl
(``DataProto``, its Reward Loop, transformers), about 3.5 CPU-seconds on top of torch. So in a Ray
worker the package defers them, and they load when verl loads its own:

* :func:`register_managers_with_verls_registry` imports :mod:`async_reward.managers` (which registers them)
  as soon as verl's ``verl.experimental.reward_loop.reward_manager`` package has loaded: whoever
  reads verl's registry (``get_reward_manager_cls`` in the task runner's ``RewardLoopManager`` and in
  every ``RewardLoopWorker``, or ``REWARD_MANAGER`` itself) imports that package first, so finds
  ours. Outside a Ray worker ``import async_reward`` still registers them at once.
* :func:`check_where_verl_builds_its_reward_loop` wraps verl's ``RewardLoopManager.__init__`` once its
  module is imported: the wrapper runs the check it was given (our start-up checks and the
  judge-in-job routing, for a config that asks for async-reward) when the manager is built.

Both act when verl's module has been imported (wrapt's post-import hook). An import from a
post-import hook runs in the middle of whichever import loaded verl's module, and a module that
imports it back fails half-initialised (the circular import described in
:mod:`async_reward.wiring.trainer_modes`): the managers are imported after verl's whole reward-manager
package (which only its own modules import at load time) and never while one of ours is loading
them; the ``RewardLoopManager`` wrapper imports at call time, when imports are done.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import wrapt

__all__ = [
    "check_where_verl_builds_its_reward_loop",
    "in_ray_worker",
    "register_managers_with_verls_registry",
]

logger = logging.getLogger(__name__)

#: verl's reward-manager package: its registry (``REWARD_MANAGER``, ``get_reward_manager_cls``) and
#: verl's own managers; every reader of the registry imports it first.
VERL_REGISTRY_PACKAGE = "verl.experimental.reward_loop.reward_manager"
#: The module of verl's ``RewardLoopManager``.
VERL_REWARD_LOOP_MODULE = "verl.experimental.reward_loop.reward_loop"
#: The module whose import registers our managers.
OUR_MANAGERS = "async_reward.managers"
_managers_tried = False


def in_ray_worker() -> bool:
    """True in a Ray worker process (where the setup hook runs), False in a driver or a plain process."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    global_worker = getattr(worker, "global_worker", None)
    return getattr(global_worker, "mode", None) == getattr(worker, "WORKER_MODE", object())


def register_managers_with_verls_registry() -> None:
    """Import (and so register) our managers once verl's reward-manager package has loaded: now if
    it is, else right after it is. Idempotent."""
    wrapt.register_post_import_hook(_import_our_managers, VERL_REGISTRY_PACKAGE)


def _import_our_managers(_package: ModuleType) -> None:
    """verl's package has finished its own imports (its registry, its managers): importing ours now
    cannot meet one of verl's half-initialised. When one of ours is the importer (a manager module
    imports verl's base class, which loads verl's package), ``async_reward.managers`` is already being
    imported and registers every manager as it completes: importing it again from here would read
    it half-initialised.

    Our managers failing to import must not break verl's own import (a job with verl's managers would
    stop on our error): it is logged at WARNING, and a lookup of one of our names then fails naming it
    (``async_reward_verl_plugin.install_guard``)."""
    global _managers_tried
    if OUR_MANAGERS in sys.modules or _managers_tried:
        return
    _managers_tried = True  # once: the package's own import calls this again while it runs
    try:
        importlib.import_module(OUR_MANAGERS)
    except Exception as error:
        from async_reward_verl_plugin import install_guard

        cause = f"async-reward's managers failed to import in this process ({type(error).__name__}: {error})"
        logger.warning("%s", cause, exc_info=True)
        install_guard(cause, "fix the error logged with it", kinds=("reward manager",))


def check_where_verl_builds_its_reward_loop(check: Callable[[Any], None]) -> None:
    """Run ``check(config)`` at the top of verl's ``RewardLoopManager.__init__`` in this process, now
    if its module is loaded, else once it is (``async_reward.wiring.verl_plugin`` passes the check that also
    installs the judge-in-job routing, for a config of ours)."""
    wrap = functools.partial(_wrap_reward_loop_manager, check=check)
    wrapt.register_post_import_hook(wrap, VERL_REWARD_LOOP_MODULE)


def _wrap_reward_loop_manager(module: ModuleType, check: Callable[[Any], None]) -> None:
    """verl builds ``RewardLoopManager`` in its task runner (a Ray actor) and starts its
    ``RewardLoopWorker`` actors without waiting for them: a worker whose manager refuses the config
    only surfaces as an ``ActorDiedError`` at the first scoring call, after every GPU worker started.
    Checking first makes the same ``ConfigError`` the task runner's own error, at start-up. Only this
    process's class is wrapped, once; verl's behaviour is otherwise unchanged."""
    manager_cls = module.RewardLoopManager
    original = manager_cls.__init__
    if getattr(original, "_async_reward_checked", False):
        return

    @functools.wraps(original)
    def checked_init(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        check(config)
        original(self, config, *args, **kwargs)

    checked_init._async_reward_checked = True  # type: ignore[attr-defined]
    manager_cls.__init__ = checked_init
