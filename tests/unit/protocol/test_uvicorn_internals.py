"""What inferd relies on of uvicorn's internals, checked on the installed uvicorn: each test
names the class and attribute, so an upgrade that moves one fails here, loudly, rather than
as a hang or a wrong answer somewhere in the HTTP tests.

protocol/http/parser_guard.py and protocol/http/fast_path.py subclass `HttpToolsProtocol` (its
parser
callbacks, per-connection state, keep-alive timer) and stand an object of their own where
uvicorn keeps its request/response cycle; server/build.py subclasses `uvicorn.Server` to change
its signal handling. pyproject.toml pins uvicorn below its next major version for this.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import signal
import socket
import textwrap
from typing import Any

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from inferd.protocol.http import fast_path, parser_guard

# The methods the subclasses override or call, with the parameters they pass.
PROTOCOL_METHODS = {
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "on_response_complete": [],
    "send_400_response": ["msg"],
    "handle_websocket_upgrade": [],
    "_should_upgrade": [],
    "_unsupported_upgrade_warning": [],
    "_unset_keepalive_if_required": [],
    "timeout_keep_alive_handler": [],
}
# The instance attributes they read (or set) once a request's head is in.
PROTOCOL_ATTRIBUTES = (
    "loop",
    "logger",
    "parser",
    "url",
    "headers",
    "expect_100_continue",
    "cycle",
    "limit_concurrency",
    "timeout_keep_alive",
    "timeout_keep_alive_task",
    "server_state",
    "connections",
    "tasks",
    "transport",
    "flow",
    "client",
)
# uvicorn's methods that may find fast_path's `_InferCall` where their cycle is.
READ_THE_CYCLE = (
    "on_headers_complete",
    "on_response_complete",
    "shutdown",
    "timeout_keep_alive_handler",
    "pause_writing",
    "resume_writing",
)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(("name", "parameters"), sorted(PROTOCOL_METHODS.items()))
def test_the_protocol_methods_keep_their_signatures(name: str, parameters: list[str]) -> None:
    method = getattr(HttpToolsProtocol, name, None)
    assert callable(method), f"uvicorn's HttpToolsProtocol.{name} is gone"
    found = list(inspect.signature(method).parameters)[1:]
    assert found == parameters, f"HttpToolsProtocol.{name}{tuple(found)}: expected {parameters}"


def test_a_connection_has_the_state_the_subclasses_read() -> None:
    """A real protocol on a real socket pair, fed one real request; its state seen from the
    head's callback, where fast_path routes the request."""
    seen: dict[str, Any] = {}

    class Probe(HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            seen.update({name: getattr(self, name, AttributeError) for name in PROTOCOL_ATTRIBUTES})
            seen["default_headers"] = getattr(self.server_state, "default_headers", AttributeError)
            super().on_headers_complete()
            seen["new_cycle"] = self.cycle

    async def exchange() -> bytes:
        config = Config(_app, lifespan="off", log_config=None)
        config.load()
        state = ServerState()
        state.default_headers = [(b"server", b"probe")]
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: Probe(config, state, {}), ours)
        reader, writer = await asyncio.open_connection(sock=theirs)
        writer.write(b"POST /v2/x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n")
        await writer.drain()
        answer = await reader.readuntil(b"ok")
        writer.close()
        return answer

    answer = asyncio.run(asyncio.wait_for(exchange(), 30))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\nserver: probe\r\n")  # the app answered
    for name in PROTOCOL_ATTRIBUTES:
        assert seen[name] is not AttributeError, f"HttpToolsProtocol has no attribute '{name}'"
    assert seen["url"] == b"/v2/x", "HttpToolsProtocol.url: the raw request target"
    assert (b"host", b"a") in seen["headers"], "HttpToolsProtocol.headers: lower-case pairs"
    assert seen["expect_100_continue"] is True, "HttpToolsProtocol.expect_100_continue"
    assert seen["cycle"] is None, "HttpToolsProtocol.cycle: None before the first request"
    assert seen["limit_concurrency"] is None
    assert isinstance(seen["timeout_keep_alive"], int | float)
    assert isinstance(seen["tasks"], set), "HttpToolsProtocol.tasks: the server's task set"
    assert seen["server_state"].tasks is seen["tasks"], "ServerState.tasks (shutdown waits)"
    assert isinstance(seen["connections"], set)
    assert seen["default_headers"] == [(b"server", b"probe")], "ServerState.default_headers"
    assert isinstance(seen["flow"], FlowControl)
    assert isinstance(seen["client"], tuple | type(None))
    for method in ("feed_data", "get_method", "get_http_version", "should_keep_alive"):
        assert callable(getattr(seen["parser"], method, None)), f"parser.{method}"
    for flag in ("response_complete", "keep_alive", "response_started", "disconnected"):
        assert hasattr(seen["new_cycle"], flag), f"RequestResponseCycle.{flag}"


