"""The deprecated legacy trainer can be deleted as a unit: ``src/async_reward/legacy/`` and
``tests/legacy/`` removed, everything else imports and its tests pass (docs/package_structure.md).

The library's side of it is the layer contract (tests/project/test_package_structure.py: nothing
imports ``async_reward.legacy``). The tools beside the library may use it, for the benchmark's legacy
strategies, but only where such a strategy runs: never when a module is imported. Checked twice, in
the source (no import of it outside a function) and in a fresh interpreter where it cannot be imported.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.project.test_package_structure import SRC, TOOL_PACKAGES, _is_type_checking_block, _modules

LEGACY = "async_reward.legacy"

#: Put first on ``sys.meta_path`` before anything is imported: ``async_reward.legacy`` and its modules
#: cannot be imported, as if the folder had been deleted (``find_spec`` asked for it raises too).
NO_LEGACY = f"""
import importlib.abc, sys

class NoLegacy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {LEGACY!r} or name.startswith({LEGACY + "."!r}):
            raise ImportError(f"{{name}} is deleted in this interpreter", name=name)
        return None

sys.meta_path.insert(0, NoLegacy())
"""


def _import_time_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every statement under ``node`` that runs when its module is imported: not inside a function, and
    not under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if _is_type_checking_block(child):
            for statement in child.orelse:  # type: ignore[attr-defined]
                yield statement
                yield from _import_time_nodes(statement)
            continue
        yield child
        yield from _import_time_nodes(child)


def legacy_imported_at_import_time(src: Path) -> dict[str, list[str]]:
    """Module of the tools -> the ``async_reward.legacy`` modules it imports when it is itself imported."""
    found: dict[str, list[str]] = {}
    for name, path in _modules(src).items():
        if name.split(".")[0] not in TOOL_PACKAGES:
            continue
        names = []
        for node in _import_time_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        legacy = sorted({n for n in names if n == LEGACY or n.startswith(LEGACY + ".")})
        if legacy:
            found[name] = legacy
    return found


def test_the_tools_import_the_legacy_trainer_only_where_a_legacy_strategy_runs(tmp_path: Path) -> None:
    assert legacy_imported_at_import_time(SRC) == {}
    # The check itself, on a copy with the import the benchmark once had at the top of a module.
    import shutil

    shutil.copytree(SRC / "async_reward_bench", tmp_path / "async_reward_bench")
    target = tmp_path / "async_reward_bench" / "recipe_style.py"
    target.write_text("from async_reward.legacy.chunks import RewardChunk\n" + target.read_text())
    assert legacy_imported_at_import_time(tmp_path) == {
        "async_reward_bench.recipe_style": [LEGACY + ".chunks", LEGACY + ".chunks.RewardChunk"]
    }


@pytest.mark.subprocess
def test_every_other_module_imports_where_the_legacy_trainer_cannot_be_imported() -> None:
    """A fresh interpreter in which ``async_reward.legacy`` cannot be imported: every other module of the
    library, of the benchmark and beside them imports; the benchmark offers its v1 strategies only, its
    ``--help`` says why ours are missing, and asking for one of ours exits 2 saying so."""
    modules = sorted(name for name in _modules(SRC) if name != LEGACY and not name.startswith(LEGACY + "."))
    code = NO_LEGACY + (
        "import importlib, json\n"
        "failed = {}\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed[name] = f'{type(exc).__name__}: {exc}'\n"
        "import argparse, contextlib, io, tempfile\n"
        "from async_reward_bench import settings, speedup\n"
        "help = speedup.configure_parser(argparse.ArgumentParser()).format_help()\n"
        "said = io.StringIO()\n"
        "with contextlib.redirect_stderr(said), tempfile.TemporaryDirectory() as out:\n"
        "    code = speedup.main(['--strategies', 'both', 'v1_sync', '--out', out])\n"
        "print(json.dumps({'failed': failed, 'default': list(settings.BenchConfig().strategies),\n"
        "    'quick': list(settings.QUICK['strategies']), 'help': ' '.join(help.split()),\n"
        "    'both': [code, said.getvalue()],\n"
        f"    'legacy_loaded': sorted(m for m in sys.modules if m.startswith({LEGACY!r}))}}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(modules) > 100 and "async_reward_bench.speedup" in modules  # the library and the tools
    assert seen["failed"] == {}
    assert seen["legacy_loaded"] == []
    from async_reward_bench.scenarios import DEFAULT_STRATEGIES, OUR_STRATEGIES

    assert seen["default"] == list(DEFAULT_STRATEGIES) and seen["quick"] == ["v1_pipelined_both"]
    assert f"{', '.join(OUR_STRATEGIES)} are not offered" in seen["help"]
    code, said = seen["both"]  # asked for one of ours: refused before anything starts, saying why
    assert code == 2 and "both run on the deprecated legacy trainer (async_reward.legacy)" in said


def test_only_the_legacy_api_page_renders_a_legacy_module() -> None:
    """``docs/api/legacy.md`` and its one line in ``mkdocs.yml`` go with the legacy trainer: no other page
    renders a legacy module's docstrings (``::: async_reward.legacy...``), which would break the docs
    build (``mkdocs build --strict``) once the package is gone; once it is, neither is left."""
    docs = SRC.parent / "docs"
    directive = re.compile(r"^:::\s*" + re.escape(LEGACY) + r"\b", re.MULTILINE)
    rendering = sorted(
        str(page.relative_to(docs)) for page in docs.rglob("*.md") if directive.search(page.read_text())
    )
    present = (SRC / "async_reward" / "legacy").is_dir()  # and once it is deleted, nothing renders it
    assert rendering == (["api/legacy.md"] if present else [])
    nav_lines = [
        line for line in (SRC.parent / "mkdocs.yml").read_text().splitlines() if "api/legacy.md" in line
    ]
    assert len(nav_lines) == (1 if present else 0)
