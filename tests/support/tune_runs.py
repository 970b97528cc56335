"""What the tune tests share: `inferd tune`'s arguments, and a model's config as the server
serves it (what tune reads as the original)."""

from __future__ import annotations

import argparse
from typing import Any

from inferd_tools.tune.main import add_tune_parser
from tests.support.servers import RunningServer


def tune_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferd")
    add_tune_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["tune", *argv])


def served_config(server: RunningServer, model: str) -> dict[str, Any]:
    """`GET /v2/models/{model}/config` without the `model_checksum` inferd adds."""
    with server.client() as c:
        response = c.get(f"/v2/models/{model}/config")
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    doc.get("parameters", {}).pop("model_checksum", None)
    return doc
