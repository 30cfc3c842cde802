"""Register our v1 trainer modes (``pipelined``, ``decoupled``) in a process as soon as verl's v1 trainer
loads there.

verl's ``TaskRunnerV1`` (a Ray actor) looks the mode up in its registry
(``verl.trainer.ppo.v1.get_trainer_cls``), so our trainer must be registered in that actor's process.
The Ray setup hook runs in every worker process, but importing verl's v1 trainer costs about 1.6 s
and most workers (reward, agent loop, GPU) never need it. So the hook registers a post-import hook
(wrapt's, the one the setup hook also uses for verl's trainer classes): the registration happens
right after ``verl.trainer.ppo.v1`` is imported, in whichever process imports it, and nowhere else.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

import wrapt

__all__ = ["VERL_V1_PACKAGE", "register_pipelined_mode_on_verl_import"]

logger = logging.getLogger(__name__)

VERL_V1_PACKAGE = "verl.trainer.ppo.v1"


def register_pipelined_mode_on_verl_import() -> None:
    """Register ``trainer_mode=pipelined`` and ``decoupled`` now if verl's v1 trainer is loaded, else once
    it is."""
    wrapt.register_post_import_hook(_register, VERL_V1_PACKAGE)


def _register(_: ModuleType) -> None:
    for mode in ("pipelined", "decoupled"):
        try:
            importlib.import_module(f"async_reward.v1.{mode}_trainer")  # registers on import
        except Exception:  # verl v1 must keep working for the other modes; the mode's lookup then fails
            logger.exception("async-reward could not register verl v1 trainer_mode=%s", mode)
