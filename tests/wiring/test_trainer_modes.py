"""Our verl v1 trainer modes resolve in every process the setup hook ran in, whichever module imports
verl's v1 trainer first.

Found on a GPU run: in verl's agent-loop workers the first importer of verl's v1 trainer is our
``async_reward.v1.agent_loop``; registering the modes from a post-import hook then imported our trainer
modules in the middle of that import, they imported it back, and the modes stayed unregistered there
(an ``ImportError`` traceback in every worker's log). Each case here runs in a fresh process, as a Ray
worker is: a subprocess that runs the setup hook once, then forks one child per module, so each child
imports verl's v1 trainer for the first time through that module.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from typing import Any

import pytest

from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork, run_probe

VERL_V1 = "verl.trainer.ppo.v1"
OURS = {
    "pipelined": "async_reward.v1.pipelined.trainer.PPOTrainerPipelined",
    "decoupled": "async_reward.v1.decoupled.trainer.PPOTrainerDecoupled",
}


def _first_import_through(name: str) -> dict[str, Any]:
    """In this (forked, fresh) process: import ``name``, then resolve verl's ``sync`` and our modes as
    verl's task runner does; which of our trainer modules were loaded before our modes were looked up,
    and what was logged at ERROR or above meanwhile."""
    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    logging.getLogger().addHandler(Collect(level=logging.ERROR))
    importlib.import_module(name)
    if VERL_V1 not in sys.modules:
        return {"module": name, "imports_verl_v1": False}
    from verl.trainer.ppo.v1 import get_trainer_cls

    our_trainer_modules = {path.rsplit(".", 1)[0] for path in OURS.values()}
    sync = get_trainer_cls("sync")
    ours_loaded = sorted(our_trainer_modules & set(sys.modules))  # after verl's own mode, before ours
    resolved = {"sync": f"{sync.__module__}.{sync.__qualname__}"}
    for mode in OURS:
        cls = get_trainer_cls(mode)
        resolved[mode] = f"{cls.__module__}.{cls.__qualname__}"
    return {
        "module": name,
        "imports_verl_v1": True,
        "resolved": resolved,
        "errors": errors,
        "ours_loaded_before_lookup": ours_loaded,
    }


def probe_every_module() -> None:
    """Run in a subprocess: the setup hook, then in a child each, verl's v1 trainer and each module of
    the package imported first."""
    import async_reward
    from async_reward.wiring.integration import setup_worker

    setup_worker()
    assert VERL_V1 not in sys.modules  # the hook itself does not pay for verl's v1 trainer
    preload_third_party()  # once here, not in every child (none of it imports verl's trainer)
    assert VERL_V1 not in sys.modules
    names = [info.name for info in pkgutil.walk_packages(async_reward.__path__, "async_reward.")]
    report_each_in_a_fork([VERL_V1, *(n for n in names if n not in sys.modules)], _first_import_through)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_the_modes_resolve_whichever_module_imports_verls_v1_trainer_first() -> None:
    reports = run_probe(
        "from tests.wiring.test_trainer_modes import probe_every_module; probe_every_module()"
    )
    first_importers = {r["module"]: r for r in reports if r["imports_verl_v1"]}
    # Not vacuous: verl itself (the task runner) and the modules verl's workers load first are there.
    assert {VERL_V1, "async_reward.v1.agent_loop", "async_reward.v1.replay_buffer"} <= set(first_importers)
    for name, report in first_importers.items():
        assert report["errors"] == [], (name, report["errors"])
        assert report["resolved"] == {"sync": "verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync", **OURS}, name
    # Where verl imports its v1 trainer first and runs its own mode, ours cost nothing: not imported.
    assert first_importers[VERL_V1]["ours_loaded_before_lookup"] == []


def test_a_mode_whose_module_fails_to_import_fails_its_lookup_with_that_error(monkeypatch) -> None:
    """Not a bare "Unknown trainer": the lookup raises what broke the import."""
    from async_reward.wiring import trainer_modes as registration

    registration.register_trainer_modes_on_lookup()
    from verl.trainer.ppo.v1 import get_trainer_cls

    monkeypatch.setitem(registration.OUR_TRAINER_MODULES, "pipelined", "async_reward.v1.no_such_trainer")
    with pytest.raises(ModuleNotFoundError, match=r"async_reward\.v1\.no_such_trainer"):
        get_trainer_cls("pipelined")
    monkeypatch.undo()
    assert get_trainer_cls("pipelined").__name__ == "PPOTrainerPipelined"


def test_an_unknown_mode_is_refused_by_verl_with_our_modes_listed() -> None:
    """A typo of ``pipelined`` gets verl's own error, which names every mode a user can pick, ours too
    (they are registered only when looked up)."""
    from async_reward.wiring import trainer_modes as registration

    registration.register_trainer_modes_on_lookup()
    from verl.trainer.ppo.v1 import get_trainer_cls

    with pytest.raises(ValueError, match=r"Unknown trainer 'pipelnied'") as error:
        get_trainer_cls("pipelnied")
    assert {"decoupled", "pipelined", "sync"} <= set(
        str(error.value).split(": ", 1)[1].rstrip(".").split(", ")
    )
