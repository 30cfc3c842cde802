"""The legacy trainer in the package's structure: the layer check fails on an import of it, its entry
point loads no tool code, and its 0.1 module path (``async_reward.pipeline.main_ppo``, in users' launch
scripts) works for one release with a warning (the rest: tests/project/test_package_structure.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.project.test_package_structure import assert_the_layer_check_finds, loaded_on_import


def test_the_layer_check_fails_on_an_import_of_the_legacy_trainer(tmp_path: Path) -> None:
    """Nothing else imports ``async_reward.legacy`` (so it can be deleted as a unit): broken on purpose
    in a copy of the package, the check sees it."""
    assert_the_layer_check_finds(tmp_path, "v1/groups.py", "import async_reward.legacy.trainer\n")


@pytest.mark.subprocess
def test_the_legacy_entry_point_loads_no_tool_code() -> None:
    """``import async_reward.legacy.main_ppo`` in a fresh interpreter (what ``python -m`` runs): no module
    of the benchmark simulator or the toy task is loaded, and our managers are registered with verl."""
    loaded = loaded_on_import("async_reward.wiring.integration, async_reward.legacy.main_ppo")
    assert loaded["tools"] == []
    import async_reward

    assert loaded["registered"] == sorted(async_reward.MANAGER_NAMES)


@pytest.mark.subprocess
def test_the_old_entry_point_path_works_for_one_release_with_a_warning() -> None:
    """``async_reward.pipeline.main_ppo`` (0.1's path): the module at its new path, the same object, and
    a ``DeprecationWarning`` naming the new path; ``python -m`` with the old path runs the new module."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import async_reward.pipeline.main_ppo as old\n"
        "import async_reward.legacy.main_ppo as new\n"
        "assert old is new\n"
        "said = [str(w.message) for w in seen if w.category is DeprecationWarning]\n"
        "assert any('async_reward.legacy.main_ppo' in s for s in said), said\n"
        "assert new.__spec__.name == 'async_reward.legacy.main_ppo'\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]
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
