"""Register our v1 trainer modes (``pipelined``, ``decoupled``) where verl looks a mode up.

verl's ``TaskRunnerV1`` (a Ray actor) resolves ``trainer.v1.trainer_mode`` with
``verl.trainer.ppo.v1.get_trainer_cls``, so our trainer must be registered in that actor's process by
then. Our verl plugin (and the Ray setup hook) runs in every process that imports verl, but importing
verl's v1 trainer costs about 1.6 s and most processes (reward, agent loop, GPU) never need it. So it
registers a post-import hook (wrapt's, as for verl's trainer classes) that wraps verl's
``get_trainer_cls`` once ``verl.trainer.ppo.v1`` is imported; the wrapper imports our trainer module
(which registers itself with verl's ``register_trainer``) when verl looks up one of our modes.

Why at the lookup and not when verl's v1 trainer is imported: the first importer of verl's v1 trainer
in a process is often one of our own modules (``async_reward.v1.agent_loop`` in every agent-loop
worker, ``async_reward.v1.replay_buffer`` where verl loads the sampler). Importing our trainer modules
from the post-import hook then ran in the middle of that module's import, and the trainer modules
import it back: a circular import that left the modes unregistered in that process (seen on a GPU run:
an ``ImportError`` traceback in every agent-loop worker's log). A lookup happens after imports are
done, and a mode whose module cannot be imported now fails at the lookup with the real error.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import wrapt

__all__ = ["OUR_TRAINER_MODULES", "VERL_V1_PACKAGE", "register_trainer_modes_on_lookup"]

VERL_V1_PACKAGE = "verl.trainer.ppo.v1"
_VERL_TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"

#: ``trainer.v1.trainer_mode`` -> the module that registers it when imported.
OUR_TRAINER_MODULES: dict[str, str] = {
    "pipelined": "async_reward.v1.pipelined.trainer",
    "decoupled": "async_reward.v1.decoupled.trainer",
}


def register_trainer_modes_on_lookup() -> None:
    """Make verl's ``get_trainer_cls`` resolve ``pipelined`` and ``decoupled`` to our trainers, now if
    verl's v1 trainer is loaded, else once it is. Idempotent."""
    wrapt.register_post_import_hook(_wrap_lookup, VERL_V1_PACKAGE)


def _wrap_lookup(package: ModuleType) -> None:
    """Replace ``get_trainer_cls`` where verl's callers find it: the v1 package (``main_ppo`` imports it
    from there when it runs) and ``trainer_base``, its home."""
    trainer_base = importlib.import_module(_VERL_TRAINER_BASE)
    for module in (trainer_base, package):
        lookup = getattr(module, "get_trainer_cls", None)
        if lookup is not None and not getattr(lookup, "_async_reward_modes", False):
            module.get_trainer_cls = _registering_our_modes_first(lookup)  # type: ignore[attr-defined]


def _registering_our_modes_first(lookup: Callable[[str], Any]) -> Callable[[str], Any]:
    @functools.wraps(lookup)
    def get_trainer_cls(name: str) -> Any:
        module = OUR_TRAINER_MODULES.get(name)
        if module is not None:
            importlib.import_module(module)  # registers on import; a broken module raises its own error
            return lookup(name)
        try:
            return lookup(name)
        except ValueError:  # an unknown mode (a typo of ours?): verl's error lists every mode, ours too
            for our_module in OUR_TRAINER_MODULES.values():
                with contextlib.suppress(ImportError):  # the unknown name stays the error to report
                    importlib.import_module(our_module)
            return lookup(name)

    get_trainer_cls._async_reward_modes = True  # type: ignore[attr-defined]
    return get_trainer_cls
