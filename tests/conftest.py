from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import build_broken_models, build_good_repository
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="session")
def good_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("good_repo")
    build_good_repository(repo)
    return repo


@pytest.fixture(scope="session")
def mixed_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The good models plus broken ones: the broken must not stop the good from serving."""
    repo = tmp_path_factory.mktemp("mixed_repo")
    build_good_repository(repo)
    build_broken_models(repo)
    return repo


@pytest.fixture(scope="session")
def server(mixed_repository: Path) -> Iterator[RunningServer]:
    with run_server(mixed_repository, max_request_bytes=1024 * 1024) as running:
        yield running
