"""What every answer of the soak must be: each example model computed again in the soak's
own process (onnxruntime on the same files, the Python models' definitions), and the
requests the soak sends, 60% drawn from pools (repeated inputs, so the shared cache
answers some) and the rest fresh.

`check(case, version, outputs)` is None for a right answer, else what is wrong. Floats are
compared with a tolerance (a row's result moves in its last bits with the batch it ran in,
and a cached answer may come from another batch); a classifier's label may differ only
where its two best probabilities tie within that tolerance; integers and text exactly.
"""

from __future__ import annotations

import importlib.util
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort

from tests.support.soak_repository import linear_onnx, mlp_canary_onnx

POOL = 48  # distinct inputs per model that requests repeat
RECALL_ITEMS, RECALL_SEED, CANDIDATES, TOP = 100_000, 17, 200, 10
ATOL, RTOL = 1e-5, 1e-4
MARGIN = 2e-4  # far above float32 rounding of scores near 1-10
TORCH_ATOL = 1e-4  # TorchScript against onnxruntime: two libraries' kernels
# Characters whose upper case is one character (str.upper and numpy agree), no NUL.
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789 éüçñäöΩжπ日本語"
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


@dataclass(frozen=True)
class Case:
    """One valid request: its model, input tensors (name -> array, datatype), the outputs
    it asks for, and what the check needs that the tensors do not say (the texts)."""

    model: str
    inputs: dict[str, tuple[np.ndarray, str]]
    outputs: tuple[str, ...]
    texts: tuple[str, ...] = ()
    pooled: bool = False


