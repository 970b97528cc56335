"""The log settings API (Triton's logging extension) over HTTP and gRPC with tritonclient's
`update_log_settings` / `get_log_settings`, against `inferd serve` as a process: each
change is checked in the log it writes (the request log's lines appear or disappear).

Lines are found by request id. A line that must be absent is checked after a later
request's line has appeared: the server writes a request's line before it answers, in
order, so the later line proves the earlier one would have been there."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.models import write_counter
from tests.support.servers import CliServer, RunningServer, free_port, run_cli_server, run_server

PROTOCOLS = ["http", "grpc"]
LOG_DEADLINE_S = 30.0
# What `--log-level WARNING --log-format text` starts with.
START = {
    "log_file": "",
    "log_info": False,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "text",
}


# A model that logs what it saw at DEBUG, inferd's verbose level.
CHATTY_PY = """
import logging

class Model:
    def load(self, context):
        self.log = logging.getLogger("inferd.model.chatty")

    def predict(self, inputs):
        x = inputs["IN"]
        self.log.debug("chatty saw %s", int(x.ravel()[0]))
        return {"OUT": x}
"""
CHATTY_CONFIG = """
name: "chatty"
backend: "python"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log_settings_repo")
    write_counter(path, "counter")
    (path / "chatty" / "1").mkdir(parents=True)
    (path / "chatty" / "config.pbtxt").write_text(CHATTY_CONFIG)
    (path / "chatty" / "1" / "model.py").write_text(CHATTY_PY)
    return path


@pytest.fixture(scope="module")
def cli(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CliServer, int]]:
    grpc_port = free_port()
    log_path = tmp_path_factory.mktemp("log_settings_log") / "inferd.log"
    args = ["--grpc-port", str(grpc_port), "--admin-api", "on", "--log-level", "WARNING"]
    # Every successful request gets a line, so the line's presence follows the settings.
    with run_cli_server(repo, log_path, *args, "--log-sample-rate", "1") as server:
        yield server, grpc_port


class Client:
    def __init__(self, protocol: str, http_url: str, grpc_port: int) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = (
            http_url.removeprefix("http://") if protocol == "http" else f"127.0.0.1:{grpc_port}"
        )
        self.raw = self.mod.InferenceServerClient(address)
        self.sent = 0

    def _plain(self, answer: Any) -> dict[str, Any]:
        if self.protocol == "http":
            return dict(answer)
        return {k: next(iter(v.values())) for k, v in answer["settings"].items()}

    def get(self) -> dict[str, Any]:
        if self.protocol == "http":
            return self._plain(self.raw.get_log_settings())
        return self._plain(self.raw.get_log_settings(as_json=True))

    def update(self, settings: dict[str, Any]) -> dict[str, Any]:
        if self.protocol == "http":
            return self._plain(self.raw.update_log_settings(settings))
        return self._plain(self.raw.update_log_settings(settings, as_json=True))

    def chatty(self, value: int) -> None:
        inp = self.mod.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
        self.raw.infer("chatty", [inp])

    def request(self, ok: bool = True) -> str:
        """One request with a fresh id: a success (an INFO line) or a failure (a WARNING
        line: INT32 data for the FP32 input). Returns the id."""
        self.sent += 1
        request_id = f"{self.protocol}-{time.monotonic_ns()}-{self.sent}"
        dtype, datatype = (np.float32, "FP32") if ok else (np.int32, "INT32")
        inp = self.mod.InferInput("IN", [1, 2], datatype)
        inp.set_data_from_numpy(np.ones((1, 2), dtype))
        if ok:
            self.raw.infer("counter", [inp], request_id=request_id)
        else:
            with pytest.raises(InferenceServerException):
                self.raw.infer("counter", [inp], request_id=request_id)
        return request_id


def line_of(server: CliServer, request_id: str) -> str:
    """The log line of request `request_id`, waited for up to LOG_DEADLINE_S."""
    deadline = time.monotonic() + LOG_DEADLINE_S
    while True:
        for line in server.output().splitlines():
            if request_id in line:
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no log line for request {request_id}:\n{server.output()}")
        time.sleep(0.02)


def has_line(server: CliServer, request_id: str) -> bool:
    return request_id in server.output()


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, cli: tuple[CliServer, int]) -> Iterator[Client]:
    server, grpc_port = cli
    c = Client(request.param, server.url, grpc_port)
    assert c.update({k: v for k, v in START.items() if k != "log_file"}) == START
    yield c
    c.raw.close()


def test_starts_from_the_command_line_options(client: Client, cli: tuple[CliServer, int]) -> None:
    server = cli[0]
    assert client.get() == START
    quiet = client.request()  # INFO: not written at --log-level WARNING
    failed = client.request(ok=False)  # WARNING: written
    assert "failed (invalid_input)" in line_of(server, failed)
    assert not has_line(server, quiet)


