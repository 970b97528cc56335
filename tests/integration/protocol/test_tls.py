"""TLS and mTLS on both endpoints, with Triton's clients over TLS and certificates made here
(a throwaway CA: tests/support/security.py). One table: protocol x (TLS | mTLS) x client cert."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from inferd.settings import TlsFiles
from tests.support.lifecycle_models import write_plus_model
from tests.support.security import Pki, write_pki
from tests.support.servers import RunningServer, run_server

PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_servers(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[dict[str, Any]]:
    """'tls': server certificate only; 'mtls': clients must present one the CA signed."""
    repo = tmp_path_factory.mktemp("tls_repo")
    write_plus_model(repo, "first", [1])
    plain = TlsFiles(pki.server_cert, pki.server_key)
    mutual = TlsFiles(pki.server_cert, pki.server_key, pki.ca)
    with (
        run_server(repo, http_tls=plain, grpc_tls=plain) as tls,
        run_server(repo, http_tls=mutual, grpc_tls=mutual) as mtls,
    ):
        yield {"tls": tls, "mtls": mtls}


def tls_client(protocol: str, server: RunningServer, pki: Pki, client_cert: bool) -> Any:
    if protocol == "http":
        options: dict[str, str] = {"ca_certs": str(pki.ca)}
        if client_cert:
            options |= {"certfile": str(pki.client_cert), "keyfile": str(pki.client_key)}
        return httpclient.InferenceServerClient(
            f"127.0.0.1:{server.port}", ssl=True, ssl_options=options
        )
    extra = (
        {"private_key": str(pki.client_key), "certificate_chain": str(pki.client_cert)}
        if client_cert
        else {}
    )
    return grpcclient.InferenceServerClient(
        server.grpc_address, ssl=True, root_certificates=str(pki.ca), **extra
    )


def infer_plus(client: Any, protocol: str) -> np.ndarray:
    mod: Any = httpclient if protocol == "http" else grpcclient
    inp = mod.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((2, 4), np.float32))
    return client.infer("first", [inp]).as_numpy("y")  # type: ignore[no-any-return]


# (server, the client presents a certificate, the call succeeds)
CASES = [("tls", False, True), ("tls", True, True), ("mtls", True, True), ("mtls", False, False)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("mode", "client_cert", "served"), CASES)
def test_tritonclient_over_tls(
    tls_servers: dict[str, RunningServer],
    pki: Pki,
    protocol: str,
    mode: str,
    client_cert: bool,
    served: bool,
) -> None:
    client = tls_client(protocol, tls_servers[mode], pki, client_cert)
    try:
        if served:
            assert client.is_server_ready()
            np.testing.assert_array_equal(infer_plus(client, protocol), np.ones((2, 4), np.float32))
        else:  # no certificate, no call: the server ends the handshake (TLS 1.3: after
            # the client's side of it completed, so the client sees the connection close)
            refused = (InferenceServerException, ssl.SSLError, HTTPConnectionClosed)
            with pytest.raises(refused) as info:
                client.is_server_ready()
            if protocol == "grpc":
                assert info.value.status() == "StatusCode.UNAVAILABLE"  # type: ignore[union-attr]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_plaintext_client_is_not_served(
    tls_servers: dict[str, RunningServer], protocol: str
) -> None:
    server = tls_servers["tls"]
    if protocol == "http":
        with server.client() as c, pytest.raises(httpx.TransportError):
            c.get("/v2/health/ready")  # plain HTTP to the TLS port: the connection drops
        return
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        with pytest.raises(InferenceServerException) as grpc_info:
            client.is_server_ready(client_timeout=10)
        assert grpc_info.value.status() in (
            "StatusCode.UNAVAILABLE",
            "StatusCode.DEADLINE_EXCEEDED",
        )
    finally:
        client.close()


def test_a_client_trusting_another_ca_refuses_the_server(
    tls_servers: dict[str, RunningServer], tmp_path: Path, pki: Pki
) -> None:
    other = write_pki(tmp_path / "other")
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{tls_servers['tls'].port}", ssl=True, ssl_options={"ca_certs": str(other.ca)}
    )
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            client.is_server_ready()
    finally:
        client.close()
