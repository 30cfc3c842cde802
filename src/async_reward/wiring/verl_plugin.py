"""What async-reward installs in a process that imports verl, and when it acts on a job.

verl 0.9.1 ends its own ``import verl`` by importing each setuptools entry point of the group
``verl.plugins`` (``VERL_USE_EXTERNAL_PLUGINS``: ``auto`` by default, ``none``, or a comma list of
entry-point names); it calls nothing, and a plugin that raises is logged at DEBUG only. Ours
(``async_reward``, see ``pyproject.toml``) names the module ``async_reward_verl_plugin``, outside this
package so that verl's import does not run the package's ``__init__`` (which imports our managers, and
so verl's Reward Loop and transformers: seconds); it imports this module alone and calls
:func:`install`. The Ray setup hook (``async_reward.wiring.integration.setup_worker``) calls it too:
everything here is idempotent, so the hook line and the plugin can both run in one process.

:func:`install` only registers wrapt post-import hooks, each acting once verl's module is loaded:

* our managers are imported (and so registered) right after verl's reward-manager registry package
  (:mod:`async_reward.wiring.worker_imports`);
* verl's ``get_trainer_cls`` resolves ``pipelined`` and ``decoupled``
(:mod:`async_reward.wiring.trainer_modes`);
* verl's trainers (``RayPPOTrainer``, v1's ``PPOTrainer``) and ``RewardLoopManager`` run
  :func:`prepare_where_verl_builds` on their config when constructed;
* verl v1's colocated scoring step hands our managers' batches to ours (installed at its first call).

A hook runs when verl's module has finished loading, which may be in the middle of a larger import
(verl's ``verl.trainer.ppo.v1`` package loads ``trainer_base`` first): none of these hooks imports a
module of ours that imports verl, they only wrap; what they wrap imports ours when it is called,
after imports are done. (A setup that imported our modules from such a hook crashed verl's task
runner in a prototype: a module of verl read back half-initialised.)

**Inert unless asked for.** Every wrapper acts only on a config that asks for async-reward
(:func:`asks_for_async_reward`: one of our managers, trainer modes, keys or classes). A plain verl
job (verl's own manager, mode and keys) runs as without the package: its config is not rewritten,
the legacy ``reward_model.*`` keys are left to verl, and none of our checks runs. Turning the plugin
off: ``ASYNC_REWARD_VERL_PLUGIN=0`` (ours: verl then refuses our names saying so) or verl's
``VERL_USE_EXTERNAL_PLUGINS=none`` (every plugin; verl then knows nothing of ours).
"""

from __future__ import annotations

import functools
from typing import Any

import wrapt

from async_reward.wiring.trainer_modes import OUR_TRAINER_MODULES, register_trainer_modes_on_lookup
from async_reward.wiring.worker_imports import (
    check_where_verl_builds_its_reward_loop,
    register_managers_with_verls_registry,
)

__all__ = [
    "OUR_KEYS",
    "VERL_TRAINERS",
    "VERL_V1_TRAINER_MODULE",
    "asks_for_async_reward",
    "install",
    "prepare_where_verl_builds",
]

#: verl's trainer classes whose ``__init__`` is wrapped (module, class): built in the task runner
#: before any GPU worker starts, so our start-up checks run there, and the legacy reward keys are
#: migrated where verl's own entry point never calls ``migrate_legacy_reward_impl``.
VERL_TRAINERS = (
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer"),
)
#: verl v1's trainer module, whose colocated-judge scoring step is handed to ours for our managers.
VERL_V1_TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"

#: Config nodes only async-reward reads: any of them set asks for async-reward.
OUR_KEYS = ("reward.async_reward", "async_reward", "trainer.v1.pipelined", "trainer.v1.decoupled")
#: Config keys that name a class: one of ours asks for async-reward.
_CLASS_KEYS = (
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
    "trainer.v1.sampler.custom_sampler.path",
)
#: Config keys that name a registered reward manager (verl's key, and the legacy one it migrates).
_MANAGER_KEYS = ("reward.reward_manager.name", "reward_model.reward_manager")

_installed = False


