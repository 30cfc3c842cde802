"""async-reward's verl plugin: the module its ``verl.plugins`` entry point (``async_reward``) names.

verl 0.9.1 imports it at the end of ``import verl`` in every process that imports verl (the driver,
verl's task runner, every Ray worker, a vLLM engine process), unless ``VERL_USE_EXTERNAL_PLUGINS`` is
``none`` or a list without ``async_reward``. It lives outside the ``async_reward`` package so that
verl's import does not run the package's ``__init__`` (which imports our managers, verl's Reward Loop
and transformers with them: seconds, in processes that never score); it imports only
:mod:`async_reward.wiring.verl_plugin` and the few light modules that one needs, and calls its
``install()``, which defers everything else until verl loads the module it concerns.

Loud, never silent: verl logs an exception raised by a plugin at DEBUG only, so this module catches
its own. A failure is logged here at WARNING, in the process where it happened, and this process's
verl then refuses our names (a trainer mode, a reward manager) naming the cause and the fix, instead
of verl's bare ``Unknown trainer 'pipelined'`` (:func:`install_guard`). The same guard speaks when
:data:`OPT_OUT_ENV` turns the plugin off, and when it holds a value that is neither on nor off
(``disabled``): nothing is installed then, and verl's lookups of our names say which value and the
accepted ones. With ``VERL_USE_EXTERNAL_PLUGINS=none`` verl imports nothing of ours, and only
verl's own errors can speak.

Standard library only at import (and wrapt when a guard is installed): it must load even where the
package cannot.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "ACCEPTED_VALUES",
    "ENTRY_POINT",
    "OPT_OUT_ENV",
    "OUR_MANAGER_NAMES",
    "OUR_TRAINER_MODES",
    "NotRegistered",
    "install_guard",
    "load",
    "plugin_turned_off",
    "unrecognised_setting",
]

#: The entry point's name (``VERL_USE_EXTERNAL_PLUGINS=async_reward`` loads only ours).
ENTRY_POINT = "async_reward"
#: ``ASYNC_REWARD_VERL_PLUGIN=0`` (or ``off``, ``false``, ``no``, ``none``) keeps the plugin from
#: registering anything of ours in a process; verl then refuses our names saying so. Unset, empty,
#: ``1``, ``on``, ``true`` or ``yes``: on. Any other value is refused (:func:`load`).
OPT_OUT_ENV = "ASYNC_REWARD_VERL_PLUGIN"
_OFF_VALUES = frozenset({"0", "off", "false", "no", "none"})
_ON_VALUES = frozenset({"", "1", "on", "true", "yes"})
#: The accepted values, as an error message names them.
ACCEPTED_VALUES = (
    "unset, 1, on, true or yes (the plugin on), or 0, off, false, no or none (the plugin off), in any "
    "letter case"
)
#: Our ``trainer.v1.trainer_mode`` values (``async_reward.wiring.trainer_modes.OUR_TRAINER_MODULES``).
OUR_TRAINER_MODES = ("pipelined", "decoupled")
#: Our managers' registered names (``async_reward.MANAGER_NAMES``).
OUR_MANAGER_NAMES = (
    "async_naive",
    "async_rate_limited",
    "async_remote",
    "llm_judge",
    "async_stateful",
    "async_composite",
)
#: The setup-hook line, which registers everything without the plugin.
HOOK_LINE = (
    "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=async_reward.wiring.integration.setup_worker"
)

_logger = logging.getLogger("async_reward")


class NotRegistered(ValueError):
    """verl was asked for a trainer mode or reward manager of ours that is not registered in this
    process; the message names why and the fix. A ``ValueError``, as verl's own lookups raise."""


