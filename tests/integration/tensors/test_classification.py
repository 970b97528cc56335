"""The classification extension, over HTTP (binary and JSON) and gRPC with tritonclient's
`InferRequestedOutput(name, class_count=k)`, from one table of cases."""

from __future__ import annotations

import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.support.models import builders
from tests.support.servers import RunningServer, run_server

LABELS = "cat\ndog\n\nbird\n"  # index 2 has an empty line: no label; 4 and on: none at all


def _scores_model() -> Any:
    """SCORES = IN; POSITIVE = IN > 0 (BOOL); GRID = IN as [2, 2] per row; WIDE = IN as
    float64. One input of five scores per row."""
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["IN"], ["SCORES"]),
            helper.make_node("Greater", ["IN", "zero"], ["POSITIVE"]),
            helper.make_node("Slice", ["IN", "start", "end", "axis"], ["four"]),
            helper.make_node("Reshape", ["four", "grid_shape"], ["GRID"]),
            helper.make_node("Cast", ["IN"], ["WIDE"], to=TensorProto.DOUBLE),
        ],
        "scores",
        [helper.make_tensor_value_info("IN", f32, ["batch", 5])],
        [
            helper.make_tensor_value_info("SCORES", f32, ["batch", 5]),
            helper.make_tensor_value_info("POSITIVE", TensorProto.BOOL, ["batch", 5]),
            helper.make_tensor_value_info("GRID", f32, ["batch", 2, 2]),
            helper.make_tensor_value_info("WIDE", TensorProto.DOUBLE, ["batch", 5]),
        ],
        [
            numpy_helper.from_array(np.array(0, np.float32), "zero"),
            numpy_helper.from_array(np.array([0], np.int64), "start"),
            numpy_helper.from_array(np.array([4], np.int64), "end"),
            numpy_helper.from_array(np.array([1], np.int64), "axis"),
            numpy_helper.from_array(np.array([-1, 2, 2], np.int64), "grid_shape"),
        ],
    )
    return builders._ir(graph)


SCORES_CONFIG = """
name: "scores"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 5 ] } ]
output [
  { name: "SCORES", data_type: TYPE_FP32, dims: [ 5 ], label_filename: "labels.txt" },
  { name: "POSITIVE", data_type: TYPE_BOOL, dims: [ 5 ] },
  { name: "GRID", data_type: TYPE_FP32, dims: [ 2, 2 ] },
  { name: "WIDE", data_type: TYPE_FP64, dims: [ 5 ] }
]
"""

# A decoupled model: two responses per request, classified one by one.
STREAM_PY = """
import numpy as np


class Model:
    def predict_stream(self, inputs, responses):
        for i in range(2):
            scores = np.array([10.0 * i, 3.0, 1.0], np.float32)
            responses.send({"SCORES": scores}, final=i == 1)
"""
STREAM_CONFIG = """
name: "stream_scores"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "SCORES", data_type: TYPE_FP32, dims: [ 3 ], label_filename: "labels.txt" } ]
"""

