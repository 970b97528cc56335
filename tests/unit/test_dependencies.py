"""What the code imports is what its install brings: `inferd bench` and `inferd tune` run on
inferd's base dependencies, and the benchmarks documented for users run on what `make serve`
installs. (`inferd bench` once needed aiohttp, which only the test extra had: it crashed
after `make serve`.)

Imports are read from the source (every `import`, also the ones inside functions), mapped to
the distributions that provide them, and checked against the dependency closure of
pyproject.toml's requirements, resolved through the installed packages' metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "src" / "inferd_tools"  # bench, tune, optimize
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# Imported only where the code says what to install when it is missing.
OPTIONAL = {"matplotlib": "bench", "granian": "frontend-bench", "scipy": "monitoring"}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(requirements: Iterable[str]) -> set[str]:
    """The distributions these requirements pull in, transitively (markers evaluated)."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _name(req.name)
        for wanted in [""] + sorted(req.extras):
            key = f"{name}[{wanted}]"
            if key in seen:
                continue
            seen.add(key)
            try:
                requires = md.requires(name) or []
            except md.PackageNotFoundError:
                continue  # a requirement not installed here adds nothing to check against
            todo.extend((Requirement(r), wanted) for r in requires)
    return {key.split("[")[0] for key in seen}


def serve_extras() -> list[str]:
    """The extras `make serve` installs (the Makefile's SERVE_EXTRAS)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^SERVE_EXTRAS := (.+)$", makefile, re.MULTILINE)
    assert match, "the Makefile names the extras `make serve` installs in SERVE_EXTRAS"
    return match.group(1).split(",")


def imported_top_levels(files: Iterable[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    local = {"inferd", "inferd_tools", "tests", "benchmarks", "__future__"}  # this repo's
    return {
        name: path
        for name, path in found.items()
        if name not in sys.stdlib_module_names and name not in local
    }


def with_local_imports(files: Iterable[Path]) -> list[Path]:
    """The files and, transitively, the `tests.*` modules they import (the benchmarks reuse
    the tests' model builders): what they import must be installed too."""
    todo, seen = list(files), []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                todo.append(ROOT / (str(node.module).replace(".", "/") + ".py"))
    return sorted(seen)


def missing(files: Iterable[Path], installed: set[str]) -> list[str]:
    providers = md.packages_distributions()
    gaps = []
    for module, path in sorted(imported_top_levels(files).items()):
        if module in OPTIONAL:
            continue
        dists = {_name(d) for d in providers.get(module, [module])}
        if not dists & installed:
            gaps.append(f"{path.relative_to(ROOT)} imports {module} ({', '.join(sorted(dists))})")
    return gaps


def base() -> list[str]:
    return list(PYPROJECT["dependencies"])


def extra(name: str) -> list[str]:
    return list(PYPROJECT["optional-dependencies"][name])


def test_bench_and_tune_need_only_the_base_dependencies() -> None:
    """With the server's public surface they use and the command line that registers every
    tool (building `inferd`'s parser imports each tool's options)."""
    files = sorted((TOOLS / "bench").glob("*.py")) + sorted((TOOLS / "tune").glob("*.py"))
    files += [TOOLS / "__init__.py", TOOLS / "commands.py", TOOLS / "optimize" / "main.py"]
    files += [ROOT / "src" / "inferd" / "cli/main.py", ROOT / "src" / "inferd" / "public.py"]
    assert not missing(files, closure(base()))


def test_optimize_needs_its_extra_and_make_serve_installs_it() -> None:
    """`inferd optimize`: onnx from its `optimize` extra, torch (PyTorch models) from the
    `torch` extra; `make serve` installs both (the README's commands run after it)."""
    files = sorted((TOOLS / "optimize").glob("*.py"))
    assert not missing(files, closure(base() + extra("optimize") + extra("torch")))
    assert any("imports onnx " in gap for gap in missing(files, closure(base() + extra("torch"))))
    installed = {_name(Requirement(r).name) for e in serve_extras() for r in extra(e)}
    assert {"onnx", "torch", "matplotlib"} <= installed


def test_the_benchmarks_need_only_what_make_serve_installs() -> None:
    """benchmarks/*.py run with the venv `make serve` makes (peers/ have venvs of their own)."""
    installs = base() + [r for name in serve_extras() for r in extra(name)]
    files = with_local_imports((ROOT / "benchmarks").glob("*.py"))
    assert ROOT / "tests" / "support" / "fault_models.py" in files  # overload.py's models
    assert not missing(files, closure(installs))


@pytest.mark.parametrize(("module", "extra_name"), sorted(OPTIONAL.items()))
def test_optional_imports_are_in_their_extra(module: str, extra_name: str) -> None:
    assert any(_name(Requirement(r).name) == module for r in extra(extra_name))


def test_the_check_sees_what_is_missing() -> None:
    """Without aiohttp in the base, the bench would be caught again."""
    files = sorted((TOOLS / "bench").glob("*.py"))
    without = closure(r for r in base() if not r.startswith("aiohttp"))
    assert any("imports aiohttp" in gap for gap in missing(files, without))
