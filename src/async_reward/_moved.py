"""The module paths of release 0.1 that moved in the restructuring, kept working for one release.

Importing an old path (``async_reward.pipeline.main_ppo``, ``async_reward.limits``, a
``custom_sampler.path`` or ``_target_`` written against 0.1, ``python -m async_reward.pipeline.main_ppo``)
gives the module at its new path and a ``DeprecationWarning`` naming that path. One table and one
import hook instead of a stub file per old module: the old tree would otherwise stay on disk beside
the new one. To be removed in the release after next; ``async_reward.judge``, now the judge's package,
answers for the old ``judge`` module's names the same way (:mod:`async_reward.judge`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

__all__ = ["MOVED", "install"]

#: Old dotted path -> new dotted path.
MOVED: dict[str, str] = {
    "async_reward._config_rules": "async_reward._core.config_rules",
    "async_reward.admission_broker": "async_reward._core.admission_broker",
    "async_reward.admission_queue": "async_reward._core.admission_queue",
    "async_reward.checks": "async_reward.config.checks",
    "async_reward.cli": "async_reward.tools.cli",
    "async_reward.cost": "async_reward.judge.cost",
    "async_reward.criteria": "async_reward.judge.rubric.criteria",
    "async_reward.deadline": "async_reward._core.deadline",
    "async_reward.devserver": "async_reward.tools.devserver",
    "async_reward.devserver.config": "async_reward.tools.devserver.config",
    "async_reward.devserver.criteria": "async_reward.tools.devserver.criteria",
    "async_reward.devserver.group": "async_reward.tools.devserver.group",
    "async_reward.devserver.judge": "async_reward.tools.devserver.judge",
    "async_reward.devserver.logprobs": "async_reward.tools.devserver.logprobs",
    "async_reward.devserver.process": "async_reward.tools.devserver.process",
    "async_reward.devserver.server": "async_reward.tools.devserver.server",
    "async_reward.devserver.thread": "async_reward.tools.devserver.thread",
    "async_reward.errors": "async_reward._core.errors",
    "async_reward.expected_verdict": "async_reward.judge.expected",
    "async_reward.group_judging": "async_reward.judge.group.judging",
    "async_reward.group_placement": "async_reward.judge.group.placement",
    "async_reward.group_plants": "async_reward.judge.group.plants",
    "async_reward.http": "async_reward._core.http",
    "async_reward.integration": "async_reward.wiring.integration",
    "async_reward.job_admission": "async_reward._core.job_admission",
    "async_reward.judge_in_job": "async_reward.judge.in_job",
    "async_reward.judge_in_job.admitted": "async_reward.judge.in_job.admitted",
    "async_reward.judge_in_job.checks": "async_reward.judge.in_job.checks",
    "async_reward.judge_in_job.colocate": "async_reward.v1.colocated_judge",
    "async_reward.judge_in_job.context": "async_reward.judge.in_job.context",
    "async_reward.judge_in_job.router_calls": "async_reward.judge.in_job.router_calls",
    "async_reward.judge_in_job.routing": "async_reward.judge.in_job.routing",
    "async_reward.judge_in_job.settings": "async_reward.judge.in_job.settings",
    "async_reward.limits": "async_reward._core.limits",
    "async_reward.managers.criteria_scoring": "async_reward.judge.rubric.scoring",
    "async_reward.managers.criteria_weighting": "async_reward.judge.rubric.weighting",
    "async_reward.managers.group_scoring": "async_reward.judge.group.scoring",
    "async_reward.managers.judge_reply": "async_reward.judge.reply",
    "async_reward.managers.span_weighting": "async_reward.judge.span_weighting",
    "async_reward.offline_rows": "async_reward.tools.offline_rows",
    "async_reward.offline_score": "async_reward.tools.offline_score",
    "async_reward.pipeline": "async_reward.legacy",
    "async_reward.pipeline.agent_loop": "async_reward.legacy.agent_loop",
    "async_reward.pipeline.chunks": "async_reward.legacy.chunks",
    "async_reward.pipeline.dispatch": "async_reward.legacy.dispatch",
    "async_reward.pipeline.exclusion": "async_reward.training.exclusion",
    "async_reward.pipeline.main_ppo": "async_reward.legacy.main_ppo",
    "async_reward.pipeline.manager": "async_reward.legacy.manager",
    "async_reward.pipeline.pool": "async_reward.legacy.pool",
    "async_reward.pipeline.rollout_settings": "async_reward.legacy.rollout_settings",
    "async_reward.pipeline.schedule": "async_reward.training.schedule",
    "async_reward.pipeline.state": "async_reward.legacy.state",
    "async_reward.pipeline.task_runner": "async_reward.legacy.task_runner",
    "async_reward.pipeline.trainer": "async_reward.legacy.trainer",
    "async_reward.pipeline.trainer_config": "async_reward.training.config",
    "async_reward.pipeline.verl_backend": "async_reward.legacy.verl_backend",
    "async_reward.pipeline.worker": "async_reward.legacy.worker",
    "async_reward.postprocess": "async_reward._core.postprocess",
    "async_reward.progress": "async_reward._core.progress",
    "async_reward.redaction": "async_reward._core.redaction",
    "async_reward.registry": "async_reward.managers.registry",
    "async_reward.result": "async_reward._core.result",
    "async_reward.retry": "async_reward._core.retry",
    "async_reward.reward_metrics": "async_reward.training.metrics",
    "async_reward.start_lines": "async_reward._core.start_lines",
    "async_reward.user_code": "async_reward._core.user_code",
    "async_reward.v1.decoupled_agent_loop": "async_reward.v1.decoupled.agent_loop",
    "async_reward.v1.decoupled_config": "async_reward.v1.decoupled.config",
    "async_reward.v1.decoupled_replay_buffer": "async_reward.v1.decoupled.replay_buffer",
    "async_reward.v1.decoupled_trainer": "async_reward.v1.decoupled.trainer",
    "async_reward.v1.decoupled_window": "async_reward.v1.decoupled.window",
    "async_reward.v1.pipelined_agent_loop": "async_reward.v1.pipelined.agent_loop",
    "async_reward.v1.pipelined_batches": "async_reward.v1.pipelined.batches",
    "async_reward.v1.pipelined_choice": "async_reward.v1.pipelined.choice",
    "async_reward.v1.pipelined_config": "async_reward.v1.pipelined.config",
    "async_reward.v1.pipelined_pool": "async_reward.v1.pipelined.pool",
    "async_reward.v1.pipelined_trainer": "async_reward.v1.pipelined.trainer",
    "async_reward.v1.implied_seams": "async_reward.wiring.implied_seams",
    "async_reward.v1.registration": "async_reward.wiring.trainer_modes",
    "async_reward.v1.pipelined_untrained": "async_reward.v1.pipelined.untrained",
    "async_reward.v1.pipelined_waits": "async_reward.v1.pipelined.waits",
    "async_reward.v1.settings": "async_reward.config.v1",
    "async_reward.verdict": "async_reward.judge.verdict",
    "async_reward.verl_plugin": "async_reward.wiring.verl_plugin",
    "async_reward.verl_settings": "async_reward.config.verl_keys",
    "async_reward.worker_imports": "async_reward.wiring.worker_imports",
}


def moved_warning(old: str, new: str) -> None:
    """The one warning an old path gives: where the module lives now."""
    warnings.warn(
        f"{old} moved to {new} (async-reward 0.2); import {new} instead. The old path stops working "
        "in the release after next.",
        DeprecationWarning,
        stacklevel=3,
    )


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object, not a copy)."""

    def __init__(self, new: str) -> None:
        self._new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        moved_warning(spec.name, self._new)
        module = importlib.import_module(self._new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # importlib set the old spec on the shared module object; the module keeps its own.
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m <old path>``: runpy runs the new module's code as ``__main__``."""
        moved_warning(fullname, self._new)
        spec = importlib.util.find_spec(self._new)
        loader = spec.loader if spec is not None else None
        get_code = getattr(loader, "get_code", None)
        return get_code(self._new) if get_code is not None else None


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        if found is None:  # the new module was deleted (the legacy trainer, say): as any missing module
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname,
            _MovedModuleLoader(new),
            origin=found.origin,  # ``python -m``: the new file is ``__file__``
            is_package=found.submodule_search_locations is not None,
        )
        spec.has_location = found.has_location
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` once per process."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
