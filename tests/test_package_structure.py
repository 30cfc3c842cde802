"""The package's structure: no import circle between its files, and the library apart from its tools.

The import graph is read from the source with ``ast``, so an import inside a function counts as much as
one at the top of a file (a lazy import hides a circle from Python's import system, not from the
design). An import under ``if TYPE_CHECKING:`` never runs and is left out. Importing ``a.b.c`` runs the
``__init__`` of every package on the way (``a.b``) that the importer is not itself inside, so those
count too: a package ``__init__`` that imports its heavy modules closes circles through it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
#: Circles kept on purpose, each with its reason. Keep this empty unless a circle is the design.
KEPT_CIRCLES: dict[frozenset[str], str] = {
    frozenset({"async_reward_cli", "async_reward.cli"}): (
        "the console script's front door answers --help and --version with the standard library only, "
        "then hands the command to async_reward.cli, which builds its full parser from the front "
        "door's command names and texts so both print the same help"
    ),
}
#: The tools that ship beside the library: the library never imports them.
TOOL_PACKAGES = ("async_reward_bench",)


def _modules(src: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``src`` (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` that can run: at any depth (functions, ``try``, ...),
    except under ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    children = node.orelse if _is_type_checking_block(node) else ast.iter_child_nodes(node)  # type: ignore[attr-defined]
    for child in children:
        yield from _runtime_imports(child)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of ``src`` that importing it (or calling its functions) imports."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_package)}
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                parts = target.split(".")
                for depth in range(1, len(parts) + 1):
                    imported = ".".join(parts[:depth])
                    if imported in modules and imported != name and imported not in own_packages:
                        graph[name].add(imported)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import circles of ``graph``: each strongly connected group of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph has ~100 nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_files() -> None:
    graph = import_graph()
    assert len(graph) > 80  # the whole package was read
    assert "async_reward.http" in graph["async_reward.offline_score"]  # imports inside functions count
    found = set(circles(graph))
    unexplained = sorted(sorted(circle) for circle in found - set(KEPT_CIRCLES))
    assert found == set(KEPT_CIRCLES), f"import circles: {unexplained}"
    # Without the kept ones the graph orders: a module can always be imported after what it imports.
    for circle in KEPT_CIRCLES:
        for module in circle:
            graph[module] -= circle
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the assertion above names the circle first
        raise AssertionError(f"import circle: {exc.args[1]}") from None


def test_the_graph_sees_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    """The reader itself: a circle closed by an import inside a function, and one through a package's
    ``__init__``, are found; an import under ``TYPE_CHECKING`` is not a circle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import heavy\n")
    (pkg / "sub" / "heavy.py").write_text("import pkg.c\n")
    (pkg / "sub" / "light.py").write_text("")
    (pkg / "c.py").write_text("from pkg.sub.light import x\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.e\n")
    (pkg / "e.py").write_text("import pkg.d\n")
    found = set(circles(import_graph(tmp_path)))
    assert found == {frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.sub", "pkg.sub.heavy", "pkg.c"})}


def test_the_library_never_imports_its_tools() -> None:
    """No module of ``async_reward`` imports the benchmark simulator or the toy task, at any depth,
    except the command line's ``bench`` command, which runs the benchmark (when it is run)."""
    graph = import_graph()
    # The tools are top-level packages of their own, beside the library, the console script and verl's
    # plugin entry point (outside the package, so `import verl` does not run the package's __init__).
    assert {name.split(".")[0] for name in graph} == {
        "async_reward",
        "async_reward_cli",
        "async_reward_verl_plugin",
        *TOOL_PACKAGES,
    }
    library = [name for name in graph if name.split(".")[0] == "async_reward" and name != "async_reward.cli"]
    offending = {
        name: sorted(t for t in graph[name] if t.split(".")[0] in TOOL_PACKAGES)
        for name in library
        if any(t.split(".")[0] in TOOL_PACKAGES for t in graph[name])
    }
    assert offending == {}
    assert "async_reward_bench.speedup" in graph["async_reward.cli"]  # the reader sees tool imports


@pytest.mark.subprocess
def test_importing_the_library_loads_no_tool_code() -> None:
    """``import async_reward`` (and the modules a training job loads) in a fresh interpreter: no module
    of the benchmark simulator or the toy task is loaded, and our managers are registered with verl."""
    code = (
        "import json, sys\n"
        "import async_reward, async_reward.integration, async_reward.pipeline.main_ppo\n"
        "from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER\n"
        f"tools = sorted(m for m in sys.modules if m.split('.')[0] in {TOOL_PACKAGES!r})\n"
        "ours = sorted(n for n in async_reward.MANAGER_NAMES if n in REWARD_MANAGER)\n"
        "print(json.dumps({'tools': tools, 'registered': ours}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True
    )
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert loaded["tools"] == []
    import async_reward

    assert loaded["registered"] == sorted(async_reward.MANAGER_NAMES)
