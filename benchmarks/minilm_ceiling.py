"""In-process ceilings for the minilm service: ONNX Runtime alone over the fixed corpus
(benchmarks/minilm_corpus.py, 2,000 sentences of 3-60 words, long-tailed), what a server
serving the same text -> embedding over the same files can at best reach on one ORT thread.

The example's own files (after `make models`): examples/models/minilm_tokenize/1/
tokenizer.json (`tokenizers`, truncation at 128, no padding in the file) and
examples/models/minilm_encoder/1/model.onnx (ONNX Runtime, intra_op_num_threads 1,
inter_op_num_threads 1), as inferd's `minilm` ensemble and the peers (benchmarks/peers) run
them. Four ways through the corpus, alternating round by round:

- `batch 1`: one sentence per run, tokenised then encoded, in corpus order; also each
  sentence's latency (tokenise + run, and the run alone): the reference for one connection;
- `batch 32 arrival`: the corpus cut into batches of 32 in its order, each padded to its
  longest member (what a batcher taking requests as they come does);
- `batch 32 sorted`: the corpus sorted by token count first (not timed), then cut into
  batches of 32: the least padding 32-row batches can have;
- `64 clients grouped`: the batches inferd's length grouping (scheduling/length_groups.py,
  with the example encoder's `pad_grouping_waste`) forms online for 64 clients, each sending
  its next sentence the moment its last is answered, with no server around the model: what
  a server with that policy reaches at 64 connections if everything but the encoder cost
  nothing. The groups are formed first (not timed), then run as the other ways are.

Per way: sentences/s counting only ONNX Runtime's runs (`ORT alone`) and counting the
tokenisation and padding too (`with tokenising`), and the padding waste: pad tokens per real
token (rows x the batch's longest, less the real tokens, over the real tokens; [CLS] and [SEP]
count as real).

    .venv/bin/python benchmarks/minilm_ceiling.py [--rounds 3] [--count 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.minilm_corpus import corpus  # noqa: E402

from inferd.config.model_config import read_config  # noqa: E402
from inferd.repository.spec import batching_options  # noqa: E402
from inferd.scheduling.length_groups import form_length_group  # noqa: E402

MODELS = HERE.parent / "examples" / "models"
MAX_TOKENS = 128
WAYS = ("batch 1", "batch 32 arrival", "batch 32 sorted", "64 clients grouped")
CLIENTS = 64


class Encoder:
    """The example's tokenizer and encoder, as the servers run them (one ORT thread)."""

    def __init__(self, models: Path = MODELS) -> None:
        encoder = models / "minilm_encoder" / "1" / "model.onnx"
        tokenizer = models / "minilm_tokenize" / "1" / "tokenizer.json"
        if not encoder.exists() or not tokenizer.exists():
            raise SystemExit(f"no {encoder} or {tokenizer}: run `make models` first")
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(encoder), options, providers=["CPUExecutionProvider"]
        )

    def tokenise(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """input_ids and attention_mask padded to the longest, and the real token count."""
        encodings = self.tokenizer.encode_batch(list(texts))
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), longest), np.int64)
        mask = np.zeros((len(encodings), longest), np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        return ids, mask, int(mask.sum())

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (embedding,) = self.session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(embedding)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        ids, mask, _ = self.tokenise(texts)
        return self.run(ids, mask)


def batches(encoder: Encoder, sentences: list[str], way: str) -> list[list[str]]:
    if way == "batch 1":
        return [[s] for s in sentences]
    if way == "batch 32 sorted":
        lengths = [len(e.ids) for e in encoder.tokenizer.encode_batch(sentences)]
        sentences = [s for _, s in sorted(zip(lengths, sentences, strict=True), key=lambda p: p[0])]
    if way == "64 clients grouped":
        lengths = [len(e.ids) for e in encoder.tokenizer.encode_batch(sentences)]
        return [[sentences[i] for i in group] for group in online_groups(lengths)]
    return [sentences[i : i + 32] for i in range(0, len(sentences), 32)]


@dataclass(slots=True)
class _Request:
    length: int
    rows: int = 1
    shape_key: tuple[tuple[int, ...], ...] = ()


@dataclass(slots=True)
class _Queued:
    request: _Request
    enqueued_ns: int
    index: int  # the sentence's place in the corpus
    deadline_ns: int | None = None
    is_queued: bool = True


def online_groups(lengths: list[int]) -> list[list[int]]:
    """The corpus's sentences (by index) in the batches inferd's length grouping forms for
    CLIENTS closed-loop clients when nothing but the encoder takes time: every client's
    request is queued whenever the encoder's one instance is free, and the clients of a batch
    send the corpus's next sentences as it ends."""
    options = batching_options(read_config(MODELS / "minilm_encoder")[0])  # as served
    queue: list[_Queued] = []
    sent = 0
    for _ in range(min(CLIENTS, len(lengths))):
        queue.append(_Queued(_Request(lengths[sent]), sent, sent))
        sent += 1
    groups: list[list[int]] = []
    while queue:
        formed = form_length_group(queue, options, sent)
        taken = {id(q) for q in formed.batch}
        queue = [q for q in queue if id(q) not in taken]
        groups.append([q.index for q in formed.batch])
        for _ in formed.batch:
            if sent < len(lengths):
                queue.append(_Queued(_Request(lengths[sent]), sent, sent))
                sent += 1
    return groups


def one_pass(encoder: Encoder, groups: list[list[str]]) -> dict[str, Any]:
    """Every group tokenised and run once: totals, and each group's latencies in ms."""
    run_s = total_s = 0.0
    real = padded = rows = 0
    latency_ms: list[float] = []
    run_ms: list[float] = []
    for group in groups:
        t0 = time.perf_counter()
        ids, mask, n = encoder.tokenise(group)
        t1 = time.perf_counter()
        encoder.run(ids, mask)
        t2 = time.perf_counter()
        run_s += t2 - t1
        total_s += t2 - t0
        latency_ms.append((t2 - t0) * 1000)
        run_ms.append((t2 - t1) * 1000)
        real += n
        padded += ids.size
        rows += len(group)
    return {
        "ort_alone_per_s": rows / run_s,
        "with_tokenising_per_s": rows / total_s,
        "padding_waste": (padded - real) / real,
        "p50_ms": statistics.median(latency_ms),
        "p99_ms": float(np.percentile(latency_ms, 99)),
        "run_p50_ms": statistics.median(run_ms),
    }


def measure(rounds: int, count: int, encoder: Encoder | None = None) -> dict[str, dict[str, float]]:
    """The median over `rounds` of each way's figures, the ways alternating in each round."""
    encoder = encoder or Encoder()
    sentences = [s.decode() for s in corpus(count)]
    plans = {way: batches(encoder, sentences, way) for way in WAYS}
    for way in WAYS:  # warm-up: ONNX Runtime's first runs of each shape cost more
        one_pass(encoder, plans[way][:16])
    results: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for round_ in range(rounds):
        order = WAYS if round_ % 2 == 0 else tuple(reversed(WAYS))
        for way in order:
            results[way].append(one_pass(encoder, plans[way]))
    return {
        way: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for way, runs in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000, help="corpus sentences")
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.count} sentences, {args.rounds} rounds", flush=True)  # fmt: skip
    medians = measure(args.rounds, args.count)
    print(f"{'way':18} {'ORT alone/s':>12} {'w/ tokenising/s':>16} {'waste':>7} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'run p50 ms':>10}")  # fmt: skip
    for way, m in medians.items():
        print(f"{way:18} {m['ort_alone_per_s']:12.1f} {m['with_tokenising_per_s']:16.1f} "
              f"{m['padding_waste']:7.3f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
              f"{m['run_p50_ms']:10.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(medians, indent=1) + "\n")


if __name__ == "__main__":
    main()
