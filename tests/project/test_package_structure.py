"""The package's structure: no import circle between its files, and the library apart from its tools.

The import graph is read from the source with ``ast``, so an import inside a function counts as much as
one at the top of a file (a lazy import hides a circle from Python's import system, not from the
design). An import under ``if TYPE_CHECKING:`` never runs and is left out. Importing ``a.b.c`` runs the
``__init__`` of every package on the way (``a.b``) that the importer is not itself inside, so those
count too: a package ``__init__`` that imports its heavy modules closes circles through it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
#: Circles kept on purpose, each with its reason. Keep this empty unless a circle is the design.
KEPT_CIRCLES: dict[frozenset[str], str] = {
    frozenset({"async_reward_cli", "async_reward.tools.cli"}): (
        "the console script's front door answers --help and --version with the standard library only, "
        "then hands the command to async_reward.tools.cli, which builds its full parser from the front "
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
    assert (
        "async_reward._core.http" in graph["async_reward.tools.offline_score"]
    )  # imports inside functions count
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
    library = [
        name for name in graph if name.split(".")[0] == "async_reward" and name != "async_reward.tools.cli"
    ]
    offending = {
        name: sorted(t for t in graph[name] if t.split(".")[0] in TOOL_PACKAGES)
        for name in library
        if any(t.split(".")[0] in TOOL_PACKAGES for t in graph[name])
    }
    assert offending == {}
    assert "async_reward_bench.speedup" in graph["async_reward.tools.cli"]  # the reader sees tool imports


# ------------------------------------------------------------------------------- fresh interpreters

#: The import checks that need a process in which nothing of ours (nor verl) was imported yet: each
#: runs in a forked child of one probe interpreter (:func:`probe_fresh_imports`), its code first.
FRESH_CASES = ("managers", "old paths", "library")
#: What :func:`_fresh_import_case` imports in each case, first in its process.
_LIBRARY_IMPORTS = ("async_reward", "async_reward.wiring.integration", "async_reward.v1.pipelined.trainer")


def _fresh_import_case(case: str) -> dict[str, object]:
    """In a forked child of :func:`probe_fresh_imports` (nothing of ours or verl's loaded): one case's
    imports, first, and what they loaded."""
    import importlib
    import warnings

    if case == "managers":  # what a reward worker does
        import async_reward.managers

        return {"case": case, "loaded": sorted(sys.modules)}
    if case == "old paths":
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from async_reward.limits import Admission
        from async_reward._core.limits import Admission as admission

        return {
            "case": case,
            "same_objects": Admission is admission,
            "said": [str(w.message) for w in seen if w.category is DeprecationWarning],
        }
    for name in _LIBRARY_IMPORTS:  # "library": the package and the modules a training job loads
        importlib.import_module(name)
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    import async_reward

    return {
        "case": case,
        "tools": sorted(m for m in sys.modules if m.split(".")[0] in TOOL_PACKAGES),
        "registered": sorted(n for n in async_reward.MANAGER_NAMES if n in REWARD_MANAGER),
    }


def probe_fresh_imports() -> None:
    """Run in a subprocess: the third-party packages once (torch, transformers, hydra, ...: most of the
    CPU-seconds of importing verl, ``tests/support/first_import_probe.py``), then a forked child per
    case of :data:`FRESH_CASES`. Each child is a fresh interpreter as far as the checks can tell: none
    of our modules, verl or the tools is loaded before its own imports (asserted here), and what the
    checks read (which of our modules got loaded, the warnings our old paths give, verl's registry)
    depends only on those. One interpreter instead of one per check: each start costs a verl import."""
    from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork

    preload_third_party()
    ours = ("verl", "async_reward", "async_reward_cli", "async_reward_verl_plugin", *TOOL_PACKAGES)
    assert not [m for m in sys.modules if m.split(".")[0] in ours]
    report_each_in_a_fork(FRESH_CASES, _fresh_import_case)


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, dict[str, object]]:
    """:func:`probe_fresh_imports` in one fresh interpreter: each case's report, by case."""
    from tests.support.first_import_probe import run_probe

    reports = run_probe("from tests.project.test_package_structure import probe_fresh_imports as p; p()")
    return {str(report["case"]): report for report in reports}


@pytest.mark.subprocess
def test_importing_the_library_loads_no_tool_code(fresh_imports) -> None:
    """``import async_reward`` (and the modules a training job loads) in a fresh interpreter: no module
    of the benchmark simulator or the toy task is loaded, and our managers are registered with verl
    (the legacy trainer's entry point: tests/legacy/test_package_structure.py)."""
    loaded = fresh_imports["library"]
    assert loaded["tools"] == []
    import async_reward

    assert loaded["registered"] == sorted(async_reward.MANAGER_NAMES)


# ------------------------------------------------------------------------------- the layers (issue 44)

#: The library's layers, lowest first. A module may import modules of its own layer and of layers
#: below it, never above; a module belongs to the layer of the longest prefix that names it (``=name``:
#: that module only, not its children).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # _moved: the table of 0.1's module paths and the import hook that answers them; imports nothing.
    ("core", ("async_reward._core", "async_reward._moved")),
    # The judge's language: what a verdict, a template, a criterion and a usage count look like. Pure
    # (they import only _core), so the config can check a judge section against them.
    (
        "judge language",
        (
            "=async_reward.judge",
            "=async_reward.judge.rubric",
            "async_reward.judge.verdict",
            "async_reward.judge.prompts",
            "async_reward.judge.cost",
            "async_reward.judge.rubric.criteria",
        ),
    ),
    ("config", ("async_reward.config",)),
    ("scoring", ("async_reward.judge", "async_reward.managers")),
    ("training", ("async_reward.training",)),
    ("v1", ("async_reward.v1",)),
    (
        "wiring and tools",
        ("async_reward", "async_reward.wiring", "async_reward.tools", "async_reward.testing"),
    ),
    # The deprecated trainer: on top, and imported by nothing else, so it can be deleted as a unit.
    ("legacy", ("async_reward.legacy",)),
)
#: Packages of one layer that never import each other: the two v1 trainer modes share what they
#: share through ``async_reward.v1`` below them, so either can change (or go) without the other.
SIBLINGS: tuple[tuple[str, str], ...] = (("async_reward.v1.pipelined", "async_reward.v1.decoupled"),)
#: Modules outside the library's layers (the console script's front door, verl's plugin entry).
OUTSIDE_LAYERS = ("async_reward_cli", "async_reward_verl_plugin", *TOOL_PACKAGES)


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of ``module``'s layer (None: outside the library)."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix.startswith("=")
            name = prefix.lstrip("=")
            named = module == name or (not exact and module.startswith(name + "."))
            if named and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs upwards, every import of ``legacy`` from outside it, and every import
    between two :data:`SIBLINGS`."""
    legacy = layer_of("async_reward.legacy")
    found = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is None:
                continue
            if there > here or (there == legacy and here != legacy):
                found.append(f"{module} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
            for first, second in SIBLINGS:
                crossing = {_in(module, first), _in(target, second)} == {True} or {
                    _in(module, second),
                    _in(target, first),
                } == {True}
                if crossing:
                    found.append(f"{module} imports {target}: sibling packages {first} and {second}")
    return found


def test_every_module_of_the_library_has_a_layer() -> None:
    graph = import_graph()
    unplaced = [m for m in graph if layer_of(m) is None and m.split(".")[0] not in OUTSIDE_LAYERS]
    assert unplaced == []
    assert layer_of("async_reward.judge.verdict") < layer_of("async_reward.config")  # type: ignore[operator]
    assert layer_of("async_reward.judge.group.judging") == layer_of("async_reward.managers.base")


def test_imports_only_run_downwards() -> None:
    """``_core`` imports nothing of ours, ``config`` only ``_core`` and the judge's language, managers
    and the judge never import trainer code, nothing imports ``legacy``, and the two v1 modes do not
    import each other."""
    assert layer_violations(import_graph()) == []


def assert_the_layer_check_finds(tmp_path: Path, module: str, line: str) -> None:
    """The layer check on a copy of the package with ``line`` added to ``module``: it finds the broken
    rule, in that module and nowhere else."""
    import shutil

    copy = tmp_path / module.replace("/", "_")
    shutil.copytree(SRC / "async_reward", copy / "async_reward")
    target = copy / "async_reward" / module
    target.write_text(target.read_text() + "\n" + line)
    found = layer_violations(import_graph(copy))
    broken = "async_reward." + module.removesuffix(".py").replace("/", ".")
    assert found and all(line.startswith(broken + " ") for line in found), found


def test_the_layer_check_fails_on_an_upward_import(tmp_path: Path) -> None:
    """The check itself, on a copy of the package with one rule broken on purpose each time (an import
    of the legacy trainer: tests/legacy/test_package_structure.py)."""
    for module, line in (
        ("_core/deadline.py", "from async_reward.config import AsyncRewardConfig\n"),
        ("managers/naive.py", "def _later():\n    from async_reward.v1 import agent_loop\n"),
        ("v1/decoupled/window.py", "from async_reward.v1.pipelined import choice\n"),
        ("v1/pipelined/pool.py", "def _later():\n    from async_reward.v1.decoupled import window\n"),
    ):
        assert_the_layer_check_finds(tmp_path, module, line)


@pytest.mark.subprocess
def test_the_managers_load_no_trainer_code(fresh_imports) -> None:
    """``import async_reward.managers`` in a fresh interpreter (what a reward worker does): verl loads,
    our managers register, and no module of the trainers (``training``, ``v1``, ``legacy``) or of the
    tools is loaded."""
    loaded = fresh_imports["managers"]["loaded"]
    assert "verl" in loaded and "async_reward.managers.llm_judge" in loaded
    trainer = [
        m
        for m in loaded
        if m.split(".")[:2] in (["async_reward", p] for p in ("training", "v1", "legacy", "tools"))
    ]
    assert trainer == []


@pytest.mark.subprocess
def test_an_old_module_path_works_for_one_release_with_a_warning(fresh_imports) -> None:
    """``async_reward.limits`` (0.1's path), imported first in a fresh interpreter: the module at its new
    path, the same object, and a ``DeprecationWarning`` naming the new path (the legacy trainer's
    ``async_reward.pipeline.main_ppo``, in users' launch scripts: tests/legacy/test_package_structure.py)."""
    old_paths = fresh_imports["old paths"]
    assert old_paths["same_objects"] is True
    said = old_paths["said"]
    assert any("async_reward._core.limits" in s for s in said), said


def test_the_package_structure_page_names_every_module() -> None:
    """docs/package_structure.md's tree stays true: every package and module file of the library is on
    it (a new module is placed, and said, the day it lands); nothing named there is gone."""
    page = (SRC.parent / "docs" / "package_structure.md").read_text()
    tree = page.split("## The tree", 1)[1].split("```")[1]
    library = SRC / "async_reward"
    if not (library / "legacy").is_dir():  # deleted as a unit: its entry, the tree's last, names nothing
        tree = tree.split("\n  legacy/", 1)[0]
    missing = [
        str(path.relative_to(library))
        for path in sorted(library.rglob("*.py"))
        if path.name != "__init__.py" and path.name not in tree
    ]
    missing += [
        str(path.relative_to(library)) + "/"
        for path in sorted(library.rglob("*"))
        if path.is_dir() and path.name != "__pycache__" and f"{path.name}/" not in tree
    ]
    assert missing == []
    named = set(re.findall(r"\b([a-z_]+\.py)\b", tree))
    existing = {path.name for path in library.rglob("*.py")}
    assert named - existing == set()


def test_a_module_over_400_lines_says_why_in_its_docstring() -> None:
    """Small single-purpose modules: one past 400 lines is either split or says, in its docstring,
    why its length is the design ("Longer than 400 lines ...")."""
    import ast

    long_unexplained = []
    for path in sorted((SRC / "async_reward").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if "Longer than 400 lines" not in docstring:
                long_unexplained.append(str(path.relative_to(SRC)))
    assert long_unexplained == []


#: The packages of the public API ("What is public" in docs/package_structure.md), beside
#: ``async_reward`` itself; every other package directly under it says ``Internal`` in its docstring.
PUBLIC_PACKAGES = frozenset({"config", "v1", "testing"})


def test_every_package_outside_the_public_api_says_it_is_internal() -> None:
    root = SRC / "async_reward"
    docstrings = {
        init.parent.name: ast.get_docstring(ast.parse(init.read_text())) or ""
        for init in root.glob("*/__init__.py")
    }
    internal = sorted(set(docstrings) - PUBLIC_PACKAGES)
    assert internal and set(docstrings) >= PUBLIC_PACKAGES
    assert [name for name in internal if "Internal" not in docstrings[name]] == []
    assert [name for name in PUBLIC_PACKAGES if "Internal" in docstrings[name]] == []
    page = (SRC.parent / "docs" / "package_structure.md").read_text()
    public_section = page.split("## What is public", 1)[1].split("\n## ", 1)[0]
    assert [name for name in internal if f"`{name}`" not in public_section] == []
