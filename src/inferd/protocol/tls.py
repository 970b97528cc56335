"""TLS for the HTTP and gRPC endpoints, from PEM files (`--tls-cert`, `--tls-key`,
`--tls-client-ca`; Triton's `--grpc-server-cert` etc. for gRPC alone).

The files are read and checked when the server is built, so a wrong path or a key that
does not match its certificate stops the start with a message naming the option, rather
than failing every handshake later.
"""

from __future__ import annotations

import ssl
from typing import Any

import grpc

from inferd.settings import TlsFiles


class TlsError(ValueError):
    """TLS files that cannot be used; the message names the option and the file."""


def check(tls: TlsFiles, what: str) -> None:
    """Load the files the way the endpoints will (raises TlsError naming `what`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    for path in (tls.cert, tls.key, tls.client_ca):
        if path is not None and not path.is_file():
            raise TlsError(f"{what}: {path} is not a readable file")
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(
            f"{what}: certificate {tls.cert} and key {tls.key} cannot be used together: {exc}"
        ) from None
    if tls.client_ca is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise TlsError(f"{what}: client CA {tls.client_ca} cannot be read: {exc}") from None


def uvicorn_options(tls: TlsFiles | None) -> dict[str, Any]:
    """uvicorn.Config's ssl_* arguments (none: plain HTTP)."""
    if tls is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.client_ca is not None:
        options["ssl_ca_certs"] = str(tls.client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def grpc_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=None if tls.client_ca is None else tls.client_ca.read_bytes(),
        require_client_auth=tls.client_ca is not None,
    )
