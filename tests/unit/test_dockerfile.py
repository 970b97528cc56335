"""The Dockerfile keeps its rules (tests/support/dockerfile_lint.py), and the lint catches each
rule broken: a rule that cannot fail would prove nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.dockerfile_lint import stages, violations

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_the_dockerfile_keeps_every_rule() -> None:
    assert violations(DOCKERFILE) == []


def test_it_builds_in_one_stage_and_runs_in_another() -> None:
    args, found = stages(DOCKERFILE)
    assert [s.name for s in found] == ["build", "runtime"]
    assert found[0].image == found[1].image == args["BASE_IMAGE"]
    assert "latest" not in args["BASE_IMAGE"]


# (what is broken, the change that breaks it, words of the violation)
BROKEN = [
    ("root", ("USER 10001:10001", "USER root"), "is root"),
    ("no user", ("USER 10001:10001\n", ""), "runs as root"),
    ("latest", ("python:3.11.13-slim-bookworm", "python:latest"), "latest"),
    ("loose tag", ("python:3.11.13-slim-bookworm", "python:3.11-slim"), "not pinned"),
    ("no healthcheck", ("HEALTHCHECK", "# HEALTHCHECK"), "HEALTHCHECK"),
    ("no tini", ('["/usr/bin/tini", "--", "inferd"]', '["inferd"]'), "tini"),
    ("shell entrypoint", ('["/usr/bin/tini", "--", "inferd"]', "inferd serve"), "exec"),
    ("compiler", ("tini ${malloc}", "tini gcc ${malloc}"), "installs ['gcc']"),
    ("ports", ("EXPOSE 8000 8001 8002", "EXPOSE 8000"), "EXPOSE lacks"),
    ("models", ("INFERD_MODEL_REPOSITORY=/models", "INFERD_MODEL_REPOSITORY=/srv"), "/models"),
    ("single stage", ("FROM ${BASE_IMAGE} AS runtime", "# one stage"), "multi-stage"),
]


@pytest.mark.parametrize(
    ("change", "says"), [(c, s) for _, c, s in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_the_lint_catches_a_broken_rule(change: tuple[str, str], says: str) -> None:
    old, new = change
    assert old in DOCKERFILE, old
    problems = violations(DOCKERFILE.replace(old, new))
    assert any(says in p for p in problems), problems


def test_the_build_script_says_why_when_no_engine_can_run(tmp_path: Path) -> None:
    """Where neither podman nor buildah is installed, scripts/build-image.sh fails at once,
    saying what to install (not with a shell's 'command not found' halfway)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "sed", "dirname", "tail", "id"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    result = subprocess.run(
        ["sh", str(ROOT / "scripts" / "build-image.sh")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "no container engine can run here" in result.stderr
    assert "apt-get install podman" in result.stderr


def test_the_build_script_refuses_an_unknown_option() -> None:
    result = subprocess.run(
        ["sh", str(ROOT / "scripts" / "build-image.sh"), "--fast"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown option '--fast'" in result.stderr
