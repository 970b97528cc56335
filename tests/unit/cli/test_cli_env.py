"""`inferd serve` configured by INFERD_* variables (twelve-factor): every option has one,
the command line wins, and a bad value is an error naming the variable."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inferd.cli.env import PREFIX, from_text, options, variable_name
from inferd.cli.main import build_parser, serve_parser, settings_from
from inferd.settings import Settings
from tests.support.models import write_counter
from tests.support.server_process import free_port, wait_until_serving


def _serve_options() -> list[argparse.Action]:
    return options(serve_parser(build_parser()))


def _samples(action: argparse.Action) -> list[str]:
    """Texts one of which an option of any kind accepts."""
    choices = [str(c) for c in action.choices] if action.choices is not None else []
    return [*choices, "1", "true", "text", "info", "on"]


@pytest.mark.parametrize("action", _serve_options(), ids=lambda a: a.option_strings[-1])
def test_every_serve_option_has_a_variable_that_reads_a_value(action: argparse.Action) -> None:
    """Walks the parser: an option added to `serve` later gets its variable, or this fails
    (an action kind cli_env does not know raises TypeError here)."""
    name = variable_name(action)
    long = next(s for s in action.option_strings if s.startswith("--"))
    assert name == PREFIX + long[2:].upper().replace("-", "_")
    parsed = []
    for text in _samples(action):
        try:
            parsed.append(from_text(action, text))
        except ValueError:
            continue
    assert parsed, f"{name}: none of {_samples(action)} was accepted"


def test_variables_are_unique_and_cover_the_options() -> None:
    actions = _serve_options()
    names = [variable_name(a) for a in actions]
    assert len(names) == len(set(names))
    # The options every manifest uses are among them (and more than a handful in all).
    assert {"INFERD_MODEL_REPOSITORY", "INFERD_HTTP_PORT", "INFERD_EXIT_TIMEOUT_SECS"} <= set(names)
    assert len(names) >= 25


def test_an_option_added_later_is_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    serve_parser(parser).add_argument("--max-something-new", type=int, default=3)
    monkeypatch.setenv("INFERD_MAX_SOMETHING_NEW", "17")
    assert parser.parse_args(["serve"]).max_something_new == 17


def _settings(*args: str) -> Settings:
    return settings_from(build_parser().parse_args(["serve", *args]))


# (variable, text, Settings field, value it gives)
READ = [
    ("INFERD_HTTP_PORT", "9123", "http_port", 9123),
    ("INFERD_HOST", "0.0.0.0", "host", "0.0.0.0"),
    ("INFERD_MODEL_REPOSITORY", "/models", "model_repository", Path("/models")),
    ("INFERD_EXIT_TIMEOUT_SECS", "12.5", "exit_timeout_s", 12.5),
    ("INFERD_LOG_LEVEL", "debug", "log_level", "DEBUG"),
    ("INFERD_METRICS_TRITON_NAMES", "true", "metrics_triton_names", True),
    ("INFERD_METRICS_TRITON_NAMES", "0", "metrics_triton_names", False),
    ("INFERD_LOAD_MODEL", "mlp 'two words'", "load_models", ("mlp", "two words")),
    ("INFERD_GRPC_PORT", "0", "grpc_port", None),
    ("INFERD_ADMIN_API", "on", "admin_api", True),
    ("INFERD_DOCS_UI", "off", "docs_ui", False),
    ("INFERD_ALLOW_MODEL_UPLOAD", "", "model_upload", "files"),  # as the bare flag
]


@pytest.mark.parametrize(("variable", "text", "field", "value"), READ)
def test_a_variable_sets_its_option(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, field: str, value: object
) -> None:
    monkeypatch.setenv(variable, text)
    assert getattr(_settings(), field) == value


def test_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERD_HTTP_PORT", "9123")
    monkeypatch.setenv("INFERD_LOAD_MODEL", "from_env")
    monkeypatch.setenv("INFERD_LOG_LEVEL", "ERROR")
    monkeypatch.setenv("INFERD_METRICS_TRITON_NAMES", "false")
    settings = _settings(
        "--http-port", "8000", "--load-model", "from_flag", "--metrics-triton-names"
    )
    assert settings.http_port == 8000  # equal to the default
    assert settings.load_models == ("from_flag",)  # not appended
    assert settings.metrics_triton_names is True
    assert settings.log_level == "ERROR"  # no flag: the variable


# (variable, bad text, what the message must say)
BAD = [
    ("INFERD_HTTP_PORT", "eighty", "not a valid int"),
    ("INFERD_EXIT_TIMEOUT_SECS", "soon", "not a valid float"),
    ("INFERD_LOG_FORMAT", "xml", "expected one of text, json"),
    ("INFERD_METRICS_TRITON_NAMES", "maybe", "expected true or false"),
    ("INFERD_GRPC_USE_SSL", "perhaps", "expected true or false"),
    ("INFERD_LOAD_MODEL", "'unclosed", "cannot split it"),
    ("INFERD_MODEL_CONTROL_MODE", "sometimes", "expected one of none, poll, explicit"),
]


@pytest.mark.parametrize(("variable", "text", "says"), BAD)
def test_a_bad_value_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    text: str,
    says: str,
) -> None:
    monkeypatch.setenv(variable, text)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{variable}={text!r}" in err and says in err, err


def test_bench_and_tune_read_no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only `serve` runs in manifests; a load generator run by hand takes its flags."""
    monkeypatch.setenv("INFERD_CONCURRENCY", "64")
    assert build_parser().parse_args(["bench", "-m", "x"]).concurrency == "1"


def test_serve_configured_by_the_environment_alone(tmp_path: Path) -> None:
    """The process as a manifest starts it: `inferd serve` with no flags at all."""
    repo = tmp_path / "models"
    write_counter(repo)
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "INFERD_MODEL_REPOSITORY": str(repo),
        "INFERD_HTTP_PORT": str(port),
        "INFERD_GRPC_PORT": "0",
        "INFERD_METRICS_PORT": "0",
        "INFERD_LOG_FORMAT": "json",
        "INFERD_HTTP_PROT": "8000",  # a typo: warned about, never silently taken
    }
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferd", "serve"], env=env, stdout=log, stderr=log
        )
    try:
        wait_until_serving(
            proc.pid, port, exit_code=proc.poll, output=log_path.read_text, timeout_s=60
        )
        r = httpx.get(f"http://127.0.0.1:{port}/v2/models/counter/ready", timeout=10)
        assert r.status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    output = log_path.read_text()
    assert "INFERD_HTTP_PROT names no option" in output
    assert output.lstrip().startswith("{"), output  # INFERD_LOG_FORMAT=json was read
