"""What our setup hook costs a Ray worker (:mod:`async_reward.wiring.worker_imports`): a worker that never
loads verl (TransferQueue's controller and storage, a server) imports none of it; wherever verl's
reward-manager registry is read, ours are in it, whichever module loads verl first."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork, run_probe

#: Our managers' registered names (``async_reward.MANAGER_NAMES``, spelled out: reading that name in
#: a worker would import the managers before verl's registry could).
MANAGER_NAMES = (
    "async_naive",
    "async_rate_limited",
    "async_remote",
    "llm_judge",
    "async_stateful",
    "async_composite",
)
#: verl modules a worker may load first, besides each of ours.
VERL_FIRST = (
    "verl.experimental.reward_loop.reward_manager.registry",
    "verl.experimental.reward_loop",
    "verl.trainer.ppo.reward",
    "verl.trainer.ppo.v1",
)


@ray.remote(num_cpus=0)
class ImportProbe:
    """An actor of no verl class: what the setup hook left loaded, and verl's registry once read."""

    def loaded(self) -> dict[str, bool]:
        import async_reward  # what a user's code in a worker may do first

        return {
            "hook_ran": "async_reward.wiring.integration" in sys.modules,
            "verl": "verl" in sys.modules,
            "torch": "torch" in sys.modules,
            "managers": "async_reward.managers" in sys.modules,
            "has_config": hasattr(async_reward, "AsyncRewardConfig"),
        }

    def registry(self) -> dict[str, Any]:
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

        import async_reward

        return {
            "registered": sorted(set(MANAGER_NAMES) & set(REWARD_MANAGER)),
            "llm_judge": get_reward_manager_cls("llm_judge").__qualname__,
            "package_attribute": async_reward.LLMJudgeRewardManager.__qualname__,
        }


@pytest.mark.usefixtures("ray_cluster")
def test_a_worker_that_never_loads_verl_imports_none_of_it_and_verls_registry_has_ours():
    import async_reward

    assert tuple(async_reward.MANAGER_NAMES) == MANAGER_NAMES
    probe = ImportProbe.remote()
    try:
        loaded = ray.get(probe.loaded.remote(), timeout=120)
        assert loaded == {
            "hook_ran": True,
            "verl": False,
            "torch": False,
            "managers": False,
            "has_config": True,
        }
        registry = ray.get(probe.registry.remote(), timeout=120)
    finally:
        ray.kill(probe, no_restart=True)
    assert registry == {
        "registered": sorted(MANAGER_NAMES),
        "llm_judge": "LLMJudgeRewardManager",
        "package_attribute": "LLMJudgeRewardManager",
    }


#: Imported by the probe's parent before it forks, after the third-party packages
#: (:func:`tests.support.first_import_probe.preload_third_party`): verl's data layer and configs.
VERL_PRELOADED = (
    "verl.protocol",
    "verl.utils.model",
    "verl.workers.config",
    "verl.single_controller.ray",
)


def _first_import_through(name: str) -> dict[str, Any]:
    """In this (forked, fresh) process: import ``name`` first, then read verl's registry."""
    importlib.import_module(name)
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    return {
        "module": name,
        "registered": sorted(set(MANAGER_NAMES) & set(REWARD_MANAGER)),
        "llm_judge": get_reward_manager_cls("llm_judge").__qualname__,
    }


def _our_modules(root: Path) -> list[str]:
    """Every module of the package, read off its files (``pkgutil.walk_packages`` would import each
    subpackage, and so verl, in the process meant to stay fresh)."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def probe_every_module_as_a_ray_worker() -> None:
    """Run in a subprocess: the package and our setup hook as a Ray worker imports them (the process
    marked a worker, as Ray's ``default_worker`` has it when the hook runs), then in a forked child
    each, one module of ours or of verl imported first."""
    import ray._private.worker as ray_worker

    ray_worker.global_worker.mode = ray_worker.WORKER_MODE
    import async_reward
    from async_reward.wiring.integration import setup_worker

    setup_worker()
    assert "verl" not in sys.modules and "async_reward.managers" not in sys.modules
    # What every child would import anyway, once here (a child then costs a fraction of a second, not
    # the five CPU-seconds of torch and verl): nothing of verl's Reward Loop, whose first importer is
    # what each child varies.
    preload_third_party()
    for heavy in VERL_PRELOADED:
        importlib.import_module(heavy)
    fresh = ("verl.experimental", "async_reward.managers")
    assert not [name for name in sys.modules if name.startswith(fresh)]
    ours = _our_modules(Path(async_reward.__file__).parent)
    report_each_in_a_fork([*VERL_FIRST, *(n for n in ours if n not in sys.modules)], _first_import_through)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_in_a_ray_worker_any_module_may_load_verl_first_and_the_registry_has_ours() -> None:
    """No circular import, whichever module loads verl's reward managers first (one of ours whose
    import reaches verl's base class included), and the registry then holds all five of ours."""
    reports = run_probe(
        "from tests.wiring.test_worker_imports import probe_every_module_as_a_ray_worker as p; p()"
    )
    probed = {r["module"] for r in reports}
    assert set(VERL_FIRST) | {"async_reward.managers.base", "async_reward.judge.in_job.routing"} <= probed
    for report in reports:
        assert report["registered"] == sorted(MANAGER_NAMES), report
        assert report["llm_judge"] == "LLMJudgeRewardManager", report
