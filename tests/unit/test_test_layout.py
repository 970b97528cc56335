"""The tests mirror the tree: each package of `src/inferd` has its unit tests in
`tests/unit/<package>/`, the helpers tests share live in `tests/support/`, and no test module
imports another (what two test modules share is a helper)."""

from __future__ import annotations

import ast
from pathlib import Path

import inferd

TESTS = Path(__file__).resolve().parents[1]
SRC = Path(inferd.__file__).parent


def imported_test_modules(source: str) -> list[str]:
    """The test modules (`tests.….test_*`) that `source` imports, in every import form."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_test_module(node.module):
                found.append(node.module)
            else:
                found += [
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if _is_test_module(f"{node.module}.{a.name}")
                ]
    return found


def _is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")


def test_the_check_sees_every_import_form() -> None:
    source = (
        "from tests.unit.cache.test_keys import x\n"
        "import tests.integration.protocol.test_tls\n"
        "def f():\n    from tests.tools import test_bench\n"
        "from tests.support.models import builders\n"
    )
    assert imported_test_modules(source) == [
        "tests.unit.cache.test_keys",
        "tests.integration.protocol.test_tls",
        "tests.tools.test_bench",
    ]


def test_no_test_module_imports_another() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported_test_modules(path.read_text(encoding="utf-8"))
    ]
    assert not found, "move what they share to tests/support/:\n" + "\n".join(found)


def test_helpers_live_in_support() -> None:
    """Outside tests/support/ a module is a test module, a conftest or a package marker."""
    strays = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if path.parent.name != "support"
        and not path.name.startswith("test_")
        and path.name not in ("conftest.py", "__init__.py")
    ]
    assert not strays, "helpers outside tests/support/: " + ", ".join(strays)


def test_every_package_has_its_unit_tests_folder() -> None:
    packages = sorted(p.parent.relative_to(SRC) for p in SRC.glob("*/__init__.py"))
    assert len(packages) > 10
    missing = [str(p) for p in packages if not any((TESTS / "unit" / p).glob("test_*.py"))]
    assert not missing, "packages without tests/unit/<package>/: " + ", ".join(missing)
