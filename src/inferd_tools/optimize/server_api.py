"""The server calls publishing needs, over inferd's HTTP API: does the server serve the
model, has it loaded the published version (ready, with the recorded checksum), and the
canary weights (`POST /v2/models/{m}/routing`, with the admin token as `inferd tune` sends it).

Plain blocking HTTP (urllib): a handful of calls from a command-line tool, no event loop.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from inferd.public import ADMIN_TOKEN_ENV
from inferd_tools.optimize.errors import OptimizeError, PublishError

POLL_S = 0.2  # between two looks at the server while it loads the new version


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url if "://" in url else f"http://{url}"


class ServerApi:
    def __init__(self, url: str, model: str) -> None:
        self.url = base_url(url)
        self.model = model

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        if token := os.environ.get(ADMIN_TOKEN_ENV, "").strip():
            headers["authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"cannot reach the server at {self.url}: {e}") from None
        try:
            doc = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            doc = {"error": raw[:200].decode(errors="replace")}
        return status, doc

    def check(self, routing: bool) -> None:
        """Before any work: the server is up, serves the model, and (for a canary) lets us
        read its routing, an admin call: a missing token fails here, not after publishing."""
        try:
            status, doc = self._call("GET", f"/v2/models/{self.model}")
            if status != 200:
                raise OptimizeError(
                    f"--server {self.url}: model '{self.model}' is not served there "
                    f"({status}: {_error(doc)})"
                )
            if not routing:
                return
            status, doc = self._call("GET", f"/v2/models/{self.model}/routing")
        except ConnectionError as e:
            raise OptimizeError(f"--server: {e}") from None
        if status == 401:
            raise OptimizeError(
                f"--server {self.url}: the routing API needs a credential ({_error(doc)}); "
                f"set {ADMIN_TOKEN_ENV} to the server's admin token"
            )
        if status == 403:
            raise OptimizeError(
                f"--server {self.url}: the routing API is off ({_error(doc)}); start the "
                "server with --admin-api on"
            )
        if status != 200:
            raise OptimizeError(f"--server {self.url}: routing answered {status}: {_error(doc)}")

    def wait_until_serving(
        self, version: int, expected: str, timeout_s: float, progress: Callable[[str], None]
    ) -> None:
        """Until version `version` is ready with checksum `expected`, or the deadline."""
        progress(f"waiting for {self.url} to serve version {version} (up to {timeout_s:g} s)")
        deadline = time.monotonic() + timeout_s
        path = f"/v2/models/{self.model}/versions/{version}"
        seen = "not ready"
        while True:
            try:
                status, _ = self._call("GET", path + "/ready")
                if status == 200:
                    status, doc = self._call("GET", path + "/config")
                    served = doc.get("parameters", {}).get("model_checksum", {})
                    seen = f"ready with checksum {served.get('string_value', '?')}"
                    if served.get("string_value") == expected:
                        return
            except ConnectionError as e:
                seen = str(e)
            if time.monotonic() > deadline:
                raise PublishError(
                    f"the server did not serve {self.model} version {version} with checksum "
                    f"{expected} within {timeout_s:g} s (last seen: {seen}); is it in poll "
                    "mode (--model-control-mode poll), and does the version load?"
                )
            time.sleep(POLL_S)

    def set_weights(self, weights: dict[str, int]) -> dict[str, Any]:
        try:
            status, doc = self._call(
                "POST", f"/v2/models/{self.model}/routing", {"weights": weights}
            )
        except ConnectionError as e:
            raise PublishError(str(e)) from None
        if status != 200:
            raise PublishError(f"setting the canary weights answered {status}: {_error(doc)}")
        return dict(doc)


def _error(doc: Any) -> str:
    return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)
