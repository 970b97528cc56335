"""`GET /docs` (docs/openapi.md): Swagger UI over the served document, driven in a real
browser: headless Chromium (Debian's `chromium` and `chromium-driver`, which
scripts/install-test-tools.sh installs; never a downloaded browser) loads the page, runs "Try
it out" on the example MLP's infer operation with its generated example, and reads the 200
and the label from the page. The page loads nothing from elsewhere; `--docs-ui off` turns it
off; the metadata API's credential guards it as it guards the document.

Without Chromium the browser test is skipped, saying why; where CI requires the test tools
(INFERD_REQUIRE_TEST_TOOLS=1, .ci/run) it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.servers import RunningServer, run_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60
META_KEY = {"meta-key": "metadata-secret-7"}


def browser_tools() -> tuple[str, str]:
    """Chromium and its driver, or a skip (a failure where CI requires them)."""
    chromium = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    driver = shutil.which("chromedriver") or (
        CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else None
    )
    if chromium is None or driver is None:
        reason = (
            "`chromium` and `chromedriver` are not installed: scripts/install-test-tools.sh "
            "installs them (Debian's chromium and chromium-driver; `make test` runs it first)"
        )
        if os.environ.get("INFERD_REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return chromium, driver


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = browser_tools()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="inferd-chromium-")
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1400,2400",
    ):  # fmt: skip
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def examples(example_repository: Path) -> Iterator[RunningServer]:
    with run_server(example_repository) as running:
        yield running


def _wait_for(browser: webdriver.Chrome, scope: Any, selector: str) -> WebElement:
    WebDriverWait(browser, WAIT_S).until(lambda _: scope.find_elements(By.CSS_SELECTOR, selector))
    element: WebElement = scope.find_element(By.CSS_SELECTOR, selector)
    return element


def test_try_it_out_runs_the_mlp_from_the_page(
    browser: webdriver.Chrome, examples: RunningServer
) -> None:
    browser.get(f"{examples.url}/docs")
    assert browser.title == "inferd API"
    # The MLP's own operation (its tag and id come from the model's name).
    operation = _wait_for(browser, browser, "[id$='infer__mlp']")
    browser.execute_script("arguments[0].scrollIntoView()", operation)
    operation.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    _wait_for(browser, operation, ".try-out__btn").click()
    _wait_for(browser, operation, ".execute").click()
    status = _wait_for(browser, operation, ".live-responses-table tbody .response-col_status")
    assert status.text.strip() == "200"
    shown = operation.find_element(
        By.CSS_SELECTOR, ".live-responses-table tbody .response-col_description pre"
    )
    answer = json.loads(shown.text)
    labels = [o for o in answer["outputs"] if o["name"] == "label"]
    assert labels and labels[0]["datatype"] == "INT64" and labels[0]["shape"] == [1, 1]
    # The page's request was the document's example: the same answer as sent by hand.
    doc = httpx.get(f"{examples.url}/v2/openapi.json", timeout=30).json()
    example = doc["paths"]["/v2/models/mlp/infer"]["post"]["requestBody"]["content"][
        "application/json"
    ]["example"]
    direct = httpx.post(f"{examples.url}/v2/models/mlp/infer", json=example, timeout=30).json()
    expected = next(o for o in direct["outputs"] if o["name"] == "label")["data"]
    assert labels[0]["data"] == expected
    # Everything the page loaded came from this server.
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert loaded and all(url.startswith(examples.url + "/") for url in loaded), loaded


def test_the_page_serves_its_own_files_and_says_so(examples: RunningServer) -> None:
    with examples.client() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for src in ("docs/swagger-ui-bundle.js", "docs/swagger-ui.css", "docs/inferd-docs.js"):
            assert src in page.text
            asset = client.get(f"/{src}")
            assert asset.status_code == 200 and asset.content
        missing = client.get("/docs/../../etc/passwd")
        assert missing.status_code == 404
        assert client.get("/docs/index.html").json()["error"].startswith("no file 'index.html'")


def test_docs_ui_off_turns_the_page_off(good_repository: Path) -> None:
    with run_server(good_repository, docs_ui=False) as server, server.client() as client:
        assert client.get("/docs").status_code == 404
        assert client.get("/docs/swagger-ui.css").status_code == 404
        paths = client.get("/v2/openapi.json").json()["paths"]
        assert "/docs" not in paths and "/v2/openapi.json" in paths


def test_the_page_and_the_document_follow_the_metadata_credential(good_repository: Path) -> None:
    restriction = f"metadata:meta-key={META_KEY['meta-key']}"
    with (
        run_server(good_repository, http_restricted_api=(restriction,)) as server,
        server.client() as client,
    ):
        for path in ("/docs", "/docs/swagger-ui.css", "/v2/openapi.json"):
            refused = client.get(path)
            assert refused.status_code == 401, path
            assert "meta-key" in refused.json()["error"]
            assert client.get(path, headers=META_KEY).status_code == 200, path
        doc = client.get("/v2/openapi.json", headers=META_KEY).json()
        assert doc["paths"]["/docs"]["get"]["security"] == [{"header.meta-key": []}]