def _head_state(protocol: type[HttpToolsProtocol], hook: str, head: bytes) -> dict[str, Any]:
    """A real connection of `protocol` fed `head`: its request state, seen from `hook` (the
    callback where the head is complete), and the ASGI scope the request was given."""
    seen: dict[str, Any] = {}

    class Probe(protocol):  # type: ignore[valid-type, misc]
        pass

    def capture(self: Any) -> None:
        seen.update(url=self.url, headers=list(self.headers), expect=self.expect_100_continue)
        getattr(protocol, hook)(self)
        seen["scope"] = {k: v for k, v in self.scope.items() if k in SCOPE_AT_BEGIN}

    setattr(Probe, hook, capture)

    async def exchange() -> None:
        config = Config(_app, lifespan="off", log_config=None)
        config.load()
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: Probe(config, ServerState(), {}), ours)
        reader, writer = await asyncio.open_connection(sock=theirs)
        writer.write(head)
        await writer.drain()
        await reader.readuntil(b"ok")
        writer.close()

    asyncio.run(asyncio.wait_for(exchange(), 30))
    return seen


# What uvicorn's on_message_begin puts in the scope (on_headers_complete adds the rest).
SCOPE_AT_BEGIN = ("type", "asgi", "http_version", "server", "client", "scheme", "root_path",
                  "headers", "state")  # fmt: skip


def test_the_callbacks_the_guard_took_over_leave_uvicorns_state() -> None:
    """parser_guard.py does what uvicorn's on_message_begin, on_url and on_header do without
    calling them, and builds the ASGI scope only for the ASGI path: the same request gives
    the same url, headers (lower-case names, values without trailing whitespace), 100-continue
    flag and scope in both."""
    head = b"POST /v2/x?q=1 HTTP/1.1\r\nHost: a\r\nX-Upper: Value \t\r\n"
    head += b"Expect: 100-Continue\r\n\r\n"
    theirs = _head_state(HttpToolsProtocol, "on_headers_complete", head)
    ours = _head_state(parser_guard.GuardedHttpProtocol, "on_request_head", head)
    pairs = [(b"host", b"a"), (b"x-upper", b"Value"), (b"expect", b"100-Continue")]
    assert theirs["headers"] == pairs
    assert theirs["expect"] is True and theirs["url"] == b"/v2/x?q=1"
    assert ours == theirs


def test_flow_control_has_what_the_infer_path_waits_on() -> None:
    assert inspect.iscoroutinefunction(FlowControl.drain), "FlowControl.drain (a coroutine)"

    async def flags() -> tuple[object, object]:
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        flow = FlowControl(transport)  # type: ignore[arg-type]
        result = (getattr(flow, "write_paused", None), getattr(flow, "read_paused", None))
        transport.close()
        theirs.close()
        return result

    assert asyncio.run(flags()) == (False, False), "FlowControl.write_paused / read_paused"


def test_uvicorn_reads_no_cycle_attribute_our_infer_call_lacks() -> None:
    """fast_path's `_InferCall` stands where uvicorn keeps its `RequestResponseCycle`:
    whatever uvicorn reads of the cycle in the methods that can meet one, it must have."""
    ours = set(fast_path._InferCall.__slots__) | {"response_started"}
    read: dict[str, set[str]] = {}
    for name in READ_THE_CYCLE:
        method = getattr(HttpToolsProtocol, name, None)
        assert method is not None, f"uvicorn's HttpToolsProtocol.{name} is gone"
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        aliases = {"cycle"}  # `self.cycle`, and locals bound to it (`existing_cycle`)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _is_self_cycle(node.value):
                aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (
                _is_self_cycle(node.value)
                or (isinstance(node.value, ast.Name) and node.value.id in aliases - {"cycle"})
            ):
                read.setdefault(node.attr, set()).add(name)
    missing = {attr: sorted(where) for attr, where in read.items() if attr not in ours}
    assert not missing, f"uvicorn reads these of the cycle, _InferCall lacks them: {missing}"
    assert "response_complete" in read  # the walk found uvicorn's reads at all


def _is_self_cycle(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "cycle"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def test_the_status_lines_are_a_dict_by_code() -> None:
    assert STATUS_LINE is httptools_impl.STATUS_LINE
    assert STATUS_LINE[429] == b"HTTP/1.1 429 Too Many Requests\r\n", "STATUS_LINE[status]"


def test_the_server_signal_handling_inferd_overrides() -> None:
    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == [
        "self",
        "sig",
        "frame",
    ], "uvicorn.Server.handle_exit(sig, frame)"
    server = uvicorn.Server(Config(_app, lifespan="off", log_config=None))
    captured = getattr(server, "_captured_signals", None)
    assert captured == [], "uvicorn.Server._captured_signals: the signals to re-raise"
    with server.capture_signals():  # a context manager, as server/build.py wraps it
        server.handle_exit(signal.SIGTERM, None)
        assert server._captured_signals == [signal.SIGTERM]
        assert server.should_exit
        server._captured_signals.clear()  # what server/build.py does: exit 0, not by the signal
