"""The legacy trainer in the package's structure: the layer check fails on an import of it, its entry
point loads no tool code, and its 0.1 module path (``async_reward.pipeline.main_ppo``, in users' launch
scripts) works for one release with a warning (the rest: tests/project/test_package_structure.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.project.test_package_structure import TOOL_PACKAGES, assert_the_layer_check_finds


def test_the_layer_check_fails_on_an_import_of_the_legacy_trainer(tmp_path: Path) -> None:
    """Nothing else imports ``async_reward.legacy`` (so it can be deleted as a unit): broken on purpose
    in a copy of the package, the check sees it."""
    assert_the_layer_check_finds(tmp_path, "v1/groups.py", "import async_reward.legacy.trainer\n")


#: The checks that need a process in which nothing of ours (nor verl) was imported yet, each run in a
#: forked child of one probe interpreter (:func:`probe_legacy_imports`), its imports first.
LEGACY_CASES = ("entry point", "old entry point path")


def _legacy_import_case(case: str) -> dict[str, object]:
    """In a forked child of :func:`probe_legacy_imports` (nothing of ours or verl's loaded yet)."""
    import importlib
    import warnings

    if case == "entry point":  # what ``python -m async_reward.legacy.main_ppo`` imports, in this order
        for name in ("async_reward", "async_reward.wiring.integration", "async_reward.legacy.main_ppo"):
            importlib.import_module(name)
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

        import async_reward

        return {
            "case": case,
            "tools": sorted(m for m in sys.modules if m.split(".")[0] in TOOL_PACKAGES),
            "registered": sorted(n for n in async_reward.MANAGER_NAMES if n in REWARD_MANAGER),
        }
    # "old entry point path": 0.1's path imported first, as an old launch script does
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import async_reward.pipeline.main_ppo as old
    import async_reward.legacy.main_ppo as new

    return {
        "case": case,
        "same_object": old is new,
        "spec_name": new.__spec__.name,
        "said": [str(w.message) for w in seen if w.category is DeprecationWarning],
    }


def probe_legacy_imports() -> None:
    """Run in a subprocess: the third-party packages once (most of the CPU-seconds of importing verl),
    then a forked child per case of :data:`LEGACY_CASES`, in which none of our modules nor verl is
    loaded before the case's own imports (asserted here); what each reads depends only on those."""
    from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork

    preload_third_party()
    ours = ("verl", "async_reward", "async_reward_cli", "async_reward_verl_plugin", *TOOL_PACKAGES)
    assert not [m for m in sys.modules if m.split(".")[0] in ours]
    report_each_in_a_fork(LEGACY_CASES, _legacy_import_case)


@pytest.fixture(scope="module")
def legacy_imports() -> dict[str, dict[str, object]]:
    """:func:`probe_legacy_imports` in one fresh interpreter: each case's report, by case."""
    from tests.support.first_import_probe import run_probe

    reports = run_probe("from tests.legacy.test_package_structure import probe_legacy_imports as p; p()")
    return {str(report["case"]): report for report in reports}


@pytest.mark.subprocess
def test_the_legacy_entry_point_loads_no_tool_code(legacy_imports) -> None:
    """``import async_reward.legacy.main_ppo`` first in a fresh interpreter (what ``python -m`` runs): no
    module of the benchmark simulator or the toy task is loaded, and our managers are registered with verl."""
    loaded = legacy_imports["entry point"]
    assert loaded["tools"] == []
    import async_reward

    assert loaded["registered"] == sorted(async_reward.MANAGER_NAMES)


@pytest.mark.subprocess
def test_the_old_entry_point_path_works_for_one_release_with_a_warning(legacy_imports) -> None:
    """``async_reward.pipeline.main_ppo`` (0.1's path), imported first in a fresh interpreter: the module
    at its new path, the same object, and a ``DeprecationWarning`` naming the new path; ``python -m``
    with the old path runs the new module."""
    old_path = legacy_imports["old entry point path"]
    assert old_path["same_object"] is True and old_path["spec_name"] == "async_reward.legacy.main_ppo"
    assert any("async_reward.legacy.main_ppo" in said for said in old_path["said"]), old_path
    module_run = subprocess.run(
        [
            sys.executable,
            "-W",
            "always::DeprecationWarning",
            "-m",
            "async_reward.pipeline.main_ppo",
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "moved to async_reward.legacy.main_ppo" in module_run.stderr
    assert module_run.returncode == 0, module_run.stderr[-2000:]
