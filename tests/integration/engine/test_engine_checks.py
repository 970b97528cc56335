"""The front ends of `--workers 2 --engine` check requests against the model's signature
before the hop (engine/model_table.py): a bad request gets the status and message one
process gives it, over HTTP and gRPC (tritonclient), and never reaches the engine (its
per-front-end request counter does not move); after a reload with another signature the
front ends check the new one; a canary whose signature differs is left to the engine.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.support.metrics_scrape import scrape_url, value
from tests.support.models import builders
from tests.support.servers import free_port, run_cli_server

PAIR_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
{policy}
input [
  {{ name: "A", data_type: TYPE_FP32, dims: [ 2 ] }},
  {{ name: "B", data_type: TYPE_FP32, dims: [ 2 ] }}
]
output [ {{ name: "SUM", data_type: TYPE_FP32, dims: [ 2 ] }} ]
"""


def _write_pair(models: Path, name: str, versions: list[int], max_batch: int = 4) -> None:
    """`A + B -> SUM`, each [batch, 2], batches of up to `max_batch`."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["SUM"])],
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "AB"],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", 2])],
    )
    for v in versions:
        builders._save(builders._ir(graph), models / name / str(v) / "model.onnx")
    policy = "version_policy: { all { } }" if len(versions) > 1 else ""
    config = PAIR_CONFIG.format(name=name, max_batch=max_batch, policy=policy)
    (models / name / "config.pbtxt").write_text(config)


@dataclass
class Served:
    url: str
    grpc_address: str
    metrics: str
    models: Path

    def hop_requests(self, family: str = "inferd_front_end_requests_total") -> float:
        """Infer requests the front ends passed to the engine, all front ends together (or
        those they refused themselves: inferd_front_end_invalid_total)."""
        samples = scrape_url(self.metrics)
        return sum(value(samples, family, front_end=i) for i in "01")

    def failures(self, model: str) -> int:
        """The model's failed requests, by its statistics."""
        doc = httpx.get(f"{self.url}/v2/models/{model}/stats", timeout=10).json()
        return int(doc["model_stats"][0]["inference_stats"]["fail"]["count"])


def _serve(root: Path, *args: str) -> Iterator[Served]:
    models = root / "models"
    _write_pair(models, "pair", [1])
    _write_pair(models, "swap", [1])
    _write_pair(models, "canary", [1, 2])
    grpc_port, metrics_port = free_port(), free_port()
    with run_cli_server(
        models, root / "server.log", "--model-control-mode", "explicit",
        "--load-model", "pair", "--load-model", "swap", "--load-model", "canary",
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), *args,
    ) as cli:  # fmt: skip
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        yield Served(cli.url, f"127.0.0.1:{grpc_port}", metrics, models)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("engine"), "--workers", "2", "--engine")


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("single"))


# name -> the inputs a bad request sends (name, datatype, shape) to `pair` (A, B: FP32 [b, 2]).
BAD = {
    "wrong shape": [("A", "FP32", [1, 3]), ("B", "FP32", [1, 2])],
    "wrong datatype": [("A", "INT32", [1, 2]), ("B", "FP32", [1, 2])],
    "unknown input": [("A", "FP32", [1, 2]), ("B", "FP32", [1, 2]), ("C", "FP32", [1, 2])],
    "missing input": [("A", "FP32", [1, 2])],
    "batch past max_batch_size": [("A", "FP32", [5, 2]), ("B", "FP32", [5, 2])],
    "batch sizes differ": [("A", "FP32", [1, 2]), ("B", "FP32", [2, 2])],
}
GOOD = [("A", "FP32", [1, 2]), ("B", "FP32", [1, 2])]
PROTOCOLS = ["http", "grpc"]


