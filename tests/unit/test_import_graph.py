"""The package's layers, held: each module's imports, read with `ast` (module-level,
function-level and `if TYPE_CHECKING:` ones alike, `from . import x` resolved to the
submodule), form a graph in which

- no module imports a module of a higher layer (LAYERS, bottom-up, as docs/architecture.md
  draws them), and every module belongs to a layer;
- no two packages import each other, directly or round a longer circle;
- no module circle exists at all.

A circle is ownership gone wrong even where a lazy import keeps it from failing at start-up,
so each failure names the imports that make it."""

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


# Bottom-up. A unit is a top-level package (or module) of inferd; a module belongs to the
# unit its name starts with. Units of one layer may import each other one way only.
LAYERS: list[tuple[str, ...]] = [
    # the vocabulary every layer speaks
    (
        "inferd.errors",
        "inferd.types",
        "inferd.events",
        "inferd.limits",
        "inferd.log",
        "inferd.log_safety",
        "inferd.datatypes",
        "inferd.streams",
    ),
    ("inferd.config",),
    ("inferd.tensors",),
    (
        "inferd.scheduling",
        "inferd.backends",
        "inferd.cache",
        "inferd.reliability",
        "inferd.monitoring",
        "inferd.pipelines",
        "inferd.telemetry",
    ),
    ("inferd.repository",),
    # settings.py holds the cache's and the capture's settings: above them, below protocol;
    # metrics/ reads the registry, the schedulers, the capture and the cache at scrape time
    ("inferd.dataplane", "inferd.metrics", "inferd.settings"),
    ("inferd.protocol",),
    ("inferd.server",),
    ("inferd.workers",),
    ("inferd.engine",),
    ("inferd.cli",),
    # the surfaces users import
    ("inferd", "inferd.public", "inferd.__main__", "inferd.python_model"),
]


def unit_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> str | None:
    """The longest unit `module` belongs to, or None."""
    units = [u for layer in layers for u in layer if module == u or module.startswith(u + ".")]
    return max(units, key=len, default=None)


def layer_breaks(
    graph: dict[str, set[str]], layers: list[tuple[str, ...]] = LAYERS
) -> tuple[list[str], list[str], list[str]]:
    """(modules in no layer, imports going up, circles between units, each with the imports
    that close it). Importing the root package itself (`from inferd import __version__`) is
    no edge: every import runs it."""
    level = {u: i for i, layer in enumerate(layers) for u in layer}
    root = layers[-1][0]
    unplaced = sorted(m for m in graph if unit_of(m, layers) is None)
    upward: list[str] = []
    units: dict[str, set[str]] = {u: set() for u in level}
    imports: dict[tuple[str, str], list[str]] = {}  # (unit, unit) -> the module imports
    for module, targets in sorted(graph.items()):
        source = unit_of(module, layers)
        for target in sorted(targets):
            dest = unit_of(target, layers)
            if source is None or dest is None or dest == source or target == root:
                continue
            units[source].add(dest)
            imports.setdefault((source, dest), []).append(f"{module} -> {target}")
            if level[dest] > level[source]:
                upward.append(f"{module} -> {target} ({source} is below {dest})")
    circles = [
        " -> ".join(cycle)
        + "".join(f"; {imports[a, b][0]}" for a, b in zip(cycle, cycle[1:], strict=False))
        for cycle in find_cycles(units)
    ]
    return unplaced, upward, circles


def test_the_layer_check_finds_what_breaks_the_order() -> None:
    layers = [("pkg.low",), ("pkg.mid_a", "pkg.mid_b"), ("pkg.high",), ("pkg",)]
    graph = {
        "pkg": {"pkg.high"},
        "pkg.low.x": {"pkg.high.y"},  # up the order
        "pkg.mid_a.m": {"pkg.mid_b.n", "pkg.low.x", "pkg"},  # peers one way, down, the root
        "pkg.mid_b.n": {"pkg.mid_a.k"},  # ... and back: a circle of peers
        "pkg.mid_a.k": set(),
        "pkg.high.y": set(),
        "pkg.stray": set(),
    }
    unplaced, upward, circles = layer_breaks(graph, layers)
    assert unplaced == []  # "pkg.stray" is the root package's
    assert upward == ["pkg.low.x -> pkg.high.y (pkg.low is below pkg.high)"]
    assert circles == [
        "pkg.mid_a -> pkg.mid_b -> pkg.mid_a; "
        "pkg.mid_a.m -> pkg.mid_b.n; pkg.mid_b.n -> pkg.mid_a.k"
    ]
    assert unit_of("pkg.mid_ab", [("pkg.mid_a",)]) is None  # a prefix of a name is no unit


def test_the_layers_name_whole_packages() -> None:
    """A sub-package of its own in the order could sit above its parent, and the two
    packages would import each other unseen: units are inferd's top-level names only."""
    nested = [u for layer in LAYERS for u in layer if u.count(".") > 1]
    assert not nested, f"units below a package: {nested}"
    top = {name.split(".")[1] for name in module_names() if name.count(".") >= 1}
    listed = {u.split(".")[1] for layer in LAYERS for u in layer if "." in u}
    assert top <= listed, f"top-level names in no layer: {sorted(top - listed)}"


def test_no_import_goes_up_the_layers_and_no_packages_import_each_other() -> None:
    unplaced, upward, circles = layer_breaks(import_graph())
    assert not unplaced, "modules in no layer (add them to LAYERS and docs/architecture.md):\n" + (
        "\n".join(unplaced)
    )
    assert not upward, "imports going up the layers:\n" + "\n".join(upward)
    assert not circles, "packages importing each other:\n" + "\n".join(circles)


def test_the_scheduler_knows_backends_only_by_their_contract() -> None:
    """Scheduling hands batches to any backend's instances: it may read the contract
    (backends/base.py, backends/executing.py), never a backend of its own."""
    contract = {"inferd.backends.base", "inferd.backends.executing"}
    found = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.startswith("inferd.scheduling")
        for target in targets
        if target.startswith("inferd.backends") and target not in contract
    )
    assert not found, "the scheduler imports a backend:\n" + "\n".join(found)


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


def test_lazy_imports_are_made_before_any_model_loads() -> None:
    """Models load in threads, several at once; numpy 2's lazy first import of numpy.random
    raced there (KeyError: 'numpy.random.mtrand'), and so did zipfile's codec for the names
    in a drift reference's .npz (KeyError: 'encodings.cp437'): the server imports both up
    front."""
    code = (
        "import sys, inferd.server.build\n"
        "for name in ('numpy.random', 'encodings.cp437'):\n"
        "    assert name in sys.modules, name + ' is imported lazily'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
