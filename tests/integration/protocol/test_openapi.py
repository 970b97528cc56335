"""`GET /v2/openapi.json` (docs/openapi.md): a valid OpenAPI 3.1 document of what this server
serves as configured, each listed route served, restricted routes marked with their
security schemes, each model's request generated from its config (its example accepted),
the document following loads and unloads, and `inferd serve --print-openapi`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from tests.support.security import ADMIN_TOKEN, AUTH
from tests.support.servers import RunningServer, run_server

STATS_KEY = {"stats-key": "stats-secret-1"}
CREDENTIALS = {**AUTH, **STATS_KEY}
SUBSTITUTES = {"model": "mlp", "version": "1", "region": "nowhere", "asset": "swagger-ui.css"}


@pytest.fixture(scope="module")
def examples(example_repository: Path) -> Iterator[RunningServer]:
    """The example repository with the repository API on and credentials set."""
    with run_server(
        example_repository,
        admin_api=True,
        admin_token=ADMIN_TOKEN,
        http_restricted_api=(f"statistics:stats-key={STATS_KEY['stats-key']}",),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def plain(good_repository: Path) -> Iterator[RunningServer]:
    """Every datatype's model, with the defaults: no admin API, no credential."""
    with run_server(good_repository) as running:
        yield running


def document(server: RunningServer) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v2/openapi.json", headers=CREDENTIALS, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    doc: dict[str, Any] = r.json()
    return doc


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            yield path, method.upper(), op


@pytest.mark.parametrize("which", ["examples", "plain"])
def test_the_document_validates_against_the_openapi_31_meta_schema(
    which: str, request: pytest.FixtureRequest
) -> None:
    doc = document(request.getfixturevalue(which))
    assert doc["openapi"] == "3.1.0"
    validate(doc)  # openapi-spec-validator: the OpenAPI 3.1 meta-schema and its rules


@pytest.mark.parametrize("which", ["examples", "plain"])
def test_every_route_it_lists_is_served(which: str, request: pytest.FixtureRequest) -> None:
    """Each path and method answers from its route, never Starlette's 404 (no route) or 405
    (no such method): a failure there is the route's own error body."""
    server: RunningServer = request.getfixturevalue(which)
    doc = document(server)
    missing = []
    with server.client(headers=CREDENTIALS) as client:
        for path, method, op in operations(doc):
            if op["operationId"] in ("unload_model", "system_shared_memory_register"):
                continue  # served (see the stateful test), but it would change the server
            url = re.sub(r"\{(\w+)\}", lambda m: SUBSTITUTES[m.group(1)], path)
            body = b"{}" if method == "POST" else None
            r = client.request(method, url, content=body)
            text = (
                r.text if r.headers.get("content-type", "").startswith("application/json") else ""
            )
            if r.status_code == 405 or text.startswith('{"error":"Not Found:'):
                missing.append(f"{method} {url}: {r.status_code} {text[:100]}")
            statuses = set(op["responses"])
            assert str(r.status_code) in statuses, f"{method} {url}: {r.status_code} {r.text[:200]}"
    assert not missing


def test_admin_routes_are_listed_only_when_the_admin_api_is_on(
    examples: RunningServer, plain: RunningServer
) -> None:
    on, off = document(examples)["paths"], document(plain)["paths"]
    admin = "/v2/repository/models/{model}/load"
    assert "post" in on[admin] and admin not in off
    assert "post" in on["/v2/logging"] and set(off["/v2/logging"]) == {"get"}
    assert "post" in on["/v2/models/{model}/routing/promote"]
    assert "/v2/models/{model}/routing/promote" not in off
    # Served as configured: the refusal a listed-off route gives says how to turn it on.
    r = httpx.post(f"{plain.url}{admin.replace('{model}', 'mlp')}", timeout=30)
    assert r.status_code == 403 and "--admin-api on" in r.json()["error"]