def _session(model: bytes | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"soak_{path.parent.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(got: np.ndarray, want: np.ndarray, atol: float = ATOL) -> str | None:
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if not np.allclose(got, want, rtol=RTOL, atol=atol):
        worst = float(np.max(np.abs(got.astype(np.float64) - want)))
        return f"values differ by up to {worst:.3g}"
    return None


def _utf8(value: object) -> bytes:
    """A BYTES element as it came: bytes (binary, gRPC) or text (JSON)."""
    return value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[call-overload]


def _labels(got: np.ndarray, probabilities: np.ndarray) -> str | None:
    want = np.argmax(probabilities, axis=1)
    for row, (label, best) in enumerate(zip(got.reshape(-1), want, strict=True)):
        if label != best:
            top2 = np.sort(probabilities[row])[-2:]
            if top2[1] - top2[0] > RTOL:
                return f"row {row}: label {label}, expected {best}"
    return None


@dataclass
class References:
    """The reference computations, built once from the soak's repository."""

    repo: Path
    _linear: dict[int, ort.InferenceSession] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.mlp = {"1": _session(self.repo / "mlp" / "1" / "model.onnx"),
                    "2": _session(mlp_canary_onnx())}  # fmt: skip
        self.rank = _session(self.repo / "rank" / "1" / "model.onnx")
        recall = _module(self.repo / "recall" / "1" / "model.py")
        self.table: np.ndarray = recall.embedding_table(RECALL_ITEMS, RECALL_SEED)

    # -- the models, computed here ---------------------------------------------------------

    def mlp_outputs(self, version: str, x: np.ndarray) -> dict[str, np.ndarray]:
        session = self.mlp[version]
        with self._lock:  # one run at a time per session is all the soak needs
            probabilities, label = session.run(None, {"input": x})
        return {"probabilities": probabilities, "label": label}

    def linear(self, version: int, x: np.ndarray) -> np.ndarray:
        with self._lock:
            session = self._linear.get(version)
            if session is None:
                session = self._linear[version] = _session(linear_onnx(version))
            (y,) = session.run(None, {"x": x})
        return np.asarray(y)

    def recall_rank(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """IDS and SCORES of each user, and the two margins that make them well defined:
        the dot-product gap at the 200th candidate and the smallest score gap in the top
        10 (and to the 11th)."""
        dots = users @ self.table.T
        order = np.argsort(-dots, axis=1)
        top = order[:, :CANDIDATES]
        with self._lock:
            (scores,) = self.rank.run(None, {"USER": users, "CANDIDATE_VECS": self.table[top]})
        best = np.argsort(-scores, axis=1, kind="stable")
        ids = np.take_along_axis(top, best[:, :TOP], axis=1).astype(np.int64)
        ranked = np.take_along_axis(scores, best[:, : TOP + 1], axis=1)
        rows = np.arange(len(users))
        cut = dots[rows, order[:, CANDIDATES - 1]] - dots[rows, order[:, CANDIDATES]]
        return ids, ranked[:, :TOP], np.minimum(cut, np.min(-np.diff(ranked, axis=1), axis=1))


@dataclass
class Cases:
    """Valid requests for every model, 60% from fixed pools (the cache's repeats), the rest
    fresh; `check` says whether an answer is the model's."""

    refs: References
    seed: int
    _checks: dict[str, Callable[[Case, str, dict[str, np.ndarray]], str | None]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.rng = random.Random(self.seed)
        self.mlp_pool = rng.standard_normal((POOL, 64), dtype=np.float32)
        self.linear_pool = rng.standard_normal((POOL, 4), dtype=np.float32)
        self.add_pool = rng.standard_normal((POOL, 2, 4), dtype=np.float32)
        self.text_pool = [self._text() for _ in range(POOL)]
        self.users, self.expected_ids, self.expected_scores = self._stable_users(rng)
        self._checks = {
            "mlp": self._check_mlp,
            "mlp_torch": self._check_mlp_torch,
            "linear_noconfig": self._check_linear,
            "text_stats": self._check_text,
            "text_stats_raw": self._check_text,
            "add_sub": self._check_add_sub,
            "recall_rank": self._check_recall_rank,
            "word_stream": self._check_words,
        }
        self.makers: dict[str, Callable[[], Case]] = {
            "mlp": lambda: self._rows("mlp", "input", self.mlp_pool, ("probabilities", "label")),
            "mlp_torch": lambda: self._rows(
                "mlp_torch", "input", self.mlp_pool, ("probabilities", "label")
            ),
            "linear_noconfig": lambda: self._rows(
                "linear_noconfig", "x", self.linear_pool, ("y",), 4
            ),
            "text_stats": lambda: self._texts("text_stats"),
            "text_stats_raw": lambda: self._texts("text_stats_raw"),
            "add_sub": self._add_sub,
            "recall_rank": self._recall_rank,
            "word_stream": self._sentence,
        }

    def make(self, model: str) -> Case:
        return self.makers[model]()

    def check(self, case: Case, version: str, outputs: dict[str, np.ndarray]) -> str | None:
        missing = [n for n in case.outputs if n not in outputs]
        if missing:
            return f"outputs {missing} missing"
        try:
            return self._checks[case.model](case, version, outputs)
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # a malformed answer
            return f"answer not comparable: {type(exc).__name__}: {exc}"

    # -- requests ------------------------------------------------------------------------------

    def _text(self) -> str:
        n = self.rng.randint(1, 24)
        text = "".join(self.rng.choice(LETTERS) for _ in range(n)).strip()
        return text or "x"

    def _rows(
        self, model: str, name: str, pool: np.ndarray, outputs: tuple[str, ...], most: int = 4
    ) -> Case:
        n = self.rng.randint(1, most)
        if self.rng.random() < 0.6:  # from the pool: one row, repeated by other requests
            row = pool[self.rng.randrange(len(pool))][None, :]
            return Case(model, {name: (row.copy(), "FP32")}, outputs, pooled=True)
        x = np.random.default_rng(self.rng.getrandbits(32)).standard_normal(
            (n, pool.shape[1]), dtype=np.float32
        )
        return Case(model, {name: (x, "FP32")}, outputs)

    def _texts(self, model: str) -> Case:
        pooled = self.rng.random() < 0.6
        n = 1 if pooled else self.rng.randint(1, 4)
        texts = [self.rng.choice(self.text_pool) if pooled else self._text() for _ in range(n)]
        array = np.array([[t.encode()] for t in texts], dtype=object)
        return Case(model, {"text": (array, "BYTES")}, ("upper", "length"), tuple(texts), pooled)

    def _add_sub(self) -> Case:
        if self.rng.random() < 0.6:
            a, b = self.add_pool[self.rng.randrange(POOL)]
            pooled = True
        else:
            a, b = np.random.default_rng(self.rng.getrandbits(32)).standard_normal(
                (2, 4), dtype=np.float32
            )
            pooled = False
        inputs = {"INPUT0": (a.copy(), "FP32"), "INPUT1": (b.copy(), "FP32")}
        return Case("add_sub", inputs, ("OUTPUT0", "OUTPUT1"), pooled=pooled)

    def _recall_rank(self) -> Case:
        n = 1 if self.rng.random() < 0.7 else self.rng.randint(2, 4)
        rows = [self.rng.randrange(len(self.users)) for _ in range(n)]
        users = self.users[rows]
        return Case("recall_rank", {"USER": (users, "FP32")}, ("IDS", "SCORES"),
                    texts=tuple(str(r) for r in rows), pooled=n == 1)  # fmt: skip

    def _sentence(self) -> Case:
        words = tuple(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 6)))
        array = np.array([" ".join(words).encode()], dtype=object)
        return Case("word_stream", {"text_input": (array, "BYTES")}, ("text_output",), words)

    def _stable_users(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Users whose top 10 no rounding can change: clear gaps at the 200th candidate of
        recall and between the top scores of rank."""
        users = rng.standard_normal((4 * POOL, 64), dtype=np.float32)
        ids, scores, margins = self.refs.recall_rank(users)
        keep = np.flatnonzero(margins > MARGIN)[:POOL]
        assert len(keep) >= POOL // 4, "too few users with well-separated answers"
        return users[keep], ids[keep], scores[keep]

    # -- checks ----------------------------------------------------------------------------------

    def _check_mlp(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        if version not in self.refs.mlp:
            return f"version {version} was never deployed"
        want = self.refs.mlp_outputs(version, case.inputs["input"][0])
        return _close(out["probabilities"], want["probabilities"]) or _labels(
            out["label"], want["probabilities"]
        )

    def _check_mlp_torch(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        want = self.refs.mlp_outputs("1", case.inputs["input"][0])
        return _close(out["probabilities"], want["probabilities"], TORCH_ATOL) or _labels(
            out["label"], want["probabilities"]
        )

    def _check_linear(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        return _close(out["y"], self.refs.linear(int(version), case.inputs["x"][0]))

    def _check_text(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        upper = [_utf8(v) for v in out["upper"].reshape(-1)]
        if upper != [t.upper().encode() for t in case.texts]:
            return f"upper {upper!r} for {case.texts!r}"
        lengths = out["length"].reshape(-1).tolist()
        if lengths != [len(t) for t in case.texts]:
            return f"length {lengths} for {case.texts!r}"
        return None

    def _check_add_sub(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        a, b = case.inputs["INPUT0"][0], case.inputs["INPUT1"][0]
        if not np.array_equal(out["OUTPUT0"], a + b) or not np.array_equal(out["OUTPUT1"], a - b):
            return f"OUTPUT0 {out['OUTPUT0']}, OUTPUT1 {out['OUTPUT1']} for {a}, {b}"
        return None

    def _check_recall_rank(
        self, case: Case, version: str, out: dict[str, np.ndarray]
    ) -> str | None:
        rows = [int(r) for r in case.texts]
        if not np.array_equal(out["IDS"], self.expected_ids[rows]):
            return f"IDS {out['IDS'].tolist()}, expected {self.expected_ids[rows].tolist()}"
        return _close(out["SCORES"], self.expected_scores[rows], TORCH_ATOL)

    def _check_words(self, case: Case, version: str, out: dict[str, np.ndarray]) -> str | None:
        got = [_utf8(v).decode() for v in out["text_output"].reshape(-1)]
        return None if got == list(case.texts) else f"words {got}, expected {list(case.texts)}"
