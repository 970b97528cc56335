"""`inferd serve`'s security options: what they become in Settings, and the combinations
refused before anything starts (each with a message naming the options)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.cli.main import build_parser, settings_from
from inferd.cli.security_options import SecurityOptionError
from inferd.dataplane.access import AccessError
from inferd.protocol.tls import TlsError
from inferd.server import build as server
from inferd.settings import Settings, TlsFiles
from tests.support.security import Pki, write_pki

TOKEN = "a-long-enough-admin-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("cli_pki"))


def settings(*args: str) -> Settings:
    return settings_from(build_parser().parse_args(["serve", *args]))


def test_upload_modes() -> None:
    assert settings().model_upload == "off"
    assert settings("--allow-model-upload").model_upload == "files"
    assert settings("--allow-model-upload=code").model_upload == "code"


def test_the_token_file_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERD_ADMIN_TOKEN", " from-the-environment-1234 \n")
    assert settings().admin_token == "from-the-environment-1234"
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    assert settings("--admin-token-file", str(token_file)).admin_token == TOKEN
    assert TOKEN not in repr(settings("--admin-token-file", str(token_file)))  # kept out of logs


def test_tls_options_and_tritons_grpc_aliases(pki: Pki) -> None:
    cert, key, ca = str(pki.server_cert), str(pki.server_key), str(pki.ca)
    both = settings("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca)
    assert both.http_tls == both.grpc_tls == TlsFiles(pki.server_cert, pki.server_key, pki.ca)
    triton = settings("--grpc-use-ssl=true", "--grpc-server-cert", cert, "--grpc-server-key", key)
    assert triton.http_tls is None
    assert triton.grpc_tls == TlsFiles(pki.server_cert, pki.server_key)
    mutual = settings("--grpc-server-cert", cert, "--grpc-server-key", key, "--grpc-root-cert", ca)
    assert mutual.grpc_tls == TlsFiles(pki.server_cert, pki.server_key, pki.ca)
    http_only = settings("--tls-cert", cert, "--tls-key", key, "--grpc-use-ssl", "false")
    assert http_only.http_tls is not None and http_only.grpc_tls is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--tls-cert", "{cert}"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "{ca}"], "--tls-client-ca needs --tls-cert"),
        (["--grpc-use-ssl=true"], "gRPC TLS needs a certificate and its key"),
        (["--grpc-root-cert", "{ca}"], "gRPC TLS needs a certificate and its key"),
        (["--grpc-use-ssl=false", "--grpc-server-cert", "{cert}"], "need --grpc-use-ssl=true"),
        (["--admin-token-file", "{empty}"], "its first line is empty"),
        (["--admin-token-file", "{missing}"], "cannot read it"),
    ],
)
def test_contradictory_options_are_refused(
    pki: Pki, tmp_path: Path, args: list[str], words: str
) -> None:
    (tmp_path / "empty").write_text("\n")
    paths = {"cert": pki.server_cert, "ca": pki.ca, "empty": tmp_path / "empty"}
    paths["missing"] = tmp_path / "missing"
    with pytest.raises(SecurityOptionError, match=words):
        settings(*(a.format(**paths) for a in args))


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (["--allow-model-upload"], AccessError, "needs the repository API"),
        (
            ["--allow-model-upload=code", "--model-control-mode", "explicit"],
            AccessError,
            "--allow-model-upload=code needs a credential on the repository API, and http and "
            "grpc has none",
        ),
        (
            ["--allow-model-upload=code", "--admin-api", "on", "--http-restricted-api",
             "model-repository:k=v"],
            AccessError,
            "and grpc has none",
        ),
        (["--http-restricted-api", "nope:k=v"], AccessError, "unknown API 'nope'"),
        (["--tls-cert", "{cert}", "--tls-key", "{other_key}"], TlsError, "cannot be used together"),
        (["--tls-cert", "{missing}", "--tls-key", "{key}"], TlsError, "is not a readable file"),
    ],
)  # fmt: skip
def test_settings_that_do_not_hold_together_stop_the_start(
    pki: Pki, tmp_path: Path, args: list[str], error: type[Exception], words: str
) -> None:
    other = write_pki(tmp_path / "other")
    paths = {"cert": pki.server_cert, "key": pki.server_key, "other_key": other.server_key}
    paths["missing"] = tmp_path / "missing.pem"
    with pytest.raises(error, match=words):
        server.access_policy(settings(*(a.format(**paths) for a in args)))


def test_code_uploads_start_with_a_token_on_both_protocols() -> None:
    ok = Settings(model_control_mode="explicit", model_upload="code", admin_token=TOKEN)
    assert server.access_policy(ok) is not None


def test_the_command_exits_2_naming_the_problem(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(tmp_path),
         "--allow-model-upload=code", "--model-control-mode", "explicit"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "INFERD_ADMIN_TOKEN"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "--allow-model-upload=code needs a credential" in result.stderr
