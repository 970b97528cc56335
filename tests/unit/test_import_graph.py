"""No import circle inside `src/inferd`: each module's imports, read with `ast` (module-level,
function-level and `if TYPE_CHECKING:` ones alike, `from . import x` resolved to the submodule),
form a graph that must have no cycle. A circle is ownership gone wrong even where a lazy import
keeps it from failing at start-up, so the test names the modules going round it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import inferd

ROOT = Path(inferd.__file__).parent
PACKAGE = "inferd"


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module under the package by dotted name (a package by its `__init__.py`)."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that `module` imports anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known and name != module}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    names = module_names(root)
    known = set(names)
    return {name: imports_of(name, path, known) for name, path in names.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, set(component)) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first)."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # unreachable for a real component


def test_the_walk_sees_every_import_form(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import X\n"
    )
    (package / "c.py").write_text("import pkg.a\nfrom .sub.b import y\n")
    graph = import_graph(package)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.c": {"pkg.a", "pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.c"},
    }
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


def test_no_import_circle_in_the_package() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles in src/inferd:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_numpy_random_is_imported_before_any_model_loads() -> None:
    """Models load in threads, several at once; numpy 2's lazy first import of numpy.random
    raced there (KeyError: 'numpy.random.mtrand'): the server imports it up front."""
    code = "import sys, inferd.server.build; assert 'numpy.random' in sys.modules, 'lazy'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
