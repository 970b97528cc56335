"""`make test` on a machine where promtool and prometheus cannot be installed: the run goes
on, and the tests that need them are skipped with the reason (failed where CI requires them).

Each case runs the real thing (make, the install script, pytest) with a PATH that lacks the
tools and apt-get, as on a machine without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEPLOY_TEST = "tests/integration/deploy/test_deploy.py::test_promtool_checks_the_rules"


@pytest.fixture
def bare_path(tmp_path: Path) -> str:
    """A PATH with a shell, make and id, and no promtool, prometheus, apt-get or sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "make", "id"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"`{tool}` is not installed here")
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _env(path: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "INFERD_REQUIRE_TEST_TOOLS"}
    return {**env, "PATH": path, **extra}


def test_the_install_script_says_why_it_cannot_install(bare_path: str) -> None:
    result = subprocess.run(
        ["sh", "scripts/install-test-tools.sh"],
        cwd=ROOT, env=_env(bare_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "apt-get is not available" in result.stderr


def test_make_test_tools_goes_on_when_it_cannot_install(bare_path: str) -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", "test-tools"],
        cwd=ROOT, env=_env(bare_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "the tests that need them will be skipped" in result.stderr


def _pytest(path: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rsf", DEPLOY_TEST],
        cwd=ROOT, env=_env(path, **extra), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_without_the_tools_their_tests_skip_saying_why(bare_path: str) -> None:
    result = _pytest(bare_path)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "`promtool` is not on PATH: scripts/install-test-tools.sh installs it" in result.stdout


def test_where_ci_requires_the_tools_their_tests_fail(bare_path: str) -> None:
    result = _pytest(bare_path, INFERD_REQUIRE_TEST_TOOLS="1")
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout and "`promtool` is not on PATH" in result.stdout
