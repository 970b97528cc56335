"""HTTP/1.1 on the wire for the infer route, which inferd answers below ASGI
(protocol/http/fast_path.py): pipelining, Expect: 100-continue, HTTP/1.0, chunked bodies,
oversized bodies and disconnects, over raw sockets so nothing is smoothed over by a client."""

from __future__ import annotations

import socket

import orjson

from tests.support.http_wire import Wire, infer_request, outputs
from tests.support.servers import RunningServer


def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    wire = Wire(server)
    wire.send(
        infer_request([1.0, 2.0])
        + b"GET /v2/health/live HTTP/1.1\r\nhost: test\r\n\r\n"
        + infer_request([3.0])
        + infer_request([4.0, 5.0, 6.0])
    )
    first, second, third, fourth = (wire.response() for _ in range(4))
    wire.close()
    assert (first[0], outputs(first[2])) == (200, [1.0, 2.0])
    assert second[0] == 200 and second[2] == b""
    assert (third[0], outputs(third[2])) == (200, [3.0])
    assert (fourth[0], outputs(fourth[2])) == (200, [4.0, 5.0, 6.0])


def test_keep_alive_serves_many_requests_on_one_connection(server: RunningServer) -> None:
    wire = Wire(server)
    for i in range(50):
        wire.send(infer_request([float(i)]))
        status, headers, body = wire.response()
        assert status == 200, body
        assert headers["content-type"] == "application/json"
        assert outputs(body) == [float(i)]
    wire.close()


def test_expect_100_continue_gets_its_interim_answer(server: RunningServer) -> None:
    request = infer_request([7.0], extra=b"expect: 100-continue\r\n")
    head, body = request.split(b"\r\n\r\n", 1)
    wire = Wire(server)
    wire.send(head + b"\r\n\r\n")
    while b"\r\n\r\n" not in wire.buffer:
        assert wire._fill()
    assert wire.buffer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    wire.buffer = wire.buffer[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
    wire.send(body)
    status, _, answer = wire.response()
    wire.close()
    assert (status, outputs(answer)) == (200, [7.0])


def test_http_1_0_gets_its_answer_and_the_connection_closes(server: RunningServer) -> None:
    wire = Wire(server)
    wire.send(infer_request([8.0], version=b"1.0"))
    status, headers, body = wire.response()
    assert (status, outputs(body)) == (200, [8.0])
    assert headers["connection"] == "close"
    assert wire.closed_by_server()
    wire.close()


def test_chunked_request_body(server: RunningServer) -> None:
    whole = infer_request([9.0, 10.0])
    head, body = whole.split(b"\r\n\r\n", 1)
    head = head.replace(b"content-length: %d" % len(body), b"transfer-encoding: chunked")
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]))
    wire = Wire(server)
    wire.send(head + b"\r\n\r\n" + chunks + b"0\r\n\r\n")
    status, _, answer = wire.response()
    wire.close()
    assert (status, outputs(answer)) == (200, [9.0, 10.0])


def test_a_chunked_body_over_the_limit_is_refused_as_it_passes_it(
    server: RunningServer,
) -> None:
    # The session server's limit is 1 MiB. A chunked body has no length to refuse up front:
    # the 413 comes once the bytes received pass the limit, before the body ends (it never
    # does here), and the connection closes.
    junk = b" " * (1536 << 10)
    wire = Wire(server)
    wire.send(
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: t\r\n"
        b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(junk), junk)
    )
    status, headers, body = wire.response()
    assert status == 413
    assert "request body exceeds the limit of 1048576 bytes" in orjson.loads(body)["error"]
    assert headers["connection"] == "close"
    assert wire.closed_by_server()
    wire.close()
    fresh = Wire(server)
    fresh.send(infer_request([11.0]))
    status, _, body = fresh.response()
    fresh.close()
    assert (status, outputs(body)) == (200, [11.0])


def test_a_declared_body_over_the_limit_is_refused_before_it_arrives(
    server: RunningServer,
) -> None:
    wire = Wire(server)
    wire.send(
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: t\r\n"
        b'content-length: %d\r\n\r\n{"inputs": [' % (2 << 20)
    )  # 2 MiB declared against the 1 MiB limit; almost nothing sent
    status, headers, body = wire.response()
    assert status == 413
    assert "request body of 2097152 bytes exceeds the limit of 1048576 bytes" in body.decode()
    assert headers["connection"] == "close"
    assert wire.closed_by_server()
    wire.close()


def test_malformed_and_unknown_requests_get_clear_errors(server: RunningServer) -> None:
    wire = Wire(server)
    wire.send(
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\n{oops"
    )
    status, _, body = wire.response()
    assert status == 400
    assert "malformed JSON" in orjson.loads(body)["error"]
    wire.send(infer_request([1.0]).replace(b"identity_fp32", b"no_such_model"))
    status, _, body = wire.response()
    assert status == 404
    assert "no_such_model" in orjson.loads(body)["error"]
    wire.close()


def test_client_leaving_mid_body_does_not_disturb_the_server(server: RunningServer) -> None:
    whole = infer_request([12.0])
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(whole[: len(whole) - 5])
        sock.close()
    wire = Wire(server)
    wire.send(whole)
    status, _, body = wire.response()
    wire.close()
    assert (status, outputs(body)) == (200, [12.0])
