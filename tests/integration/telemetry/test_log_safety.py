"""Logs that clients cannot forge or flood, and model error text that does not leak, against
`inferd serve` as its own process (its log a file), over HTTP and gRPC."""

from __future__ import annotations

import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import grpc
import httpx
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.cli.main import build_parser, serve_parser, settings_from
from inferd.protocol import error_text
from inferd.protocol.error_text import MODEL_ERROR_CHARS
from tests.support.servers import STATE_DEADLINE_S, CliServer, free_port, run_cli_server, run_server

LEAKY_CONFIG = """
name: "leaky"
backend: "python"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""
# A model whose error names its own files, pastes a traceback and quotes 100 kB.
LEAKY_PY = """
import os

class Model:
    def predict(self, inputs):
        here = os.path.dirname(os.path.abspath(__file__))
        raise OSError(
            f"cannot read {here}/weights.bin\\n"
            "Traceback (most recent call last):\\n"
            f'  File "{__file__}", line 7, in predict\\n'
            "PermissionError: denied " + "z" * 100_000
        )
"""
FORGED = "12:00:00 ERROR   inferd.server.build: forged"


@dataclass
class Served:
    cli: CliServer
    repo: Path
    http: httpx.Client
    stub: service_pb2_grpc.GRPCInferenceServiceStub

    def log_size(self) -> int:
        return self.cli.log_path.stat().st_size

    def wait_logged(self, marker: str) -> str:
        """The log once it holds `marker` (lines are written as requests end)."""
        deadline = time.monotonic() + STATE_DEADLINE_S
        while marker not in (text := self.cli.output()):
            assert time.monotonic() < deadline, f"{marker!r} never logged"
            time.sleep(0.01)
        return text

    def mark(self) -> str:
        """A request the log names (an unknown model), to know the log has caught up."""
        marker = f"marker-{uuid.uuid4().hex}"
        assert self.http.post(f"/v2/models/{marker}/infer", content=b"{}").status_code == 404
        return self.wait_logged(marker)


def _write_leaky(repo: Path) -> None:
    (repo / "leaky" / "1").mkdir(parents=True)
    (repo / "leaky" / "config.pbtxt").write_text(textwrap.dedent(LEAKY_CONFIG).lstrip())
    (repo / "leaky" / "1" / "model.py").write_text(textwrap.dedent(LEAKY_PY).lstrip())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("log_safety")
    repo = root / "models"
    _write_leaky(repo)
    grpc_port = free_port()
    args = ("--grpc-port", str(grpc_port), "--log-sample-rate", "1")
    with (
        run_cli_server(repo, root / "server.log", *args) as cli,
        httpx.Client(base_url=cli.url, timeout=60) as http,
        grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        yield Served(cli, repo, http, stub)


def _http_error(served: Served, model: str, body: bytes) -> tuple[int, str]:
    r = served.http.post(f"/v2/models/{quote(model, safe='')}/infer", content=body)
    return r.status_code, str(r.json()["error"])


def _grpc_error(served: Served, model: str, body: bytes) -> tuple[int, str]:
    doc = orjson.loads(body)
    msg = pb.ModelInferRequest(model_name=model, id=str(doc.get("id", "")))
    for inp in doc["inputs"]:
        t = msg.inputs.add(name=inp["name"], datatype=inp["datatype"], shape=inp["shape"])
        t.contents.fp32_contents.extend(inp["data"])
    with pytest.raises(grpc.RpcError) as info:
        served.stub.ModelInfer(msg, timeout=60)
    code = info.value.code()
    status = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404}
    return status.get(code, 500), info.value.details() or ""


ERROR_OF: dict[str, Callable[[Served, str, bytes], tuple[int, str]]] = {
    "http": _http_error,
    "grpc": _grpc_error,
}
GOOD = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


@pytest.mark.parametrize("protocol", ERROR_OF)
def test_request_text_cannot_forge_log_lines(served: Served, protocol: str) -> None:
    model = f"nope-{protocol}\n{FORGED}\r\x1b[2J\x85\u2028"
    body = orjson.dumps({**GOOD, "id": f"\x1b]0;{protocol}\x07\n{FORGED}"})
    status, _ = ERROR_OF[protocol](served, model, body)
    assert status == 404
    log = served.wait_logged(f"nope-{protocol}\\n12:00:00 ERROR")
    assert not any(line.startswith(FORGED) for line in log.splitlines())
    assert "\x1b" not in log and "\x85" not in log and "\u2028" not in log and "\r" not in log


@pytest.mark.parametrize("protocol", ERROR_OF)
def test_a_large_bad_request_writes_little_log(served: Served, protocol: str) -> None:
    big = "x" * (4 << 20)
    bad = [
        {"inputs": [{**GOOD["inputs"][0], "name": big}]},  # "unexpected input 'xxx...'"
        {"inputs": [{**GOOD["inputs"][0], "datatype": big}]},  # "unknown datatype 'xxx...'"
        {**GOOD, "id": big},
    ]
    served.mark()
    before = served.log_size()
    for doc in bad:
        status, message = ERROR_OF[protocol](served, "leaky", orjson.dumps(doc))
        assert status in (400, 500)
        assert len(message) < 8192  # the answer quotes a little of the input, not 4 MiB
    served.mark()
    # Three requests of 4 MiB each (and the marker's line): a few kB, where each used to
    # write its input into the log two or three times over (12.6 MB for one).
    assert served.log_size() - before < 64 * 1024


@pytest.mark.parametrize("protocol", ERROR_OF)
def test_model_error_text_reaches_clients_without_paths(served: Served, protocol: str) -> None:
    status, message = ERROR_OF[protocol](served, "leaky", orjson.dumps(GOOD))
    assert status == 500
    assert "\n" not in message and "Traceback" not in message
    assert str(served.repo) not in message and "/1/" not in message, message
    assert "<path>/weights.bin" in message and "PermissionError: denied" in message
    assert len(message) <= MODEL_ERROR_CHARS + 32
    # The server log keeps the whole first line, path included (escaped, bounded).
    log = served.mark()
    assert f"cannot read {served.repo}/leaky/1/weights.bin\\nTraceback" in log


def test_verbose_errors_sends_the_whole_text(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _write_leaky(repo)
    try:
        with run_server(repo, verbose_errors=True) as server, server.client() as http:
            r = http.post("/v2/models/leaky/infer", content=orjson.dumps(GOOD))
            assert r.status_code == 500
            message = r.json()["error"]
            assert f"{repo}/leaky/1/weights.bin\nTraceback" in message
            assert message.endswith("z" * 100_000)
    finally:
        error_text.set_verbose(False)  # process-wide: the next server in this process


def test_verbose_errors_is_a_flag_and_a_variable() -> None:
    # INFERD_VERBOSE_ERRORS comes with it (tests/unit/cli/test_cli_env.py walks every option).
    parser = build_parser()
    assert "--verbose-errors" in serve_parser(parser).format_help()
    assert settings_from(parser.parse_args(["serve", "--verbose-errors"])).verbose_errors
    assert not settings_from(parser.parse_args(["serve"])).verbose_errors