BAD_LABELS = {
    "labels_outside": ("../outside.txt", "must name a file inside the model's directory"),
    "labels_absolute": ("/etc/hostname", "must name a file inside the model's directory"),
    "labels_missing": ("nope.txt", "labels_missing/nope.txt does not exist"),
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("classification_repo")
    builders._save(_scores_model(), repo / "scores" / "1" / "model.onnx")
    _write(repo / "scores" / "config.pbtxt", SCORES_CONFIG)
    _write(repo / "scores" / "labels.txt", LABELS)
    # Unbatched integer scores, config completed from the file: [6] in, [6] out.
    builders._save(
        builders.identity(TensorProto.INT32, [6]), repo / "int_scores" / "1" / "model.onnx"
    )
    _write(repo / "stream_scores" / "config.pbtxt", STREAM_CONFIG)
    _write(repo / "stream_scores" / "1" / "model.py", STREAM_PY)
    _write(repo / "stream_scores" / "labels.txt", "zero\none\n")
    (repo / "outside.txt").write_text("secret\n")
    for name, (label_file, _) in BAD_LABELS.items():
        builders._save(
            builders.identity(TensorProto.FLOAT, ["batch", 3]), repo / name / "1" / "model.onnx"
        )
        _write(
            repo / name / "config.pbtxt",
            f"""
            name: "{name}"
            platform: "onnxruntime_onnx"
            max_batch_size: 4
            input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 3 ] }} ]
            output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 3 ],
                       label_filename: "{label_file}" }} ]
            """,
        )
    with run_server(repo) as running:
        yield running


PROTOCOLS = ["http-binary", "http-json", "grpc"]


class Client:
    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = grpcclient if protocol == "grpc" else httpclient
        address = server.grpc_address if protocol == "grpc" else f"127.0.0.1:{server.port}"
        self.raw = self.mod.InferenceServerClient(address)

    def classify(self, model: str, data: np.ndarray, outputs: dict[str, int]) -> Any:
        datatype = "FP32" if data.dtype == np.float32 else "INT32"
        name = "IN" if model == "scores" else "INPUT0"
        inp = self.mod.InferInput(name, list(data.shape), datatype)
        if self.protocol == "grpc":
            inp.set_data_from_numpy(data)
            wanted = [self.mod.InferRequestedOutput(o, class_count=k) for o, k in outputs.items()]
        else:
            binary = self.protocol == "http-binary"
            inp.set_data_from_numpy(data, binary_data=binary)
            wanted = [
                self.mod.InferRequestedOutput(o, binary_data=binary, class_count=k)
                for o, k in outputs.items()
            ]
        return self.raw.infer(model, [inp], outputs=wanted)

    def datatype(self, result: Any, name: str) -> str:
        if self.protocol == "grpc":
            return str(result.get_output(name).datatype)
        return str(result.get_output(name)["datatype"])


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


ROWS = np.array([[0.1, 0.7, 0.05, 0.7, 0.2], [3.5, -1.0, 9.25, 0.0, 10.0]], np.float32)


def texts(array: np.ndarray) -> list[Any]:
    return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b)(array).tolist()


def test_top_k_per_row_with_labels(client: Client) -> None:
    result = client.classify("scores", ROWS, {"SCORES": 3})
    assert client.datatype(result, "SCORES") == "BYTES"
    # Triton's "<value>:<index>[:<label>]", values as C's %f; the tie (0.7 at 1 and 3)
    # ranks the lower index first; index 2's label line is empty, index 4 has none.
    assert texts(result.as_numpy("SCORES")) == [
        ["0.700000:1:dog", "0.700000:3:bird", "0.200000:4"],
        ["10.000000:4", "9.250000:2", "3.500000:0:cat"],
    ]


def test_k_above_the_class_count_returns_every_class(client: Client) -> None:
    result = client.classify("scores", ROWS[:1], {"SCORES": 50, "WIDE": 1})
    assert result.as_numpy("SCORES").shape == (1, 5)
    assert texts(result.as_numpy("WIDE")) == [["0.700000:1"]]  # no labels for WIDE


def test_unbatched_integer_scores(client: Client) -> None:
    data = np.array([5, -3, 12, 7, 12, 0], np.int32)
    result = client.classify("int_scores", data, {"OUTPUT0": 2})
    assert texts(result.as_numpy("OUTPUT0")) == ["12:2", "12:4"]  # shape [k]: no batch


def test_only_the_requested_output_is_classified(server: RunningServer) -> None:
    """JSON request by hand: `classification` on one output, the other one as numbers."""
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 5], "data": ROWS[0].tolist()}],
        "outputs": [
            {"name": "SCORES", "parameters": {"classification": 1}},
            {"name": "WIDE"},
        ],
    }
    with server.client() as c:
        r = c.post("/v2/models/scores/infer", json=body)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["SCORES"] == {
        "name": "SCORES",
        "datatype": "BYTES",
        "shape": [1, 1],
        "data": ["0.700000:1:dog"],
    }
    assert outputs["WIDE"]["datatype"] == "FP64"
    np.testing.assert_allclose(outputs["WIDE"]["data"], ROWS[0], rtol=1e-6)