def _eventually(condition: Callable[[], bool], within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def _infer(
    served: Served,
    protocol: str,
    model: str,
    inputs: list[tuple[str, str, list[int]]],
    version: str = "",
    routing_key: str = "",
) -> tuple[str, str]:
    """(status, error message or the version that answered), through tritonclient."""
    module: Any = httpclient if protocol == "http" else grpcclient
    address = served.url.removeprefix("http://") if protocol == "http" else served.grpc_address
    client = module.InferenceServerClient(address)
    tensors = []
    for name, datatype, shape in inputs:
        t = module.InferInput(name, shape, datatype)
        dtype = np.float32 if datatype == "FP32" else np.int32
        t.set_data_from_numpy(np.ones(shape, dtype))
        tensors.append(t)
    headers = {"inferd-routing-key": routing_key} if routing_key else None
    try:
        result = client.infer(model, tensors, model_version=version, headers=headers)
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode."), str(exc.message())
    finally:
        client.close()
    answer = result.get_response()
    return "OK", answer["model_version"] if protocol == "http" else answer.model_version


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_is_refused_by_the_front_end_as_by_one_process(
    engine: Served, single: Served, protocol: str, case: str
) -> None:
    failed = single.failures("pair")
    expected = _infer(single, protocol, "pair", BAD[case])
    assert expected[0] in ("400", "INVALID_ARGUMENT"), expected
    assert single.failures("pair") == failed + 1
    before, failed = engine.hop_requests(), engine.failures("pair")
    invalid = engine.hop_requests("inferd_front_end_invalid_total")
    for version in ("", "1"):  # by default route and by version: the table has both
        assert _infer(engine, protocol, "pair", BAD[case], version) == expected
    assert engine.hop_requests() == before  # refused before the hop: the engine never saw it
    # ... but counted as one process counts it: a failed request of the model (the front
    # end's note of it crosses the hop beside the answer: waited for, with a deadline).
    _eventually(lambda: engine.failures("pair") == failed + 2)
    assert engine.hop_requests("inferd_front_end_invalid_total") == invalid + 2
    assert _infer(engine, protocol, "pair", GOOD) == _infer(single, protocol, "pair", GOOD)
    assert engine.hop_requests() == before + 1


def test_after_a_reload_with_another_signature_the_front_ends_check_the_new_one(
    engine: Served,
) -> None:
    three = [("A", "FP32", [3, 2]), ("B", "FP32", [3, 2])]
    assert _infer(engine, "http", "swap", three) == ("OK", "1")
    # The repository API loads `swap` again with a config of batches of at most 2.
    client = httpclient.InferenceServerClient(engine.url.removeprefix("http://"))
    config = client.get_model_config("swap")
    client.load_model("swap", config=json.dumps({**config, "max_batch_size": 2}))
    client.close()
    before = engine.hop_requests()
    for protocol in PROTOCOLS:
        for _ in range(4):  # new connections: both front ends
            status, message = _infer(engine, protocol, "swap", three)
            assert status in ("400", "INVALID_ARGUMENT")
            assert message == (
                "input 'A': batch size 3 is outside 1..2 (max_batch_size of model 'swap')"
            )
    assert engine.hop_requests() == before
    two = [("A", "FP32", [2, 2]), ("B", "FP32", [2, 2])]
    assert _infer(engine, "grpc", "swap", two) == ("OK", "1")


def _key_to(version: str, weights: dict[str, int]) -> str:
    """A routing key that the router (routing.Router.pick: crc32 of the key, modulo the
    total weight, over the versions in order) sends to `version`."""
    ordered = sorted(weights.items(), key=lambda vw: int(vw[0]))
    low = sum(w for v, w in ordered[: [v for v, _ in ordered].index(version)])
    for i in range(1000):
        key = f"key-{i}"
        if low <= zlib.crc32(key.encode()) % sum(weights.values()) < low + weights[version]:
            return key
    raise AssertionError(f"no key routes to {version}")


def test_a_canary_whose_signature_differs_is_checked_by_the_engine(engine: Served) -> None:
    # Reloaded with batches of at most 2, version 1's file broken: version 2 loads with the
    # new signature, version 1 keeps serving with the old one (batches of up to 4).
    models = engine.models
    config = models / "canary" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    (models / "canary" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    client = httpclient.InferenceServerClient(engine.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="still serving version 1, 2"):
        client.load_model("canary")
    client.close()
    weights = {"1": 50, "2": 50}
    with httpx.Client(base_url=engine.url, timeout=10) as c:
        assert c.post("/v2/models/canary/routing", json={"weights": weights}).status_code == 200
    three = [("A", "FP32", [3, 2]), ("B", "FP32", [3, 2])]
    refused = "input 'A': batch size 3 is outside 1..2 (max_batch_size of model 'canary')"
    to_1, to_2 = _key_to("1", weights), _key_to("2", weights)
    for protocol in PROTOCOLS:
        before = engine.hop_requests()
        # No version named: the front end cannot know whose signature applies; the engine
        # checks, each version by its own.
        assert _infer(engine, protocol, "canary", three, routing_key=to_1) == ("OK", "1")
        status, message = _infer(engine, protocol, "canary", three, routing_key=to_2)
        assert (status in ("400", "INVALID_ARGUMENT"), message) == (True, refused)
        assert engine.hop_requests() == before + 2
        # A version named: the front end checks it against that version's signature.
        assert _infer(engine, protocol, "canary", three, version="1") == ("OK", "1")
        status, message = _infer(engine, protocol, "canary", three, version="2")
        assert (status in ("400", "INVALID_ARGUMENT"), message) == (True, refused)
        assert engine.hop_requests() == before + 3
