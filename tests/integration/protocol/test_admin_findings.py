"""Issue #14's findings against the repository API, each reproduced and refused, over HTTP and
gRPC from one case table (Triton's clients):

- code execution: uploading a Python model (or any code) through `load`;
- a file-read oracle: config paths (`model_warmup.input_data_file`, `label_filename`)
  pointing outside the model, answered differently for existing and missing files, with
  the file's first bytes in the error;
- admin 500s and ghosts: bad upload names and model names answered 500 and left a model
  entry behind that held server readiness at 503.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import plus, write_plus_model
from tests.support.security import ADMIN_TOKEN, AUTH
from tests.support.servers import RunningServer, run_server

PROTOCOLS = ["http", "grpc"]
STATUS = {
    "http": {400: "400", 403: "403"},
    "grpc": {400: "StatusCode.INVALID_ARGUMENT", 403: "StatusCode.PERMISSION_DENIED"},
}
ONNX = plus(7.0).SerializeToString()
PYTHON_MODEL = b"""
import numpy as np

class Model:
    def load(self, context):
        pass

    def predict(self, inputs):
        return {"OUT": inputs["IN"] * 3}
"""


def onnx_config(name: str, **extra: Any) -> str:
    return json.dumps(
        {
            "name": name,
            "platform": "onnxruntime_onnx",
            "max_batch_size": 4,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
            **extra,
        }
    )


def python_config(name: str) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    """One explicit-mode server per `--allow-model-upload` mode, each serving `first`."""
    repo = tmp_path_factory.mktemp("findings") / "repo"  # `outside` goes beside it
    write_plus_model(repo, "first", [1])
    with contextlib.ExitStack() as stack:
        yield {
            mode: stack.enter_context(
                run_server(
                    repo,
                    model_control_mode="explicit",
                    load_models=("first",),
                    admin_token=ADMIN_TOKEN,
                    model_upload=mode,
                )
            )
            for mode in ("off", "files", "code")
        }


class Admin:
    """A Triton client (HTTP or gRPC) that sends the admin token."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
        self.raw = self.mod.InferenceServerClient(address)

    def load(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        files = None if files is None else {f"file:{p}": b for p, b in files.items()}
        self.raw.load_model(name, headers=dict(AUTH), config=config, files=files)

    def refused(self, status: int, call: Any) -> str:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == STATUS[self.protocol][status], info.value
        return str(info.value.message())

    def model_names(self) -> set[str]:
        index = self.raw.get_model_repository_index(headers=dict(AUTH))
        rows = index if self.protocol == "http" else index.models
        return {row["name"] if self.protocol == "http" else row.name for row in rows}

    def infer(self, model: str, name: str, array: np.ndarray) -> np.ndarray:
        inp = self.mod.InferInput(name, list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        result = self.raw.infer(model, [inp])
        return result.as_numpy("y" if name == "x" else "OUT")  # type: ignore[no-any-return]


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def assert_nothing_left(admin: Admin, before: set[str]) -> None:
    """A refused load changes nothing: the same models, and the server still ready."""
    assert admin.model_names() == before
    assert admin.raw.is_server_ready()
    x = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(admin.infer("first", "x", x), np.ones((1, 4), np.float32))


# -- code execution: uploads are off by default, code needs its own option --------------

# (id, --allow-model-upload, config kind, files, refused, words in the 403)
UPLOADS: list[tuple[str, str, str, dict[str, bytes], bool, list[str]]] = [
    ("onnx, uploads off", "off", "onnx", {"1/model.onnx": ONNX}, True,
     ["parameter 'file:1/model.onnx'", "disabled", "--allow-model-upload"]),
    ("python, uploads off", "off", "python", {"1/model.py": PYTHON_MODEL}, True,
     ["parameter 'file:1/model.py'", "--allow-model-upload"]),
    ("onnx, files allowed", "files", "onnx", {"1/model.onnx": ONNX}, False, []),
    ("python, files allowed", "files", "python", {"1/model.py": PYTHON_MODEL}, True,
     ["'file:1/model.py' is executable code", "--allow-model-upload=code"]),
    ("a shared library beside onnx", "files", "onnx",
     {"1/model.onnx": ONNX, "1/libcustom_ops.so.1": b"\x7fELF"}, True,
     ["'file:1/libcustom_ops.so.1' is executable code"]),
    ("a Python module beside onnx", "files", "onnx",
     {"1/model.onnx": ONNX, "1/helpers/util.PY": b"print(1)"}, True,
     ["'file:1/helpers/util.PY' is executable code"]),
    ("python, code allowed", "code", "python", {"1/model.py": PYTHON_MODEL}, False, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "kind", "files", "refused", "words"),
    [u[1:] for u in UPLOADS],
    ids=[u[0] for u in UPLOADS],
)
def test_uploads_are_refused_unless_allowed(
    servers: dict[str, RunningServer],
    protocol: str,
    mode: str,
    kind: str,
    files: dict[str, bytes],
    refused: bool,
    words: list[str],
) -> None:
    admin = Admin(protocol, servers[mode])
    name = f"up_{kind}_{protocol}"
    config = onnx_config(name) if kind == "onnx" else python_config(name)
    try:
        before = admin.model_names()
        if refused:
            message = admin.refused(403, lambda: admin.load(name, config, files))
            for word in words:
                assert word in message
            assert_nothing_left(admin, before)
            return
        admin.load(name, config, files)
        if kind == "onnx":
            out = admin.infer(name, "x", np.zeros((1, 4), np.float32))
            np.testing.assert_array_equal(out, np.full((1, 4), 7.0, np.float32))
        else:
            out = admin.infer(name, "IN", np.full((2, 1), 2.0, np.float32))
            np.testing.assert_array_equal(out, np.full((2, 1), 6.0, np.float32))
    finally:
        admin.raw.close()


# -- admin 500s and ghosts -------------------------------------------------------------

# (id, model name, files (with a config) or None, words in the 400)
MALFORMED: list[tuple[str, str, dict[str, bytes] | None, list[str]]] = [
    ("NUL in a file name", "nul", {"1/mo\0del.onnx": ONNX},
     ["parameter 'file:1/mo\\x00del.onnx'", "control characters"]),
    ("a file where the version directory goes", "clash", {"1": b"x", "1/model.onnx": ONNX},
     ["parameter 'file:1' is a file", "'file:1/model.onnx' needs '1' to be a directory"]),
    ("the same file twice", "twice", {"1/model.onnx": ONNX, "1//./model.onnx": ONNX},
     ["name the same file"]),
    ("a path out of the model directory", "escape", {"../../evil.onnx": ONNX},
     ["file parameter '../../evil.onnx' points outside the model directory"]),
    ("an absolute path", "absolute", {"/tmp/evil.onnx": ONNX}, ["points outside"]),
    ("a file name past NAME_MAX", "longfile", {"1/" + "f" * 300: ONNX},
     ["longer than 255 bytes"]),
    ("a 300-character model name", "m" * 300, None, ["invalid model name", "300 bytes"]),
    ("a 300-character model name with files", "m" * 300, {"1/model.onnx": ONNX},
     ["invalid model name", "300 bytes"]),
    ("NUL in the model name", "a\0b", None, ["invalid model name 'a\\x00b'", "control"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "files", "words"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_loads_are_400s_that_leave_no_ghost(
    servers: dict[str, RunningServer],
    protocol: str,
    name: str,
    files: dict[str, bytes] | None,
    words: list[str],
) -> None:
    admin = Admin(protocol, servers["files"])
    try:
        before = admin.model_names()
        config = None if files is None else onnx_config(name)
        message = admin.refused(400, lambda: admin.load(name, config, files))
        for word in words:
            assert word in message
        assert_nothing_left(admin, before)
    finally:
        admin.raw.close()


# -- the file-read oracle --------------------------------------------------------------

SECRET = b"root:x:0:0:TOP-SECRET-CONTENT!!!"  # 32 bytes: 8 FP32 values, or 1 bad BYTES element
SECRET_WORDS = ["root", "TOP-SECRET", str(int.from_bytes(SECRET[:4], "little"))]


@pytest.fixture(scope="module")
def outside(servers: dict[str, RunningServer]) -> Path:
    """A directory beside the repository (3 levels up from `first/warmup/`) with a secret."""
    repo = servers["off"].server.settings.model_repository
    place = repo.parent / "outside"
    place.mkdir(exist_ok=True)
    (place / "secret.bin").write_bytes(SECRET)
    (repo / "first" / "warmup").mkdir(exist_ok=True)
    (repo / "first" / "warmup" / "inside.bin").write_bytes(SECRET)
    return place


def warmup_config(path: str, data_type: str) -> str:
    sample = {"data_type": data_type, "dims": [4], "input_data_file": path}
    return onnx_config("first", model_warmup=[{"name": "w", "batch_size": 1,
                                               "inputs": {"x": sample}}])  # fmt: skip


def label_config(path: str, data_type: str) -> str:
    output = {"name": "y", "data_type": "TYPE_FP32", "dims": [4], "label_filename": path}
    return onnx_config("first", output=[output])


# (id, an existing file, a missing one, config with the path), both outside the model
ORACLES = [
    ("absolute, as in the issue", "/etc/passwd", "/etc/no-such-file-for-inferd", warmup_config),
    ("absolute", "{outside}/secret.bin", "{outside}/missing.bin", warmup_config),
    ("relative, climbing out", "../../../outside/secret.bin", "../../../outside/missing.bin",
     warmup_config),
    ("label_filename", "../../outside/secret.bin", "../../outside/missing.bin", label_config),
]  # fmt: skip


@pytest.mark.parametrize("data_type", ["TYPE_FP32", "TYPE_STRING"])
@pytest.mark.parametrize(
    ("existing", "missing", "make_config"), [o[1:] for o in ORACLES], ids=[o[0] for o in ORACLES]
)
def test_config_paths_outside_the_model_are_refused_alike(
    servers: dict[str, RunningServer],
    outside: Path,
    protocol: str,
    existing: str,
    missing: str,
    make_config: Any,
    data_type: str,
) -> None:
    existing, missing = (p.format(outside=outside) for p in (existing, missing))
    admin = Admin(protocol, servers["off"])
    try:
        before = admin.model_names()
        messages = []
        for path in (existing, missing):
            message = admin.refused(
                400, lambda p=path: admin.load("first", make_config(p, data_type))
            )
            assert "must name a file inside the model's directory first/" in message
            message = message.replace(path, "<path>")  # the path the client sent, echoed
            for word in SECRET_WORDS:
                assert word not in message
            messages.append(message)
        assert messages[0] == messages[1]  # existence does not leak
        assert_nothing_left(admin, before)
    finally:
        admin.raw.close()


@pytest.mark.parametrize("data_type", ["TYPE_FP32", "TYPE_STRING"])
def test_a_bad_warmup_file_inside_the_model_is_named_not_quoted(
    servers: dict[str, RunningServer], outside: Path, protocol: str, data_type: str
) -> None:
    admin = Admin(protocol, servers["off"])
    config = onnx_config(
        "first",
        max_batch_size=4,
        model_warmup=[{"name": "w", "batch_size": 4,
                       "inputs": {"x": {"data_type": data_type, "dims": [4],
                                        "input_data_file": "inside.bin"}}}],
    )  # fmt: skip
    try:
        message = admin.refused(400, lambda: admin.load("first", config))
        assert "first/warmup/inside.bin" in message
        assert "32 bytes" in message  # its size, to fix it by; never its content
        for word in SECRET_WORDS:
            assert word not in message
        assert admin.raw.is_server_ready()
    finally:
        admin.raw.close()
