"""Property-based API tests: Schemathesis against a live `inferd serve` (the example
repository, the admin API on, an admin token and a restricted API set), from the OpenAPI
document the server itself serves (docs/openapi.md, docs/security.md).

Every route, with generated valid and invalid bodies, headers and paths, and the
document's stateful links (load -> ready -> infer -> unload -> load). It passes when no
request met a 5xx other than the two a request can legitimately meet (503, 504: see
tests/support/schemathesis.toml), every answer conformed to the document (status, content
type, body, headers), no request hung past its timeout, and the server is alive and ready
at the end. Bounded: a few thousand cases, well under three minutes on two cores; its seed
is fixed (tests/support/schemathesis.toml), so a failure reproduces.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.security import ADMIN_TOKEN
from tests.support.servers import run_cli_server

CONFIG = Path(__file__).resolve().parents[2] / "support" / "schemathesis.toml"
STATS_KEY = "stats-secret-3"
MIN_CASES = 2000


def test_schemathesis_finds_no_failure_against_the_served_document(
    example_repository: Path, tmp_path: Path
) -> None:
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    with run_cli_server(
        example_repository,
        tmp_path / "server.log",
        "--admin-api", "on",
        "--admin-token-file", str(token),
        "--http-restricted-api", f"statistics:stats-key={STATS_KEY}",
    ) as server:  # fmt: skip
        run = subprocess.run(
            [
                sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG),
                "run", f"{server.url}/v2/openapi.json", "--no-color",
                "-H", f"authorization: Bearer {ADMIN_TOKEN}", "-H", f"stats-key: {STATS_KEY}",
            ],
            cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False,
        )  # fmt: skip
        report = run.stdout + run.stderr
        assert run.returncode == 0, report[-12000:]
        # It ran what it says: every phase, the stateful links, thousands of cases.
        cases = re.search(r"(\d+) generated, (\d+) passed", report)
        assert cases is not None and int(cases.group(1)) >= MIN_CASES, report[-3000:]
        links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", report)
        assert links is not None and int(links.group(1)) > 0, report[-3000:]
        for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
            assert f"✅  {phase}" in report, report[-3000:]
        # No crash, and ready at the end.
        assert server.proc.poll() is None, server.output()[-3000:]
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=30).status_code == 200
    assert "Traceback" not in server.output(), server.output()[-6000:]
