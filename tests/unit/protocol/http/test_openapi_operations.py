"""The OpenAPI document's route table against the HTTP adapter's (they cannot drift apart),
features turned off leaving their routes out, and the document built once per registry
change (protocol/http/openapi_document.py)."""

from __future__ import annotations

from pathlib import Path

from inferd.dataplane.plane import DataPlane, PlaneOptions
from inferd.events import Telemetry
from inferd.protocol.http.openapi_operations import OPERATIONS
from inferd.protocol.http.routes import HttpAdapter
from inferd.repository.registry import ModelRegistry


def adapter(
    tmp_path: Path, *, admin: bool = True, processes: int = 1, docs: bool = True
) -> HttpAdapter:
    registry = ModelRegistry(tmp_path)
    plane = DataPlane(registry, Telemetry(), PlaneOptions(admin_api=admin, processes=processes))
    http = HttpAdapter(plane, 1 << 20, docs_ui=docs)
    http.routes()
    return http


def test_every_route_served_has_its_entry_and_every_entry_is_served(tmp_path: Path) -> None:
    served = {(m, path) for path, methods, _ in adapter(tmp_path).openapi.served for m in methods}
    assert served == set(OPERATIONS)
    ids = [op.operation_id for op in OPERATIONS.values()]
    assert len(ids) == len(set(ids)), "operation ids are unique"


def test_with_every_feature_on_every_route_is_listed(tmp_path: Path) -> None:
    doc = adapter(tmp_path).openapi.document()
    listed = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert listed == set(OPERATIONS)


def test_features_that_are_off_leave_their_routes_out(tmp_path: Path) -> None:
    doc = adapter(tmp_path, admin=False, processes=2, docs=False).openapi.document()
    listed = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    off = {key for key, op in OPERATIONS.items() if op.needs}
    page = {("GET", "/docs"), ("GET", "/docs/{asset}")}
    assert off and listed == set(OPERATIONS) - off - page
    assert ("GET", "/v2/logging") in listed and ("POST", "/v2/logging") not in listed


def test_the_document_is_built_again_only_when_the_registry_changes(tmp_path: Path) -> None:
    http = adapter(tmp_path)
    first = http.openapi.json()
    assert http.openapi.json() is first
    http.dp.registry.generation += 1  # what each load, unload and reroute does
    again = http.openapi.json()
    assert again is not first and again == first
