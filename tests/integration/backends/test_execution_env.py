"""A Python model's own environment (EXECUTION_ENV_PATH, docs/python-models.md): a virtual
environment's folder or a packed archive of one, whose interpreter the model's worker process
runs, with the environment's packages importable; every bad path a load error naming it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferd.backends.python.isolated.execution_env import resolve_env
from inferd.config.model_config import ConfigError
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

# A package only the environment has: the model cannot import it from the server's.
PACKAGE = "inferd_env_only_pkg"

MODEL_PY = f"""
import sys
import numpy as np
import {PACKAGE}

class Model:
    def predict(self, inputs):
        n = inputs["IN"].shape[0]
        where = f"{{{PACKAGE}.WHERE}}|{{sys.executable}}".encode()
        return {{"OUT": np.array([[where]] * n, dtype=object)}}
"""

# Triton's form, whose auto_complete_config (run before the load) needs the package too.
TRITON_PY = f"""
import sys
import numpy as np
import triton_python_backend_utils as pb_utils
import {PACKAGE}

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size({PACKAGE}.BATCH)
        return config

    def execute(self, requests):
        where = f"{{{PACKAGE}.WHERE}}|{{sys.executable}}".encode()
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[where]], dtype=object))])
            for _ in requests
        ]
"""

CONFIG = """
name: "{name}"
backend: "python"
{batch}
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
"""

# (model, model.py, where its environment is, as its config names it)
MODELS = [
    ("env_dir", MODEL_PY, "env"),  # a venv's folder, relative to the model's
    ("env_archive", MODEL_PY, "$$TRITON_MODEL_DIRECTORY/env.tar.gz"),  # Triton's form
    ("env_triton", TRITON_PY, "env"),
]


def make_venv(root: Path) -> Path:
    """A virtual environment holding PACKAGE (no pip, no download: seconds)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = subprocess.run(
        [
            str(root / "bin" / "python3"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    package = Path(purelib) / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'WHERE = "{root.name}"\nBATCH = 4\n')
    if "coverage" in sys.modules:
        # `make test` runs under coverage, which follows multiprocessing: the spawned worker
        # unpickles coverage's start-up hook before anything else, so the environment needs
        # coverage itself (only it: the model must still not see the server's packages).
        import coverage

        (Path(purelib) / "coverage").symlink_to(Path(coverage.__file__).parent)
    return root


def write_model(
    repo: Path, name: str, code: str, env: str, batch: str = "max_batch_size: 4"
) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(code))
    text = CONFIG.format(name=name, env=env, batch=batch)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(text))
    return model_dir


@pytest.fixture(scope="module")
def env_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("env_repo")
    for name, code, env in MODELS:
        # The Triton model's auto_complete_config sets its max_batch_size.
        batch = "" if code is TRITON_PY else "max_batch_size: 4"
        model_dir = write_model(repo, name, code, env, batch)
        venv = make_venv(model_dir / "env")
        if env.endswith(".tar.gz"):
            with tarfile.open(model_dir / "env.tar.gz", "w:gz") as tar:
                tar.add(venv, arcname=".")
            subprocess.run(["rm", "-rf", str(venv)], check=True)  # only the archive is left
    with run_server(repo) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", [m[0] for m in MODELS])
def test_the_model_runs_its_environments_interpreter_with_its_packages(
    env_server: RunningServer, model: str, protocol: str
) -> None:
    client = Client(protocol, env_server)
    try:
        result = client.infer(model, {"IN": (np.ones((1, 1), np.float32), "FP32")})
    finally:
        client.raw.close()
    where, executable = result.as_numpy("OUT")[0, 0].decode().split("|")
    assert where == "env"  # imported from the environment
    assert executable != sys.executable
    if model == "env_archive":
        assert "inferd-envs" in Path(executable).parts  # unpacked once, in the temp folder
    else:
        assert Path(executable).parts[-4:-2] == (model, "env")  # <model>/env/bin/python3


def test_auto_complete_config_ran_in_the_environment(env_server: RunningServer) -> None:
    config = env_server.server.registry.get("env_triton").config
    assert config.max_batch_size == 4  # set by auto_complete_config from the package


def test_without_its_environment_the_import_failure_says_what_and_why(tmp_path: Path) -> None:
    from inferd.repository.loader import prepare

    model_dir = write_model(tmp_path, "m", TRITON_PY, "env", batch="")
    config = (model_dir / "config.pbtxt").read_text().replace("EXECUTION_ENV_PATH", "greeting")
    (model_dir / "config.pbtxt").write_text(config)
    with pytest.raises(ConfigError) as info:
        prepare(model_dir)
    message = str(info.value)
    assert message.startswith("m/1/model.py: importing it to run its auto_complete_config failed")
    assert f"No module named '{PACKAGE}'" in message
    assert "EXECUTION_ENV_PATH" in message
    (model_dir / "1" / "model.py").write_text(
        f"import {PACKAGE}\nclass TritonPythonModel:\n    pass\n"
    )
    with pytest.raises(ConfigError) as info:
        prepare(model_dir)
    assert "importing it failed (it is imported before the load to find out whether" in str(
        info.value
    )


FIELD = "m/config.pbtxt: parameters.EXECUTION_ENV_PATH"


def _fake_python(root: Path, script: str) -> Path:
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python3"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    return root


BAD = [
    ("missing", lambda d: "nope", "'nope' does not exist"),
    ("a file", lambda d: (d / "env.txt").write_text("x") and "env.txt", "neither a directory"),
    ("no python", lambda d: (d / "empty").mkdir() or "empty", "holds no bin/python3 or bin/python"),
    (
        "broken archive",
        lambda d: (d / "env.tar.gz").write_bytes(b"not a tar") and "env.tar.gz",
        "cannot be unpacked",
    ),
    (
        "does not run",
        lambda d: _fake_python(d / "bad", "echo broken >&2; exit 3\n") and "bad",
        "bin/python3 does not run: broken",
    ),
    (
        "another version",
        lambda d: _fake_python(d / "old", "echo '[[3, 9], []]'\n") and "old",
        "is Python 3.9; inferd runs on",
    ),
]


@pytest.mark.parametrize(("make", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_environment_fails_naming_the_path_and_what_is_wrong(
    tmp_path: Path, make: object, words: str
) -> None:
    raw = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        resolve_env(raw, tmp_path, FIELD)
    message = str(info.value)
    assert message.startswith(f"{FIELD}: '{raw}"), message
    assert words in message, message
    assert str(tmp_path) not in message  # the path as the config wrote it, not the machine's


def test_a_bad_environment_fails_the_load_and_the_server_serves_on(tmp_path: Path) -> None:
    write_model(tmp_path, "lost", MODEL_PY, "no_such_env")
    with run_server(tmp_path) as running:
        version = running.server.registry.models["lost"].versions["1"]
        assert not version.is_ready
        assert (
            "lost/config.pbtxt: parameters.EXECUTION_ENV_PATH: 'no_such_env' does not exist"
            in version.reason
        )
