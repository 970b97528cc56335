"""Running `inferd optimize` in the tests, and what a run produced."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.cli import main as cli

FAST = ["--duration-s", "0.05", "--samples", "64"]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    report: dict[str, Any]


def optimize(repo: Path, model: str, *argv: str, report: Path | None = None) -> Run:
    out, err = io.StringIO(), io.StringIO()
    extra = ["--json", str(report)] if report is not None else []
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(
            ["optimize", "-m", model, "--model-repository", str(repo), *FAST, *extra, *argv]
        )
    doc = json.loads(report.read_text()) if report is not None and report.exists() else {}
    return Run(code, out.getvalue(), err.getvalue(), doc)
