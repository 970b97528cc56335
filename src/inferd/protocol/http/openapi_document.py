"""`GET /v2/openapi.json`: an OpenAPI 3.1 document of the HTTP routes this server serves,
as configured, and of each loaded model's own request (docs/openapi.md).

The routes come from the HTTP adapter's own table (routes.py), what each takes and answers
from openapi_operations.py, the bodies' schemas from openapi_schemas.py, and each model's
request from openapi_models.py. Routes that exist only with a feature on are listed only
then: the repository API and changes to the trace and log settings with the admin API, the
shared-memory registration in a server of one process. A restricted API group's routes
carry its security schemes (dataplane/access.py): an API key in the header its restriction
names, and the admin token as a bearer token.

The document is built on request from the registry's models, and kept until the registry
changes (its `generation` counter): nothing of it runs on the request path.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

import orjson

from inferd import __version__
from inferd.dataplane.access import AccessPolicy, ApiGroup
from inferd.protocol.http import openapi_operations as ops
from inferd.protocol.http.openapi_models import ModelRequest, component_key, model_request
from inferd.protocol.http.openapi_schemas import SCHEMAS, Schema, ref
from inferd.repository.registry import ModelRegistry

OPENAPI_PATH = "/v2/openapi.json"
_PARAMETER = re.compile(r"\{([a-z]+)\}")
_PATH_PARAMETERS = {
    "model": "the model's name",
    "version": "the model's version (a number)",
    "region": "the shared-memory region's name",
    "asset": "one of the page's files",
}
ADMIN_TOKEN_SCHEME = "admin_token"

# A route of the HTTP adapter: (path, methods, its API group).
ServedRoute = tuple[str, Sequence[str], ApiGroup]


class OpenApiDocument:
    """The document of one server: its routes (`served`, from the HTTP adapter), its
    features (`admin_api`, `shared_memory`), its credentials (`access`) and its models (the
    `registry`, read when the document is asked for)."""

    def __init__(
        self,
        registry: ModelRegistry,
        access: AccessPolicy,
        served: Sequence[ServedRoute],
        *,
        admin_api: bool,
        shared_memory: bool,
        assets: Sequence[str] = (),
    ) -> None:
        self.registry = registry
        self.access = access
        self.served = list(served)
        self.admin_api = admin_api
        self.shared_memory = shared_memory
        self.assets = list(assets)  # the docs page's files (docs_page.py), when it is on
        self._cached: tuple[int, bytes] | None = None

    def json(self) -> bytes:
        """The document as JSON, rebuilt only after the registry changed."""
        generation = self.registry.generation
        if self._cached is None or self._cached[0] != generation:
            self._cached = (generation, orjson.dumps(self.document()))
        return self._cached[1]

    def document(self) -> dict[str, Any]:
        schemas: dict[str, Schema] = dict(SCHEMAS)
        paths: dict[str, dict[str, Any]] = {}
        for path, methods, group in self.served:
            for method in methods:
                op = ops.OPERATIONS[(method, path)]
                if (op.needs == "admin" and not self.admin_api) or (
                    op.needs == "shm" and not self.shared_memory
                ):
                    continue
                paths.setdefault(path, {})[method.lower()] = self._operation(path, op, group)
        for request in self.model_requests():
            kind = "generate_request" if request.decoupled else "infer_request"
            schemas[f"{kind}.{request.key}"] = request.schema
            path, item = self._model_operation(request, f"{kind}.{request.key}")
            paths[path] = {"post": item}
        document: dict[str, Any] = {
            "openapi": "3.1.0",
            "info": {
                "title": "inferd",
                "version": __version__,
                "description": "The KServe v2 inference protocol over HTTP, with Triton's "
                "extensions, as this server serves it: its routes as configured and each "
                "loaded model's own request. Where inferd answers otherwise than KServe's "
                "rest_predict_v2.yaml, the schema's description says so.",
                "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
            },
            "paths": paths,
            "components": {"schemas": schemas},
        }
        schemes = self._security_schemes()
        if schemes:
            document["components"]["securitySchemes"] = schemes
        return document

    def model_requests(self) -> list[ModelRequest]:
        """Each loaded model's request, from its newest ready version (or, none ready, its
        newest), by name."""
        taken: set[str] = set()
        requests = []
        for name in sorted(self.registry.models):
            model = self.registry.models[name]
            if not model.versions:
                continue
            mv = model.default_version() or max(
                model.versions.values(), key=lambda v: int(v.version)
            )
            requests.append(model_request(mv, component_key(name, taken)))
        return requests

    # -- operations -------------------------------------------------------------------------

    def _operation(self, path: str, op: ops.Operation, group: ApiGroup) -> dict[str, Any]:
        names = _PARAMETER.findall(path)
        item: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
        }
        if op.description:
            item["description"] = op.description
        parameters = [self._path_parameter(n) for n in names]
        parameters += [_header_parameter(h) for h in op.headers]
        if parameters:
            item["parameters"] = parameters
        if op.body is not None:
            item["requestBody"] = _body(op, ref(op.body))
        errors = set(op.errors)
        if names:
            errors.add(400)  # a path holding an encoded '/' (app.py)
        item["responses"] = self._responses(op, errors, group)
        self._secure(item, group)
        if op.operation_id in _LINKS:
            item["responses"]["200"]["links"] = _LINKS[op.operation_id]
        return item

    def _model_operation(self, request: ModelRequest, schema: str) -> tuple[str, dict[str, Any]]:
        name = urllib.parse.quote(request.name, safe="")
        base = ops.GENERATE_STREAM if request.decoupled else ops.INFER
        route = "generate_stream" if request.decoupled else "infer"
        item: dict[str, Any] = {
            "operationId": f"{route}__{request.key}",
            "summary": f"{request.name}: {'generate, streamed' if request.decoupled else 'infer'}",
            "description": f"Model '{request.name}', its request generated from its config "
            "(the example is one it accepts).",
            "tags": [f"model: {request.name}"],
            "parameters": [_header_parameter(h) for h in base.headers],
            "requestBody": {
                "required": True,
                "content": {ops.JSON: {"schema": ref(schema)}},
            },
            "responses": self._responses(base, set(base.errors), ApiGroup.INFERENCE),
        }
        if request.example is not None:
            item["requestBody"]["content"][ops.JSON]["example"] = request.example
        self._secure(item, ApiGroup.INFERENCE)
        return f"/v2/models/{name}/{route}", item

    def _responses(self, op: ops.Operation, errors: set[int], group: ApiGroup) -> dict[str, Any]:
        responses: dict[str, Any] = {}
        for status, content in sorted(op.ok.items()):
            answer: dict[str, Any] = {"description": "OK" if status == 200 else "Not ready"}
            if content:
                answer["content"] = {t: {"schema": s} for t, s in content.items()}
            if ops.BINARY in content:
                answer["headers"] = {
                    "Inference-Header-Content-Length": {
                        "description": "binary answers: the length of the JSON header",
                        "schema": {"type": "string", "pattern": "^[0-9]+$"},
                    }
                }
            responses[str(status)] = answer
        if self.access.guards("http", group):
            errors.add(401)
        for status in sorted(errors):
            answer = {
                "description": ops.ERRORS[status],
                "content": {ops.JSON: {"schema": ref("error")}},
            }
            if status == 401:
                answer["headers"] = {"WWW-Authenticate": _required_header("Bearer realm")}
            elif status == 429:
                answer["headers"] = {"Retry-After": _required_header("seconds")}
            responses.setdefault(str(status), answer)
        return responses

    def _path_parameter(self, name: str) -> dict[str, Any]:
        """A path parameter; the loaded models' names and versions as its examples."""
        parameter: dict[str, Any] = {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMETERS[name],
            "schema": {"enum": self.assets} if name == "asset" else {"type": "string"},
        }
        models = self.registry.models
        if name == "model" and models:
            parameter["examples"] = _examples(sorted(models))
        elif name == "version":
            versions = {v for m in models.values() for v in m.versions}
            if versions:
                parameter["examples"] = _examples(sorted(versions, key=int))
        return parameter

    def _secure(self, item: dict[str, Any], group: ApiGroup) -> None:
        alternatives: list[dict[str, list[str]]] = [
            {name: []} for name, _ in self._schemes_of(group)
        ]
        if alternatives:
            item["security"] = alternatives

    def _schemes_of(self, group: ApiGroup) -> list[tuple[str, dict[str, Any]]]:
        schemes = []
        for header, bearer in self.access.credentials("http", group):
            if bearer:
                schemes.append(
                    (
                        ADMIN_TOKEN_SCHEME,
                        {
                            "type": "http",
                            "scheme": "bearer",
                            "description": "the admin token (--admin-token-file / "
                            "INFERD_ADMIN_TOKEN)",
                        },
                    )
                )
            else:
                schemes.append(
                    (
                        f"header.{header}",
                        {
                            "type": "apiKey",
                            "in": "header",
                            "name": header,
                            "description": "Triton's --http-restricted-api: this header "
                            "with its value",
                        },
                    )
                )
        return schemes

    def _security_schemes(self) -> dict[str, Any]:
        schemes: dict[str, Any] = {}
        for group in ApiGroup:
            schemes.update(self._schemes_of(group))
        return schemes


