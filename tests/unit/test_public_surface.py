"""The tools (`src/inferd_tools`: bench, tune, optimize) reach the server only through
`inferd.public`, and the server reaches the tools only from its command line.

Imports are read from the source (every `import`, also inside functions and under
`if TYPE_CHECKING:`), so an import the tests never execute is held to the rule as well.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import inferd
import inferd.cli.help_format
import inferd.config.model_config
import inferd.dataplane.access
import inferd.public
import inferd.repository.checksum

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "src" / "inferd"
TOOLS = ROOT / "src" / "inferd_tools"
PUBLIC = "inferd.public"


def imports(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import; names are empty for `import M`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def private_imports(source: str, where: str) -> list[str]:
    """The imports in `source` of server names outside the public surface."""
    found = []
    for line, module, names in imports(ast.parse(source)):
        if module != "inferd" and not module.startswith("inferd."):
            continue
        if module == PUBLIC:
            allowed = set(inferd.public.__all__)
        elif module == "inferd" and names:  # the model author's API: inferd.__all__
            allowed = set(inferd.__all__)
        else:
            found.append(f"{where}:{line} imports {module}")
            continue
        found += [f"{where}:{line} imports {module}.{n}" for n in names if n not in allowed]
    return found


def sources(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.py"))


def test_the_tools_import_nothing_of_the_server_but_its_public_surface() -> None:
    files = sources(TOOLS)
    assert TOOLS / "tune" / "sweep.py" in files and len(files) > 20  # the tools are all read
    found = [
        gap
        for path in files
        for gap in private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, "the tools may import only inferd.public's __all__:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("from inferd.dataplane.access import TOKEN_ENV", "inferd.dataplane.access"),
        ("import inferd.config.model_config", "inferd.config.model_config"),
        ("def f():\n    from inferd.repository import checksum", "inferd.repository"),
        ("if TYPE_CHECKING:\n    import inferd.server.build", "inferd.server.build"),
        ("from inferd import cli", "inferd.cli"),  # a submodule, not a name of inferd.__all__
        ("from inferd.public import TOKEN_ENV", "inferd.public.TOKEN_ENV"),  # not in __all__
    ],
)
def test_the_check_flags_a_private_import(source: str, flagged: str) -> None:
    assert private_imports(source, "x.py") == [
        f"x.py:{source.count(chr(10)) + 1} imports {flagged}"
    ]


def test_the_check_lets_the_public_surface_through() -> None:
    source = "import inferd.public\nfrom inferd.public import checksum, read_config\n"
    source += "from inferd import PythonModel\nfrom inferd_tools.bench import report\n"
    assert private_imports(source, "x.py") == []


def test_the_server_imports_the_tools_only_from_its_command_line() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sources(SERVER)
        for line, module, _ in imports(ast.parse(path.read_text(encoding="utf-8")))
        if module.split(".")[0] == "inferd_tools" and path != SERVER / "cli/main.py"
    ]
    assert not found, "\n".join(found)


def test_the_public_names_are_the_servers_own() -> None:
    """What the tools read is what the server uses, not a copy that could drift."""
    config = inferd.config.model_config
    assert inferd.public.ADMIN_TOKEN_ENV is inferd.dataplane.access.TOKEN_ENV
    assert inferd.public.DefaultsOnceFormatter is inferd.cli.help_format.DefaultsOnceFormatter
    assert inferd.public.checksum is inferd.repository.checksum.checksum
    for name in ("ConfigError", "backend_name", "instance_count", "int_parameter", "read_config"):
        assert getattr(inferd.public, name) is getattr(config, name), name
    assert {n for n in inferd.public.__all__ if getattr(inferd.public, n) is None} == set()
    with pytest.raises(AttributeError, match="no attribute 'parameter'"):
        _ = inferd.public.parameter  # type: ignore[attr-defined]


def test_building_the_command_line_leaves_config_reading_unloaded() -> None:
    """Every `inferd` command builds every tool's parser: reading config.pbtxt (protobuf and
    tritonclient's gRPC package) loads only when a command needs it."""
    code = (
        "import sys, inferd.cli.main; inferd.cli.main.build_parser(); "
        "print(sorted(m for m in ('inferd.config.model_config', 'grpc', 'google.protobuf') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_import_paths_users_write_keep_working() -> None:
    """What models, docs and examples import: the model API at `inferd` and at
    `inferd.python_model` (one set of objects), the response stream's names, the capture
    readers, the settings, and the command's entry point."""
    import inferd.python_model
    from inferd.monitoring.capture_files import load_capture, read_index
    from inferd.monitoring.capture_redis import load_redis_capture
    from inferd.settings import Settings
    from inferd.streams import STREAM_QUEUE_LIMIT, StreamClosedError

    for name in inferd.python_model.__all__:
        assert getattr(inferd.python_model, name) is getattr(inferd, name), name
    assert set(inferd.python_model.__all__) < set(inferd.__all__)
    assert issubclass(StreamClosedError, Exception) and STREAM_QUEUE_LIMIT > 0
    assert callable(load_capture) and callable(read_index) and callable(load_redis_capture)
    assert Settings().http_port == 8000
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["inferd"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_a_triton_model_imports_its_utils_by_tritons_name(tmp_path: Path) -> None:
    """`import triton_python_backend_utils as pb_utils`, as Triton's model.py files do."""
    from inferd.backends.python import pb_utils
    from inferd.backends.python.model_import import import_model_module

    (tmp_path / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\nTENSOR = pb_utils.Tensor\n"
    )
    module = import_model_module("user_paths_check", tmp_path)
    assert module.TENSOR is pb_utils.Tensor
