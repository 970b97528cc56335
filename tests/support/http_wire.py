"""Raw HTTP for the wire tests: a request written byte for byte, and its response read back."""

from __future__ import annotations

import socket
from typing import Protocol

import orjson


def infer_request(values: list[float], *, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
            ]
        }
    )
    return (
        b"POST /v2/models/identity_fp32/infer HTTP/" + version + b"\r\nhost: test\r\n"
        b"content-type: application/json\r\n" + extra + b"content-length: %d\r\n\r\n" % len(body)
    ) + body


class Listening(Protocol):
    @property
    def port(self) -> int: ...  # on 127.0.0.1


class Wire:
    """A raw connection that reads responses one at a time (content-length framed)."""

    def __init__(self, server: Listening) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), "connection closed before a response"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert self._fill(), "connection closed inside a body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        # Well inside uvicorn's keep-alive timeout (5 s), which would close it anyway.
        self.sock.settimeout(1)
        return not self.buffer and not self._fill()

    def close(self) -> None:
        self.sock.close()


def outputs(body: bytes) -> list[float]:
    return list(orjson.loads(body)["outputs"][0]["data"])