def plugin_turned_off(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether :data:`OPT_OUT_ENV` turns the plugin off in a process with this environment."""
    return environ.get(OPT_OUT_ENV, "").strip().lower() in _OFF_VALUES


def unrecognised_setting(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why :data:`OPT_OUT_ENV` in this environment is neither on nor off (None: it is one of
    them): ``disabled`` or ``off!`` must not leave the plugin on, nor be guessed to mean off."""
    value = environ.get(OPT_OUT_ENV, "")
    if value.strip().lower() in _OFF_VALUES | _ON_VALUES:
        return None
    return f"{OPT_OUT_ENV}={value!r} is not a value it accepts ({ACCEPTED_VALUES})"


def load() -> None:
    """What importing this module does: install the plugin, or, turned off, set to a value it does
    not accept, or failing, the guard.

    A value of :data:`OPT_OUT_ENV` that is neither on nor off is not raised here: verl imports this
    module from ``import verl`` and logs what it raises at DEBUG only (and every process imports verl,
    a plain verl job's too). So nothing of ours is installed, a WARNING names the variable and the
    accepted values in every process that imports verl, and verl's lookup of any of our names (a
    reward manager, a trainer mode) raises :class:`NotRegistered` saying the same: a job that uses
    async-reward stops at start-up, one that does not runs as verl alone would, with the warning."""
    problem = unrecognised_setting()
    if problem is not None:
        fix = f"set {OPT_OUT_ENV} to one of those where verl runs (the driver and the Ray workers)"
        _logger.warning(
            "%s: async-reward's verl plugin is not installed in this process, and verl will refuse "
            "async-reward's reward managers and trainer modes here; %s",
            problem,
            fix,
        )
        install_guard(problem, fix)
        return
    if plugin_turned_off():
        install_guard(
            f"async-reward's verl plugin is turned off in this process ({OPT_OUT_ENV}="
            f"{os.environ.get(OPT_OUT_ENV)})",
            f"unset {OPT_OUT_ENV} where verl runs (the driver and the Ray workers), or add {HOOK_LINE}",
        )
        return
    try:
        _import_without_package_init("async_reward.wiring.verl_plugin").install()
    except Exception as error:
        cause = f"async-reward's verl plugin failed to load in this process ({type(error).__name__}: {error})"
        _logger.warning(
            "%s: verl will not find async-reward's reward managers or trainer modes here",
            cause,
            exc_info=True,
        )
        install_guard(cause, "fix the error logged above (reinstall async-reward if a module is missing)")


def _import_without_package_init(name: str) -> ModuleType:
    """Import ``async_reward.<...>`` without running ``async_reward/__init__.py`` when the package is
    not imported yet (as ``async_reward_cli`` does for the command line): the package module sits in
    ``sys.modules`` unexecuted while ``name`` loads, and is taken out again, so the first later
    ``import async_reward`` runs ``__init__`` as usual and reuses the submodules already loaded."""
    if "async_reward" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec("async_reward")
    if spec is None:
        raise ModuleNotFoundError("async_reward is not installed", name="async_reward")
    sys.modules["async_reward"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(name)
    finally:
        del sys.modules["async_reward"]


#: (verl package, module that defines the lookup, lookup name, our names there, the config key, what).
_LOOKUPS = {
    "trainer mode": (
        "verl.trainer.ppo.v1",
        "verl.trainer.ppo.v1.trainer_base",
        "get_trainer_cls",
        OUR_TRAINER_MODES,
        "trainer.v1.trainer_mode",
    ),
    "reward manager": (
        "verl.experimental.reward_loop.reward_manager",
        "verl.experimental.reward_loop.reward_manager.registry",
        "get_reward_manager_cls",
        OUR_MANAGER_NAMES,
        "reward.reward_manager.name",
    ),
}


def install_guard(cause: str, fix: str, kinds: tuple[str, ...] = tuple(_LOOKUPS)) -> None:
    """Make verl's lookups of our names (``kinds``: ``trainer mode``, ``reward manager``) that fail in
    this process raise :class:`NotRegistered` naming ``cause`` and ``fix``, once verl loads them.

    A lookup that succeeds, and one of a name not ours, is verl's own: nothing else changes."""
    import wrapt

    for kind in kinds:
        package, home, attribute, names, key = _LOOKUPS[kind]
        why = f"names async-reward's {kind}, which is not registered in this process: {cause}. Fix: {fix}"
        hook = functools.partial(
            _guard_lookup, home=home, attribute=attribute, names=names, refusal=(key, why)
        )
        wrapt.register_post_import_hook(hook, package)


def _guard_lookup(
    package: ModuleType, home: str, attribute: str, names: tuple[str, ...], refusal: tuple[str, str]
) -> None:
    """Wrap ``attribute`` where verl's callers find it: the package (read at call time) and its home."""
    for module in (importlib.import_module(home), package):
        lookup = getattr(module, attribute, None)
        if callable(lookup) and not getattr(lookup, "_async_reward_guard", False):
            setattr(module, attribute, _guarded(lookup, names, refusal))


def _guarded(
    lookup: Callable[[str], Any], names: tuple[str, ...], refusal: tuple[str, str]
) -> Callable[[str], Any]:
    key, why = refusal

    @functools.wraps(lookup)
    def guarded(name: str) -> Any:
        try:
            return lookup(name)
        except ValueError as error:
            if name in names and not isinstance(error, NotRegistered):
                raise NotRegistered(f"{key}={name} {why}") from None  # ours replaces verl's bare one
            raise

    guarded._async_reward_guard = True  # type: ignore[attr-defined]
    return guarded


load()
