"""BLS: Python models calling other models from their `execute` / `predict`, in the server
process and with `isolation: "process"`, over HTTP and gRPC with Triton's clients
(tests/support/bls_models.py has the models).

A call goes through the called model's own scheduler (its statistics count it), carries the
caller's deadline (a model calling itself with one instance is freed by it), and a client
that leaves cancels the calls its request has not yet run. Failures come back to the model
as error responses it reads; the server stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.events import BatchRecord, RequestRecord
from inferd.telemetry.request_log import RequestLogSink
from tests.support.admission_models import executed, gate_closed
from tests.support.async_infer import OK, PROTOCOLS, AsyncInfer
from tests.support.bls_models import GUARD, ISOLATIONS, write_bls_models
from tests.support.protocol_clients import Client
from tests.support.servers import RunningServer, batcher_of, run_server, until, wait_for
from tests.support.trace_collector import TRACE_ID, TRACEPARENT, Captured, added


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bls")
    write_bls_models(path)
    return path


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RunningServer]:
    with run_server(root / "models") as s:
        yield s


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


def ask(client: Client, model: str, value: float, **kwargs: Any) -> tuple[float, str]:
    result = client.infer(model, {"IN": (np.full((1, 1), value, np.float32), "FP32")}, **kwargs)
    message = result.as_numpy("MSG").ravel()[0]
    return float(result.as_numpy("OUT").ravel()[0]), message.decode()


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_exec_answers_with_the_called_models_outputs(client: Client, iso: str) -> None:
    assert ask(client, f"relay_{iso}", 3) == (7.0, "ok")  # double's 6, plus one


def test_calls_nest_across_isolations(client: Client) -> None:
    # relay_process calls relay_inproc, which calls double: (2 * 3 + 1) + 1.
    assert ask(client, "relay_process", 3, parameters={"target": "relay_inproc"}) == (8.0, "ok")
    assert ask(client, "relay_inproc", 3, parameters={"target": "relay_process"}) == (8.0, "ok")


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_async_exec_calls_gathered_run_together(client: Client, iso: str) -> None:
    assert ask(client, f"fanout_{iso}", 1) == (2.0 + 4.0 + 6.0, "3 calls")


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_decoupled_exec_iterates_the_responses(client: Client, iso: str) -> None:
    # repeat sends 1, 2, 3, then the final flag alone: Triton's empty last response.
    assert ask(client, f"streamsum_{iso}", 3) == (6.0, "4 responses, last empty: True")
    assert ask(client, f"streamsum_{iso}", 0) == (0.0, "1 responses, last empty: True")
    # More responses than the call lets wait for the model (bls_request.STREAM_AHEAD).
    assert ask(client, f"streamsum_{iso}", 40) == (820.0, "41 responses, last empty: True")


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_a_stream_the_model_stops_reading_ends(client: Client, iso: str) -> None:
    # repeat would send 500; the model takes 2 and drops the iterator: the call ends, and
    # repeat's one instance is free for the next call (else this would wait for good).
    out, message = ask(client, f"streamsum_{iso}", 500, parameters={"take": 2})
    assert (out, message) == (3.0, "2 responses, last empty: False")
    assert ask(client, f"streamsum_{iso}", 3) == (6.0, "4 responses, last empty: True")


# (case, request parameters for the relay, TritonError code, words of the message)
ERRORS = [
    ("missing model", {"target": "nope"}, 2, ["unknown model 'nope'"]),
    ("unready model", {"target": "broken"}, 4, ["'broken'", "this model never loads"]),
    ("unknown input", {"input": "X"}, 3, ["'X'"]),
    ("wrong datatype", {"fp64": True}, 3, ["FP64"]),
    ("decoupled model", {"target": "repeat"}, 5, ["decoupled", "exec(decoupled=True)"]),
]


@pytest.mark.parametrize("iso", ISOLATIONS)
@pytest.mark.parametrize(
    ("parameters", "code", "words"),
    [case[1:] for case in ERRORS],
    ids=[case[0] for case in ERRORS],
)
def test_a_failed_call_is_a_response_the_model_reads(
    client: Client, iso: str, parameters: dict[str, Any], code: int, words: list[str]
) -> None:
    out, message = ask(client, f"relay_{iso}", 3, parameters=parameters)
    assert out == -1.0, message
    assert message.startswith(f"{code} "), message
    for word in words:
        assert word in message
    assert ask(client, f"relay_{iso}", 3) == (7.0, "ok")  # the instance serves on


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_the_calls_own_timeout_ends_it(client: Client, root: Path, iso: str) -> None:
    # target holds its request while the gate is closed: the call's 100 ms run out first.
    with gate_closed(root, "target"):
        out, message = ask(client, f"{GUARD}_{iso}", 5, parameters={"timeout_us": 100_000})
    assert out == -1.0
    assert message.startswith("4 "), message  # UNAVAILABLE, Triton's code for a timeout
    assert "deadline passed" in message


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_inferd_models_call_through_their_context(client: Client, iso: str) -> None:
    assert ask(client, f"icall_{iso}", 2) == (5.0, "ok")
    out, message = ask(client, f"icall_{iso}", -1)  # a call to a missing model
    assert out == -1.0
    assert message == "NOT_FOUND unknown model 'no_such_model'"
    # Three infer_async gathered (6 + 8 + 10), then repeat's three responses streamed.
    assert ask(client, f"iacall_{iso}", 3) == (24.0, "3 streamed")


def _successes(server: RunningServer, model: str) -> int:
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=30).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_the_called_models_statistics_count_the_calls(
    client: Client, server: RunningServer, iso: str
) -> None:
    before = _successes(server, "double")
    ask(client, f"fanout_{iso}", 1)
    assert _successes(server, "double") == before + 3


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_a_model_calling_itself_is_freed_by_the_deadline(client: Client, iso: str) -> None:
    # One instance: the inner call waits for the outer one to finish, which waits for it.
    # Triton does not protect against this; the client's deadline ends the inner call
    # (or refuses it at once, when the queued work cannot finish before it).
    deadline = (
        {"client_timeout": 0.5}
        if client.protocol == "grpc"
        else {"headers": {"inferd-timeout-ms": "500"}}
    )
    try:
        out, message = ask(client, f"selfcall_{iso}", 1, **deadline)
    except InferenceServerException as exc:  # the deadline passed while the call waited
        message = str(exc.message())
    else:  # or, once the model's execution time is known, the call was refused at once
        assert out == -1.0, message
    assert "deadline" in message.lower(), message
    assert ask(client, f"selfcall_{iso}", 0) == (0.0, "inner")  # the instance is free again


@pytest.mark.parametrize("iso", ISOLATIONS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_that_leaves_cancels_its_calls_not_yet_run(
    server: RunningServer, root: Path, protocol: str, iso: str
) -> None:
    batcher = batcher_of(server, "target")
    value = {"http": 61, "grpc": 62}[protocol] + (10 if iso == "process" else 0)

    async def scenario() -> None:
        async with AsyncInfer(protocol, server) as keeper, AsyncInfer(protocol, server) as gone:
            busy = asyncio.create_task(keeper("target", 51))  # holds target's one instance
            await until(
                batcher, lambda b: b.inflight() == 1 and b.queue_depth() == 0, "51 executing"
            )
            leaving = asyncio.create_task(gone(f"{GUARD}_{iso}", value))
            await until(batcher, lambda b: b.queue_depth() == 1, "the BLS call queued")
            leaving.cancel()  # the client gives up while its execute awaits the call
            with contextlib.suppress(asyncio.CancelledError):
                await leaving
            # The call leaves target's queue while the instance is still busy.
            deadline = time.monotonic() + 30
            while batcher.queue_depth():
                assert time.monotonic() < deadline, "the BLS call was never cancelled"
                await asyncio.sleep(0.01)
            release()
            assert (await busy).status == OK[protocol]

    with gate_closed(root, "target") as release:
        asyncio.run(scenario())
    wait_for(batcher, lambda b: b.inflight() == 0 and b.queue_depth() == 0, "target idle")
    assert value not in executed(root, "target")


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_a_call_carries_the_callers_trace(server: RunningServer, client: Client, iso: str) -> None:
    handler = Captured()
    logger = logging.getLogger(f"test.bls.requests.{client.protocol}.{iso}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with added(server, RequestLogSink(1.0, logger.name)):
        ask(client, f"relay_{iso}", 3, headers={"traceparent": TRACEPARENT})
        deadline = time.monotonic() + 30  # the lines are written as the requests end
        while len(handler.records) < 2:
            assert time.monotonic() < deadline, [r.getMessage() for r in handler.records]
            time.sleep(0.01)
    lines = {r.model: r for r in handler.records}  # type: ignore[attr-defined]
    assert set(lines) == {f"relay_{iso}", "double"}
    assert lines["double"].trace_id == lines[f"relay_{iso}"].trace_id == TRACE_ID  # type: ignore[attr-defined]
    assert lines["double"].protocol == client.protocol  # type: ignore[attr-defined]


class Records:
    """A telemetry sink keeping every request's record (its context included)."""

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []

    def on_request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def on_batch(self, record: BatchRecord) -> None:
        pass


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_a_call_gets_the_callers_deadline_or_its_own_shorter_timeout(
    server: RunningServer, client: Client, iso: str
) -> None:
    deadline = (
        {"client_timeout": 30.0}
        if client.protocol == "grpc"
        else {"headers": {"inferd-timeout-ms": "30000"}}
    )
    records = Records()
    with added(server, records):
        ask(client, f"relay_{iso}", 3, **deadline)
        ask(client, f"relay_{iso}", 3, parameters={"timeout_us": 20_000_000}, **deadline)
        give_up = time.monotonic() + 30  # each record is told as its request ends
        while len(records.requests) < 4:
            assert time.monotonic() < give_up, records.requests
            time.sleep(0.01)
    by_model: dict[str, list[RequestRecord]] = {}
    for record in records.requests:
        by_model.setdefault(record.model, []).append(record)
    callers, calls = by_model[f"relay_{iso}"], by_model["double"]
    assert len(callers) == len(calls) == 2
    # gRPC's deadline reaches the server as what is left of it: compare, don't assume.
    first, second = (c.ctx.deadline_ns for c in callers)
    assert first is not None and second is not None
    assert calls[0].ctx.deadline_ns == first  # what is left of the caller's
    own = calls[1].ctx.deadline_ns
    assert own is not None and own < second  # its own 20 s, inside the caller's 30 s
