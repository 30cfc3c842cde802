"""Register the ``pipelined`` v1 trainer mode in a process as soon as verl's v1 trainer loads there.

verl's ``TaskRunnerV1`` (a Ray actor) looks the mode up in its registry
(``verl.trainer.ppo.v1.get_trainer_cls``), so our trainer must be registered in that actor's process.
The Ray setup hook runs in every worker process, but importing verl's v1 trainer costs about 1.6 s
and most workers (reward, agent loop, GPU) never need it. So the hook only arranges for the
registration to happen right after ``verl.trainer.ppo.v1`` is imported, in whichever process imports
it: a one-shot finder on ``sys.meta_path`` wraps that package's loader, nothing else.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["VERL_V1_PACKAGE", "register_pipelined_mode_on_verl_import", "run_after_import"]

logger = logging.getLogger(__name__)

VERL_V1_PACKAGE = "verl.trainer.ppo.v1"


def register_pipelined_mode_on_verl_import() -> None:
    """Register ``trainer_mode=pipelined`` now if verl's v1 trainer is loaded, else once it is."""
    run_after_import(VERL_V1_PACKAGE, _register)


def _register() -> None:
    try:
        import async_reward.v1.pipelined_trainer  # noqa: F401  (registers on import)
    except Exception:  # verl v1 must keep working for the other modes; the mode's lookup then fails
        logger.exception("async-reward could not register verl v1 trainer_mode=pipelined")


def run_after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` once module ``name`` has been imported (at once if it already is)."""
    if name in sys.modules:
        callback()
        return
    if any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``name`` it asks the other finders and wraps the loader they give."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot: the real finders below find the real spec
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        original = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback()

        loader.exec_module = exec_module
        return spec
