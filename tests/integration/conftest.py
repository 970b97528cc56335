"""Fixtures shared by integration test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault_models import write_gated_counter
from tests.support.models import build_example_repository
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="session")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """While this file exists, gated_counter holds its blocker (fault_models.GATED_COUNTER_PY)."""
    return tmp_path_factory.mktemp("gate") / "closed"


@pytest.fixture(scope="session")
def gated_server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("gated_repo")
    write_gated_counter(repo, gate)
    with run_server(repo) as running:
        yield running


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/models, built: the repository a user serves first."""
    return build_example_repository(tmp_path_factory.mktemp("examples") / "models")
