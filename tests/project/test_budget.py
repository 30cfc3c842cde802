"""The suite's wall-time budget (tests/support/budget.py): a run over it ends with a banner naming the budget
and the machine's load, and its exit status is still the tests' own (a loaded machine must not turn CI
red). Run as a user runs the suite: pytest in a subprocess with the budget plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_suite(tmp_path: Path, budget_s: str, body: str = "assert True") -> subprocess.CompletedProcess[str]:
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(f"def test_it():\n    {body}\n")
    env = {**os.environ, "ASYNC_REWARD_TEST_BUDGET_S": budget_s, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.budget", "-p", "no:cacheprovider", "-q",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.subprocess
def test_a_run_over_its_budget_says_so_loudly_and_keeps_its_exit_status(tmp_path: Path) -> None:
    over = _run_suite(tmp_path, budget_s="0")
    assert over.returncode == 0, over.stdout + over.stderr
    assert "OVER BUDGET: this run took" in over.stdout
    assert "ASYNC_REWARD_TEST_BUDGET_S" in over.stdout
    assert "machine load over the run:" in over.stdout and "% busy" in over.stdout

    within = _run_suite(tmp_path, budget_s="100000", body="assert False")
    assert within.returncode == 1  # the tests decide the exit status, never the clock
    assert "OVER BUDGET" not in within.stdout
    assert "of a budget of 100000 s" in within.stdout


def test_every_long_file_named_for_the_hand_out_order_exists() -> None:
    """``tests/conftest.py`` hands the longest files out first by their path: a file moved or renamed
    and not renamed there would silently lose its place (and run last, alone). Those of ``tests/legacy/``
    go with that folder when the legacy trainer is deleted as a unit (docs/package_structure.md)."""
    from tests.conftest import LONGEST_FILES, TESTS

    deleted = () if (TESTS / "legacy").is_dir() else ("legacy/",)
    missing = [name for name in LONGEST_FILES if not (TESTS / name).is_file()]
    assert [name for name in missing if not name.startswith(deleted)] == []


def test_every_v1_file_kept_in_one_process_exists() -> None:
    """The files ``make test`` hands to one process together (their warm verl actors start once)."""
    from tests.conftest import TESTS, V1_WARM_FILES

    assert [name for name in V1_WARM_FILES if not (TESTS / name).is_file()] == []