# (id, output, k, words in the message)
ERRORS = [
    ("k below one", "SCORES", -1, ["output 'SCORES'", "'classification'", ">= 1", "-1"]),
    ("boolean output", "POSITIVE", 2, ["output 'POSITIVE'", "numeric", "BOOL"]),
    ("two dims per row", "GRID", 2, ["output 'GRID'", "one dimension", "[-1, 2, 2]"]),
    ("unknown output", "LOGITS", 2, ["output 'LOGITS'"]),
]


@pytest.mark.parametrize(
    ("output", "k", "words"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_classification_errors_name_the_output(
    client: Client, output: str, k: int, words: list[str]
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.classify("scores", ROWS, {output: k})
    expected = "StatusCode.INVALID_ARGUMENT" if client.protocol == "grpc" else "400"
    assert info.value.status() == expected
    for word in words:
        assert word in info.value.message()
    assert client.classify("scores", ROWS, {"SCORES": 1}).as_numpy("SCORES").shape == (2, 1)


@pytest.mark.parametrize("k", [0.5, "2", True])
def test_json_classification_must_be_an_integer(server: RunningServer, k: Any) -> None:
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 5], "data": [0] * 5}],
        "outputs": [{"name": "SCORES", "parameters": {"classification": k}}],
    }
    with server.client() as c:
        r = c.post("/v2/models/scores/infer", json=body)
    assert r.status_code == 400
    assert "output 'SCORES': parameter 'classification' must be an integer" in r.json()["error"]


@pytest.mark.parametrize("model", list(BAD_LABELS))
def test_label_files_stay_inside_the_model_directory(server: RunningServer, model: str) -> None:
    with server.client() as c:
        index = c.post("/v2/repository/index", json={}).json()
    [row] = [r for r in index if r["name"] == model]
    assert row["state"] == "UNAVAILABLE"
    field = f"{model}/config.pbtxt: output 'OUTPUT0': label_filename"
    assert field in row["reason"]
    assert BAD_LABELS[model][1] in row["reason"]
    assert "secret" not in row["reason"]


def test_server_metadata_lists_classification(server: RunningServer) -> None:
    with server.client() as c:
        assert "classification" in c.get("/v2").json()["extensions"]


def test_each_response_of_a_decoupled_model_is_classified(server: RunningServer) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inp = grpcclient.InferInput("N", [1], "INT32")
        inp.set_data_from_numpy(np.array([2], np.int32))
        client.async_stream_infer(
            "stream_scores",
            [inp],
            outputs=[grpcclient.InferRequestedOutput("SCORES", class_count=1)],
        )
        got = []
        for _ in range(2):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got.append(texts(result.as_numpy("SCORES")))
    finally:
        client.stop_stream()
        client.close()
    assert got == [["3.000000:1:one"], ["10.000000:0:zero"]]


def test_a_changed_label_file_is_served_after_the_next_load(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    repo = tmp_path_factory.mktemp("relabel_repo")
    builders._save(_scores_model(), repo / "scores" / "1" / "model.onnx")
    _write(repo / "scores" / "config.pbtxt", SCORES_CONFIG)
    _write(repo / "scores" / "labels.txt", LABELS)
    with run_server(repo, admin_api=True) as running:
        client = Client("grpc", running)
        try:
            first = texts(client.classify("scores", ROWS[1:], {"SCORES": 1}).as_numpy("SCORES"))
            _write(repo / "scores" / "labels.txt", "a\nb\nc\nd\ne\n")
            client.raw.load_model("scores")
            second = texts(client.classify("scores", ROWS[1:], {"SCORES": 1}).as_numpy("SCORES"))
        finally:
            client.raw.close()
    assert first == [["10.000000:4"]]  # LABELS has no line 4
    assert second == [["10.000000:4:e"]]
