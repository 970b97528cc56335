"""`GET /docs`: Swagger UI over the server's OpenAPI document (`/v2/openapi.json`), to read
the API and try each model from a browser (docs/openapi.md).

Swagger UI's files come from the `swagger-ui-bundle-v2` package (PyPI), served from this
server: the page loads nothing from elsewhere, and its Content-Security-Policy says so, so
it works offline. Each file is read once, off the event loop, on its first request. The
page's own script only points Swagger UI at the document, relative to the page, so it
works behind a path prefix too. `--docs-ui off` turns the page off.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import swagger_ui_bundle

from inferd.errors import not_found

# The page's files: name -> media type (Swagger UI's, and the page's own script).
ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "inferd-docs.js": "text/javascript; charset=utf-8",
}
# Swagger UI draws its icons as data: URIs and sets inline styles; nothing leaves the server.
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "object-src 'none'; frame-ancestors 'self'; base-uri 'self'"
)

PAGE = b"""<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <title>inferd API</title>
    <link rel="stylesheet" href="docs/swagger-ui.css">
    <link rel="icon" type="image/png" href="docs/favicon-32x32.png">
  </head>
  <body>
    <div id="swagger-ui"></div>
    <script src="docs/swagger-ui-bundle.js"></script>
    <script src="docs/inferd-docs.js"></script>
  </body>
</html>
"""

INITIALIZER = b"""window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: new URL("v2/openapi.json", window.location.href).href,
    dom_id: "#swagger-ui",
    deepLinking: true,
    displayRequestDuration: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
"""


class DocsPage:
    """The page and its files, each read once."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (
            Path(str(swagger_ui_bundle.swagger_ui_path)) if directory is None else directory
        )
        self._files: dict[str, bytes] = {"inferd-docs.js": INITIALIZER}

    async def asset(self, name: str) -> tuple[bytes, str]:
        """(its bytes, its media type); 404 for any other name."""
        media = ASSETS.get(name)
        if media is None:
            raise not_found(f"no file '{name[:100]}' on the docs page; it has {', '.join(ASSETS)}")
        data = self._files.get(name)
        if data is None:
            data = await asyncio.to_thread((self.directory / name).read_bytes)
            self._files[name] = data
        return data, media
