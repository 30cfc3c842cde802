"""Import each module first, in a fresh process: the harness of the tests that check what happens
whichever module a Ray worker loads first (tests/wiring/test_trainer_modes.py,
tests/wiring/test_worker_imports.py).

The probe runs in a subprocess that has set itself up as a worker would; :func:`report_each_in_a_fork`
forks one child per module, whose ``probe(name)`` imports it first and reports one JSON line;
:func:`run_probe` starts that subprocess and reads the reports back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

#: Third-party packages a child would import whichever module it imports first: a probe's parent
#: loads them once before it forks, so a child costs a fraction of a CPU-second instead of the one to
#: five it takes to import torch, transformers, pandas, datasets, peft, hydra and the web stack again.
#: None of them imports verl or this package, so what each child varies (which module of ours or of
#: verl loads verl's reward managers or v1 trainer first) is untouched: each probe asserts that after
#: loading them.
THIRD_PARTY_PRELOADED = (
    "torch",
    "tensordict",
    "transformers",
    "pandas",
    "pyarrow",
    "datasets",
    "peft",
    "hydra",
    "omegaconf",
    "fastapi",
    "starlette",
    "uvicorn",
    "aiohttp",
    "fsspec",
    "tenacity",
    "multiprocess",
    "torchdata",
)


def preload_third_party() -> None:
    """Import :data:`THIRD_PARTY_PRELOADED` in this (the probe's parent) process; checks that they
    loaded no module of verl or of this package (the modules whose import order the children vary)."""
    import importlib

    before = set(sys.modules)
    for name in THIRD_PARTY_PRELOADED:
        importlib.import_module(name)
    added = [name for name in set(sys.modules) - before if name.split(".")[0] in ("verl", "async_reward")]
    assert not added, added


def report_each_in_a_fork(names: Iterable[str], probe: Callable[[str], dict[str, Any]]) -> None:
    """In a forked child per name: ``probe(name)``, printed as one ``REPORT`` line (a failure too)."""
    for name in names:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report one JSON line, whatever happens
            os.close(read)
            try:
                report = probe(name)
            except BaseException as error:  # reported, the parent fails the test with it
                report = {"module": name, "failed": f"{type(error).__name__}: {error}"}
            os.write(write, json.dumps(report).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        print("REPORT", data.decode() or json.dumps({"module": name, "failed": "no report"}), flush=True)


def run_probe(code: str) -> list[dict[str, Any]]:
    """Run ``code`` in a fresh interpreter; its reports, after checking that none failed."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=280, cwd=os.getcwd()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    reports = [json.loads(line.removeprefix("REPORT ")) for line in lines if line.startswith("REPORT ")]
    assert not [r for r in reports if "failed" in r], [r for r in reports if "failed" in r]
    return reports
