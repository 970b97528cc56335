"""What Schemathesis found against the served OpenAPI document (test_schemathesis.py,
docs/security.md), and one thing seen by hand while checking the document's routes, each
reproduced here as the request that showed it:

- a load whose `file:` parameter held text that is not ASCII (or no text at all) answered
  500: base64 decoding raised ValueError, which only binascii.Error was caught as;
- (by hand) a route asked with a method it lacks answered 405 without `Allow` (RFC 9110
  requires it), because the JSON error body replaced Starlette's answer and dropped its
  headers;
- the repository index took any `ready` (`{"ready": "no"}` listed only ready versions):
  found by Schemathesis' negative_data_rejection check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def admin_server(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, admin_api=True, model_upload="files") as running:
        yield running


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("\u00a5\u00b6", "parameter 'file:1/model.onnx' must be base64"),
        ("!!!!", "parameter 'file:1/model.onnx' must be base64"),
        ({"nested": 1}, "parameter 'file:1/model.onnx' must be a base64 string"),
        (17, "parameter 'file:1/model.onnx' must be a base64 string"),
    ],
)
def test_a_file_parameter_that_is_not_base64_text_is_a_400(
    admin_server: RunningServer, value: Any, message: str
) -> None:
    body = {"parameters": {"config": "{}", "file:1/model.onnx": value}}
    r = httpx.post(f"{admin_server.url}/v2/repository/models/upload/load", json=body, timeout=30)
    assert (r.status_code, r.json()) == (400, {"error": message})
    index = httpx.post(f"{admin_server.url}/v2/repository/index", timeout=30).json()
    assert "upload" not in {row["name"] for row in index}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v2/models/mlp/ready", {"GET"}),
        ("PUT", "/v2/models/mlp/routing", {"GET", "POST"}),
        ("GET", "/v2/repository/models/mlp/load", {"POST"}),
    ],
)
def test_a_method_a_route_lacks_is_a_405_naming_the_allowed_ones(
    admin_server: RunningServer, method: str, path: str, allowed: set[str]
) -> None:
    r = httpx.request(method, f"{admin_server.url}{path}", timeout=30)
    assert r.status_code == 405
    assert r.json() == {"error": f"Method Not Allowed: {method} {path}"}
    assert {m.strip() for m in r.headers["allow"].split(",")} >= allowed


@pytest.mark.parametrize("ready", [{}, "no", 1, None])
def test_the_repository_index_takes_ready_as_a_boolean_only(
    admin_server: RunningServer, ready: Any
) -> None:
    """`{"ready": "no"}` listed only the ready versions (bool("no") is True)."""
    r = httpx.post(f"{admin_server.url}/v2/repository/index", json={"ready": ready}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"].startswith("'ready' must be true or false, got ")