def install() -> None:
    """Register what async-reward needs in this process, each piece once verl loads its module (see
    the module docstring). Imports nothing of verl, and none of our managers. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    register_managers_with_verls_registry()
    register_trainer_modes_on_lookup()
    check_where_verl_builds_its_reward_loop(_prepare_reward_loop)
    for module, name in VERL_TRAINERS:
        wrapt.register_post_import_hook(functools.partial(_wrap_trainer_init, name=name), module)
    wrapt.register_post_import_hook(_defer_colocate_step, VERL_V1_TRAINER_MODULE)


def _select(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        if not hasattr(node, "get"):
            return None
        node = node.get(part)
    return node


def asks_for_async_reward(config: Any) -> str | None:
    """The setting by which ``config`` asks for async-reward (``key=value`` or the key), or None for a
    plain verl config, which every hook of ours then leaves alone.

    Asking: ``trainer.v1.trainer_mode`` one of ours (under ``trainer.use_v1=false`` too, where the
    start-up checks refuse it: verl's legacy trainer would ignore it); a node only we read (:data:`OUR_KEYS`);
    a reward manager of ours (``reward.reward_manager.name`` with ``source: register``, or the legacy
    ``reward_model.reward_manager``), a subclass of ours registered under its own name included; or
    one of our classes named as verl's agent-loop manager or custom sampler."""
    mode = _select(config, "trainer.v1.trainer_mode")
    if isinstance(mode, str) and mode in OUR_TRAINER_MODULES:
        return f"trainer.v1.trainer_mode={mode}"
    for key in OUR_KEYS:
        if _select(config, key) is not None:
            return key
    for key in _CLASS_KEYS:
        value = _select(config, key)
        if isinstance(value, str) and value.removeprefix("pkg://").startswith("async_reward."):
            return f"{key}={value}"
    registered = (_select(config, "reward.reward_manager.source") or "register") == "register"
    for key in _MANAGER_KEYS if registered else _MANAGER_KEYS[1:]:
        name = _select(config, key)
        if isinstance(name, str) and _is_our_manager(name):
            return f"{key}={name}"
    return None


def _is_our_manager(name: str) -> bool:
    """Whether verl's registry resolves ``name`` to a manager of ours (or a subclass of one).

    verl's own names answer without an import; any other name reads verl's registry, which loads our
    managers with it (this runs where verl builds its trainer, which loads them anyway)."""
    from async_reward.managers.registry import VERL_BUILTIN_NAMES

    if name in VERL_BUILTIN_NAMES:
        return False
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    from async_reward.managers import AsyncRewardManager

    manager_cls = REWARD_MANAGER.get(name)
    return isinstance(manager_cls, type) and issubclass(manager_cls, AsyncRewardManager)


def prepare_where_verl_builds(config: Any) -> str | None:
    """What runs where verl builds its trainer, for a config that asks for async-reward: the legacy
    reward keys applied, the v1 seams our managers need implied where the user set none
    (:func:`async_reward.wiring.implied_seams.imply_v1_seams`), and every start-up check. Returns why the
    config is ours (None: a plain verl config, left untouched).

    Raises:
        ConfigError: naming the key and the fix.
    """
    reason = asks_for_async_reward(config)
    if reason is None:
        return None
    from omegaconf import DictConfig

    from async_reward.config.verl_keys import apply_legacy_reward_keys
    from async_reward.v1.checks import apply_legacy_and_check
    from async_reward.wiring.implied_seams import imply_v1_seams

    if isinstance(config, DictConfig):
        apply_legacy_reward_keys(config, late=True)  # the manager the seams are for may be named there
        imply_v1_seams(config)
    apply_legacy_and_check(config)
    return reason


def _prepare_reward_loop(config: Any) -> None:
    """Where verl builds its ``RewardLoopManager``: for a config of ours, the judge-in-job routing
    (our reward worker, the standalone judge awake) and :func:`prepare_where_verl_builds`."""
    if asks_for_async_reward(config) is None:
        return
    from async_reward.judge.in_job.routing import install_reward_loop_hooks

    install_reward_loop_hooks()
    prepare_where_verl_builds(config)


def _wrap_trainer_init(module: Any, name: str) -> None:
    """Make ``module.<name>.__init__`` run :func:`prepare_where_verl_builds` on its config first."""
    trainer_cls = getattr(module, name, None)
    original = getattr(trainer_cls, "__init__", None)
    if original is None or getattr(original, "_async_reward_checked", False):
        return

    @functools.wraps(original)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("config", args[0] if args else None)
        if config is not None:
            prepare_where_verl_builds(config)
        original(self, *args, **kwargs)

    checked_init._async_reward_checked = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = checked_init  # type: ignore[misc]


def _defer_colocate_step(module: Any) -> None:
    """Install :func:`async_reward.v1.colocated_judge.install_colocate_step` at the first call of
    verl v1's colocated scoring step, not when verl's trainer module loads: that import reaches our
    managers (verl's Reward Loop), which a process that never scores there should not pay for, and
    which must not run in the middle of verl's own import of its trainer package."""
    trainer_cls: Any = getattr(module, "PPOTrainer", None)
    verls = getattr(trainer_cls, "_compute_reward_colocate", None)
    if verls is None or any(
        getattr(verls, flag, False) for flag in ("_async_reward_colocate", "_async_reward_deferred")
    ):
        return

    @functools.wraps(verls)
    def first_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if trainer_cls._compute_reward_colocate is not first_call:  # ours was installed over this one
            return verls(self, *args, **kwargs)
        from async_reward.v1.colocated_judge import install_colocate_step

        trainer_cls._compute_reward_colocate = verls
        install_colocate_step(module)
        return trainer_cls._compute_reward_colocate(self, *args, **kwargs)

    first_call._async_reward_deferred = True  # type: ignore[attr-defined]
    trainer_cls._compute_reward_colocate = first_call