def test_restricted_routes_carry_their_security_schemes(
    examples: RunningServer, plain: RunningServer
) -> None:
    doc = document(examples)
    schemes = doc["components"]["securitySchemes"]
    assert schemes["admin_token"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["admin_token"]["description"],
    }
    assert schemes["header.stats-key"]["in"] == "header"
    assert schemes["header.stats-key"]["name"] == "stats-key"
    assert ADMIN_TOKEN not in json.dumps(doc) and STATS_KEY["stats-key"] not in json.dumps(doc)
    paths = doc["paths"]
    load = paths["/v2/repository/models/{model}/load"]["post"]
    assert load["security"] == [{"admin_token": []}]
    assert "401" in load["responses"]
    assert paths["/v2/models/stats"]["get"]["security"] == [{"header.stats-key": []}]
    ready = paths["/v2/health/ready"]["get"]
    assert "security" not in ready and "401" not in ready["responses"]
    # Without credentials configured, nothing is marked.
    assert "securitySchemes" not in document(plain)["components"]
    # And the marking is the truth: without the credential the call is refused.
    r = httpx.get(f"{examples.url}/v2/models/stats", timeout=30)
    assert r.status_code == 401 and "stats-key" in r.json()["error"]


def _model_operations(doc: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Model name -> (its path, its operation): the per-model ones, by their tag."""
    found = {}
    for path, _, op in operations(doc):
        tag = op["tags"][0]
        if tag.startswith("model: "):
            found[tag.removeprefix("model: ")] = (path, op)
    return found


@pytest.mark.parametrize("which", ["examples", "plain"])
def test_each_models_request_comes_from_its_config_and_its_example_is_accepted(
    which: str, request: pytest.FixtureRequest
) -> None:
    server: RunningServer = request.getfixturevalue(which)
    doc = document(server)
    models = _model_operations(doc)
    index = httpx.post(
        f"{server.url}/v2/repository/index", json={"ready": True}, headers=CREDENTIALS, timeout=30
    )
    assert set(models) == {row["name"] for row in index.json()}
    for name, (path, op) in models.items():
        media = op["requestBody"]["content"]["application/json"]
        example = media["example"]
        # The schema with the document's components beside it, where its $refs point.
        schema = {**media["schema"], "components": doc["components"]}
        jsonschema.Draft202012Validator(schema).validate(example)
        r = httpx.post(f"{server.url}{path}", json=example, headers=CREDENTIALS, timeout=60)
        assert r.status_code == 200, f"{name}: {r.status_code} {r.text[:300]}"
    # What the schema says of one model, against its config (the example's MLP).
    if which == "examples":
        schema = doc["components"]["schemas"]["infer_request.mlp"]
        (entry,) = schema["properties"]["inputs"]["items"]["oneOf"]
        assert entry["properties"]["name"] == {"const": "input"}
        assert entry["properties"]["datatype"] == {"const": "FP32"}
        shape = entry["properties"]["shape"]["prefixItems"]
        assert shape == [{"type": "integer", "minimum": 1, "maximum": 32}, {"const": 64}]
        outputs = schema["properties"]["outputs"]["items"]["properties"]["name"]
        assert outputs == {"enum": ["probabilities", "label"]}
        # An ONNX model reads no parameters of its own: none but Triton's are documented.
        assert schema["properties"]["parameters"]["additionalProperties"] is False
        # A Python model reads its own: the schema says so.
        text_stats = doc["components"]["schemas"]["infer_request.text_stats"]
        assert text_stats["properties"]["parameters"]["additionalProperties"] != False  # noqa: E712


def test_the_document_follows_loads_and_unloads(examples: RunningServer) -> None:
    path = "/v2/models/text_stats/infer"
    openapi = examples.server.app.openapi
    assert openapi is not None
    before = document(examples)
    assert path in before["paths"]
    # Unchanged registry: the same bytes, not built again.
    assert openapi.json() is openapi.json()
    with examples.client(headers=AUTH) as client:
        assert client.post("/v2/repository/models/text_stats/unload").status_code == 200
        unloaded = document(examples)
        assert path not in unloaded["paths"]
        assert "infer_request.text_stats" not in unloaded["components"]["schemas"]
        assert client.post("/v2/repository/models/text_stats/load").status_code == 200
    assert document(examples) == before


def test_print_openapi_writes_the_document_without_serving(
    good_repository: Path, plain: RunningServer
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(good_repository),
         "--http-port", str(plain.port), "--print-openapi"],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    # The port is the running server's: printing does not try to bind it.
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    printed = json.loads(result.stdout)
    validate(printed)
    assert printed == document(plain)
