"""The ``async-reward`` front door: ``--help`` and ``--version`` never import verl, torch or Ray, while
importing the package still registers every manager with verl.

The console script is run as pip's generated script runs it (``from <module> import main``, with the
entry point read from ``pyproject.toml``) in a fresh interpreter, and what it imported is read from
``sys.modules`` at exit. (Registration in Ray workers through the setup hook:
``test_verl_integration.py::test_all_five_managers_are_registered_in_ray_workers``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import async_reward
import async_reward_cli
from async_reward.tools.cli import main as full_main

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["async-reward"]
#: Top-level packages the front door must not import (``async_reward``'s import pulls the other three).
HEAVY = {"verl", "torch", "ray", "async_reward"}
#: What ``serve`` and a command's ``--help`` must not import: they load ``async_reward.tools.cli`` (so some of
#: the package's modules) but never run the package's ``__init__``, which imports the managers.
HEAVY_FOR_A_COMMAND = {"verl", "torch", "ray", "transformers", "tensordict", "async_reward.managers"}

# pip's console script, plus an exit hook that records every module the run imported.
_SCRIPT = """
import atexit, json, sys
record = sys.argv.pop(1)
atexit.register(lambda: open(record, "w").write(json.dumps(sorted(sys.modules))))
from {module} import {function}
sys.argv[0] = "async-reward"
sys.exit({function}())
"""


def console_script(tmp_path: Path, *args: str) -> tuple[list[str], Path]:
    """The command line of the console script with ``args``, and the file its imports go to."""
    module, function = ENTRY_POINT.split(":")
    record = tmp_path / "modules.json"
    return [
        sys.executable,
        "-c",
        _SCRIPT.format(module=module, function=function),
        str(record),
        *args,
    ], record


def heavy_imports(imported: set[str]) -> set[str]:
    return {
        name
        for name in imported
        if name in HEAVY_FOR_A_COMMAND or name.partition(".")[0] in HEAVY_FOR_A_COMMAND
    }


def run_console_script(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    command, record = console_script(tmp_path, *args)
    env = {**os.environ, "COLUMNS": "200"}
    # The bound is generous (a busy 2-core machine); the assertion that matters is on the imports.
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    return proc, set(json.loads(record.read_text()))


def test_the_console_script_enters_at_the_front_door() -> None:
    assert ENTRY_POINT == "async_reward_cli:main"


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["--help"], 0, "usage: async-reward [-h] [--version] COMMAND"),
        (["--version"], 0, f"async-reward {async_reward.__version__}"),
        ([], 2, "the following arguments are required: COMMAND"),
        (["teleport"], 2, "invalid choice: 'teleport'"),
    ],
)
@pytest.mark.subprocess
def test_help_version_and_usage_errors_import_no_heavy_package(
    tmp_path: Path, args: list[str], code: int, expected: str
) -> None:
    proc, imported = run_console_script(tmp_path, *args)
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stdout + proc.stderr
    assert "async_reward_cli" in imported  # the record is real: it saw the front door itself
    assert not {name for name in imported if name.partition(".")[0] in HEAVY}


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["serve", "--help"], 0, "usage: async-reward serve"),
        (["score", "--help"], 0, "usage: async-reward score"),
        (["bench", "--help"], 0, "usage: async-reward bench"),
        (["score", "--input", "in.jsonl"], 2, "the following arguments are required: --output, --manager"),
    ],
    ids=["serve_help", "score_help", "bench_help", "score_usage_error"],
)
@pytest.mark.subprocess
def test_a_command_s_help_and_usage_errors_import_neither_verl_nor_torch(
    tmp_path: Path, args: list[str], code: int, expected: str
) -> None:
    proc, imported = run_console_script(tmp_path, *args)
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stdout + proc.stderr
    assert "async_reward.tools.cli" in imported  # the record is real: the full parser answered
    assert not heavy_imports(imported)


@pytest.mark.subprocess
def test_serve_answers_and_stops_without_verl_or_torch(tmp_path: Path) -> None:
    command, record = console_script(tmp_path, "serve", "--port", "0", "--seed", "0")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the listening line, or "" if the server died
        assert first.startswith("async-reward devserver listening on http://"), proc.communicate(timeout=30)
        url = first.split()[-1]
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "Answer: 4\nReference: 4"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # a real judge answer
            assert json.load(response)["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    imported = set(json.loads(record.read_text()))
    assert "async_reward.tools.devserver.server" in imported
    assert not heavy_imports(imported)


def test_score_lists_every_registered_manager() -> None:
    from async_reward.tools.offline_score import MANAGERS

    assert MANAGERS == async_reward.MANAGER_NAMES  # written out in offline_score to keep verl out of --help


def test_help_lists_every_command_exactly_as_the_full_parser(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    shown = []
    for entry in (async_reward_cli.main, full_main):
        with pytest.raises(SystemExit) as exc:
            entry(["--help"])
        assert exc.value.code == 0
        shown.append(capsys.readouterr().out)
    assert shown[0] == shown[1]
    for command, help_text in async_reward_cli.COMMANDS.items():
        assert f"{command}  " in shown[0] and help_text in shown[0]


def test_a_command_goes_through_to_the_full_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        async_reward_cli.main(["serve", "--fault", "teapot=0.1"])  # checked by the serve parser
    assert exc.value.code == 2 and "expected KIND=RATE" in capsys.readouterr().err
    assert async_reward_cli.main(["bench", "--bench-help"]) == 0
    assert "--time-scale" in capsys.readouterr().out


@pytest.fixture(scope="module")
def first_imports() -> dict[str, dict[str, Any]]:
    """:func:`tests.support.cli_probe.probe_first_imports` in one fresh interpreter: each case's
    report, by case."""
    from tests.support.first_import_probe import run_probe

    reports = run_probe("from tests.support.cli_probe import probe_first_imports as p; p()")
    return {report["case"]: report for report in reports}


@pytest.mark.subprocess
def test_importing_the_package_registers_all_five_managers(first_imports) -> None:
    """In a fresh interpreter: nothing but ``import async_reward`` fills verl's registry."""
    registered = first_imports["import async_reward"]["registered"]
    for name in async_reward.MANAGER_NAMES:
        assert registered[name].startswith("async_reward.managers."), (name, registered.get(name))


@pytest.mark.subprocess
def test_after_the_front_door_the_package_has_every_submodule_it_loaded(first_imports) -> None:
    """``async-reward score`` imports the command line before the package's ``__init__`` (which it runs
    later, building the manager): every ``async_reward.<name>`` module loaded then is an attribute of
    the package, as a user's scorer reading ``async_reward.config.X`` expects."""
    result = first_imports["front door first"]
    assert "async_reward.tools" in result["early"] and "async_reward.config" in result["early"]
    assert result["missing"] == []
