"""The calls `inferd tune` makes to the server's HTTP API: the model's config, and loads of a
candidate config through the repository API (with the admin token when one is set)."""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import orjson

from inferd.public import ADMIN_TOKEN_ENV
from inferd_tools.tune.errors import TuneError


class RepositoryApi:
    """The model config and repository load calls, over HTTP."""

    def __init__(self, url: str, model: str, load_timeout_s: float) -> None:
        self.url = url
        self.model = model
        self.load_timeout_s = load_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RepositoryApi:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.load_timeout_s)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self._session is not None
        data = None if body is None else orjson.dumps(body)
        headers = {} if body is None else {"content-type": "application/json"}
        if token := os.environ.get(ADMIN_TOKEN_ENV, "").strip():  # a server with an admin token
            headers["authorization"] = f"Bearer {token}"
        try:
            async with self._session.request(
                method, self.url + path, data=data, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TuneError(f"cannot reach the server at {self.url}: {e or type(e)}") from None
        try:
            doc = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            doc = {"error": raw[:300].decode(errors="replace")}
        return status, doc

    async def config(self, model: str = "") -> dict[str, Any]:
        """The config as served of the tuned model, or of `model`."""
        model = model or self.model
        status, doc = await self._call("GET", f"/v2/models/{model}/config")
        if status != 200 or not isinstance(doc, dict):
            raise TuneError(f"model {model!r}: GET config answered {status}: {error_text(doc)}")
        return doc

    async def load(self, config: dict[str, Any]) -> tuple[int, str]:
        """(status, error message); status 200 is success."""
        body = {"parameters": {"config": orjson.dumps(config).decode()}}
        status, doc = await self._call("POST", f"/v2/repository/models/{self.model}/load", body)
        return status, "" if status == 200 else error_text(doc)


def error_text(doc: Any) -> str:
    if isinstance(doc, dict) and "error" in doc:
        return str(doc["error"])
    return str(doc)