def test_log_info_makes_request_lines_appear_and_disappear(
    client: Client, cli: tuple[CliServer, int]
) -> None:
    server = cli[0]
    assert client.update({"log_info": True}) == {**START, "log_info": True}
    shown = client.request()
    assert "success" in line_of(server, shown)
    client.update({"log_info": False})
    hidden = client.request()
    marker = client.request(ok=False)
    line_of(server, marker)
    assert not has_line(server, hidden)


def test_warnings_off_while_info_stays_on(client: Client, cli: tuple[CliServer, int]) -> None:
    """Not a threshold: WARNING lines go, INFO lines stay (the handler's filter)."""
    server = cli[0]
    answer = client.update({"log_info": True, "log_warning": False})
    assert (answer["log_info"], answer["log_warning"], answer["log_error"]) == (True, False, True)
    hidden = client.request(ok=False)
    marker = client.request()
    line_of(server, marker)
    assert not has_line(server, hidden)


def test_log_format_json_from_the_next_line(client: Client, cli: tuple[CliServer, int]) -> None:
    server = cli[0]
    assert client.update({"log_format": "json"})["log_format"] == "json"
    try:
        doc = json.loads(line_of(server, client.request(ok=False)))
    finally:
        client.update({"log_format": "text"})
    assert doc["level"] == "WARNING" and doc["logger"] == "inferd.requests"
    assert doc["reason"] == "invalid_input"
    text = line_of(server, client.request(ok=False))
    assert text[0].isdigit() and " WARNING " in text  # HH:MM:SS LEVEL ...


def test_verbose_level_turns_debug_lines_on(client: Client, cli: tuple[CliServer, int]) -> None:
    server = cli[0]
    base = 1000 if client.protocol == "http" else 2000
    client.chatty(base + 1)  # DEBUG: not written at verbose level 0
    line_of(server, client.request(ok=False))
    assert f"chatty saw {base + 1}" not in server.output()
    assert client.update({"log_verbose_level": 1})["log_verbose_level"] == 1
    try:
        client.chatty(base + 2)
        line_of(server, f"chatty saw {base + 2}")
    finally:
        assert client.update({"log_verbose_level": 0})["log_verbose_level"] == 0


# (id, settings, words in the message)
REFUSED = [
    ("log_file", {"log_file": "/tmp/inferd.log"}, ["'log_file'", "stderr"]),
    ("ISO8601", {"log_format": "ISO8601"}, ["'log_format'", "text or json", "ISO8601"]),
    ("unknown setting", {"log_colour": True}, ["unknown log setting 'log_colour'"]),
    # All or nothing: log_info is not switched on beside the refused log_file.
    ("a valid one beside", {"log_info": True, "log_file": "x"}, ["'log_file'"]),
]


@pytest.mark.parametrize(
    ("settings", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_settings_inferd_cannot_honour_are_refused(
    client: Client, settings: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.update(settings)
    expected = "400" if client.protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert info.value.status() == expected, info.value.message()
    for word in words:
        assert word in info.value.message()
    assert client.get() == START


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_info": "yes"}, "log setting 'log_info' must be true or false, got 'yes'"),
        ({"log_verbose_level": "2"}, "'log_verbose_level' must be an integer >= 0, got '2'"),
        ({"log_verbose_level": -1}, "'log_verbose_level' must be an integer >= 0, got -1"),
        ({"log_verbose_level": True}, "'log_verbose_level' must be an integer >= 0, got True"),
    ],
)
def test_json_values_of_the_wrong_type(
    cli: tuple[CliServer, int], settings: dict[str, Any], message: str
) -> None:
    """Types tritonclient's gRPC client cannot even send (it types each setting)."""
    r = httpx.post(f"{cli[0].url}/v2/logging", json=settings, timeout=30)
    assert r.status_code == 400
    assert message in r.json()["error"]


@pytest.fixture(scope="module")
def embedded(repo: Path) -> Iterator[RunningServer]:
    """inferd inside another program (this test process): the host owns the handlers."""
    with run_server(repo, admin_api=True) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_embedded_inferd_refuses_what_only_its_own_handler_can_do(
    embedded: RunningServer, protocol: str
) -> None:
    c = Client(protocol, embedded.url, embedded.server.grpc_port or 0)
    try:
        for settings, word in (
            ({"log_format": "json"}, "'log_format' cannot be changed"),
            ({"log_info": True, "log_warning": False}, "only a threshold"),
        ):
            with pytest.raises(InferenceServerException) as info:
                c.update(settings)
            assert word in info.value.message()
    finally:
        c.raw.close()