def _examples(values: Sequence[str]) -> dict[str, Any]:
    return {v or "(empty)": {"value": v} for v in values}


def _required_header(what: str) -> dict[str, Any]:
    return {"required": True, "schema": {"type": "string"}, "description": what}


def _header_parameter(name: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, **ops.HEADERS[name]}


def _body(op: ops.Operation, schema: Schema) -> dict[str, Any]:
    content: dict[str, Any] = {}
    for media in op.body_types:
        if media == ops.JSON:
            content[media] = {"schema": schema, **op.extra}
        else:
            content[media] = {"schema": {"type": "string", "format": "binary"}}
    return {"required": op.body_required, "content": content}


def _model_link(operation_id: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": {"model": "$request.path.model"}}


# Stateful links (OpenAPI's): what a successful call makes possible next, for clients and
# for Schemathesis' stateful tests: load -> ready, metadata, infer -> unload -> load.
_LINKS: dict[str, dict[str, Any]] = {
    "load_model": {
        "ModelReady": _model_link("model_ready"),
        "ModelMetadata": _model_link("model_metadata"),
        "ModelConfig": _model_link("model_config"),
        "Infer": _model_link("infer"),
        "Unload": _model_link("unload_model"),
    },
    "unload_model": {"Load": _model_link("load_model"), "ModelReady": _model_link("model_ready")},
}
