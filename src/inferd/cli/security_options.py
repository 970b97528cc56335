"""`inferd serve`'s security options: credentials, uploads and TLS (docs/security.md).

Parsing only: the options become Settings fields; what they mean is decided in
inferd.dataplane.access, inferd.repository.uploads and inferd.protocol.tls.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferd.dataplane.access import TOKEN_ENV
from inferd.repository.uploads import UPLOAD_MODES
from inferd.settings import TlsFiles


class SecurityOptionError(ValueError):
    """Security options that contradict each other or name unreadable files."""


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def add_security_options(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("security (docs/security.md)")
    group.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="Triton's: the HTTP APIs named (health, metadata, inference, shared-memory, "
        "model-config, model-repository, statistics, trace, logging) need header KEY with "
        "VALUE, else 401 (repeatable, one group per API)",
    )
    group.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="Triton's: the gRPC methods of these APIs need metadata "
        "triton-grpc-protocol-KEY with VALUE, else UNAUTHENTICATED (repeatable)",
    )
    group.add_argument(
        "--admin-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a bearer token (first line of FILE; else the environment variable "
        f"{TOKEN_ENV}) that the admin APIs (model-repository, shared-memory, trace, "
        "logging) require over HTTP and gRPC: 'authorization: Bearer <token>'",
    )
    group.add_argument(
        "--allow-model-upload",
        nargs="?",
        const="files",
        default="off",
        choices=UPLOAD_MODES,
        help="let load's file:<path> parameters supply a model's files (into a fresh "
        "temporary directory); 'code' also allows Python files and shared libraries, which "
        "then run inside the server (needs a credential on the repository API)",
    )
    group.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS and gRPC TLS")
    group.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require client certificates signed by this CA (mTLS), on HTTP and gRPC",
    )
    group.add_argument(
        "--grpc-use-ssl",
        type=_boolean,
        default=None,
        metavar="BOOL",
        help="Triton's: true for gRPC over TLS, false for plaintext (unset: TLS when a "
        "certificate is given)",
    )
    group.add_argument(
        "--grpc-server-cert", type=Path, metavar="PEM", help="Triton's: gRPC's own certificate"
    )
    group.add_argument(
        "--grpc-server-key", type=Path, metavar="PEM", help="Triton's: gRPC's own private key"
    )
    group.add_argument(
        "--grpc-root-cert",
        type=Path,
        metavar="PEM",
        help="Triton's: require gRPC client certificates signed by this CA (mTLS)",
    )


def security_settings(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """The Settings fields of the security options (SecurityOptionError when they
    contradict each other)."""
    return {
        "http_restricted_api": tuple(args.http_restricted_api),
        "grpc_restricted_protocol": tuple(args.grpc_restricted_protocol),
        "admin_token": _admin_token(args.admin_token_file, environ),
        "model_upload": args.allow_model_upload,
        "http_tls": _http_tls(args),
        "grpc_tls": _grpc_tls(args),
    }


def _admin_token(path: Path | None, environ: Mapping[str, str]) -> str:
    """The file wins over the environment variable (a flag given says what is meant)."""
    if path is None:
        return environ.get(TOKEN_ENV, "").strip()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityOptionError(f"--admin-token-file {path}: cannot read it: {exc}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise SecurityOptionError(f"--admin-token-file {path}: its first line is empty")
    return token


def _http_tls(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise SecurityOptionError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise SecurityOptionError("--tls-cert and --tls-key go together")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)


def _grpc_tls(args: argparse.Namespace) -> TlsFiles | None:
    """Triton's gRPC options override the shared ones for gRPC; `--grpc-use-ssl=false`
    keeps gRPC in plaintext even with --tls-cert."""
    own = [args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert]
    if args.grpc_use_ssl is False:
        if any(p is not None for p in own):
            raise SecurityOptionError(
                "--grpc-server-cert, --grpc-server-key and --grpc-root-cert need "
                "--grpc-use-ssl=true (Triton would ignore them; inferd refuses)"
            )
        return None
    cert = args.grpc_server_cert or args.tls_cert
    key = args.grpc_server_key or args.tls_key
    client_ca = args.grpc_root_cert or args.tls_client_ca
    if cert is None and key is None and client_ca is None and not args.grpc_use_ssl:
        return None
    if cert is None or key is None:
        raise SecurityOptionError(
            "gRPC TLS needs a certificate and its key: --grpc-server-cert and "
            "--grpc-server-key (or --tls-cert and --tls-key)"
        )
    return TlsFiles(cert, key, client_ca)
