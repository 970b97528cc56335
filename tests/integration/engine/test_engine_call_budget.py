"""`--workers N --engine`'s request path held by counts, as one process's is
(tests/integration/protocol/test_call_budget.py): inferd's own Python calls per request on
each side of the hop, for `tiny` and 32 rows of `mlp`, over HTTP JSON, HTTP binary and gRPC,
each past its budget (tests/support/call_budgets.json, +5%) failing with the functions that
grew.

- "engine-front WIRE MODEL", the front end's share (parsing, decoding, the hop's client,
  encoding): the engine runs as its own process, the front end in a thread of this one,
  every thread of which the counter sees.
- "engine-back WIRE MODEL", the engine's share (the hop's server, the DataPlane's steps,
  the batcher, the instance): the other way round.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.call_budget import MODELS, REQUESTS, WIRES, hold, write_repository
from tests.support.call_counter import CallCounter, calls_per_request, profiled_threads
from tests.support.engine_halves import (
    FrontEndAt,
    engine_process,
    engine_thread,
    front_end_process,
    front_end_thread,
)

SIDES = ("engine-front", "engine-back")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("engine_call_budget") / "models")


@pytest.fixture(scope="module", params=SIDES)
def counted(
    request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, CallCounter, FrontEndAt]]:
    """One side counted at a time (a parametrised fixture: the first is stopped before the
    second starts, so no thread of one is counted for the other)."""
    side: str = request.param
    directory = tmp_path_factory.mktemp("engine")
    counter = CallCounter()
    with ExitStack() as stack:
        if side == "engine-front":
            engine = stack.enter_context(engine_process(repo, directory))
            stack.enter_context(profiled_threads(counter))
            front = stack.enter_context(front_end_thread(directory, engine))
        else:
            stack.enter_context(profiled_threads(counter))
            stack.enter_context(engine_thread(repo, directory))
            front = stack.enter_context(front_end_process(directory))
        yield side, counter, front


@pytest.mark.parametrize("wire", sorted(WIRES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_side_of_the_hop_stays_within_its_call_budget(
    counted: tuple[str, CallCounter, FrontEndAt], wire: str, model: str
) -> None:
    side, counter, front = counted
    with ExitStack() as stack:
        measured = calls_per_request(counter, WIRES[wire](front, model, stack), REQUESTS)
    hold(f"{side} {wire} {model}", measured)
