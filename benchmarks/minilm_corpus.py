"""The fixed sentence corpus the minilm benchmarks share: generated, never downloaded.

Sentences of 3-60 words drawn from a small vocabulary, most short and a long tail
(lognormal lengths, median about 12 words), the same for a given count and seed on every
machine. What a benchmark of an embedding service needs from it is the spread of lengths:
the encoder's cost grows with tokens, and a batch pays for its longest member.

    .venv/bin/python benchmarks/minilm_corpus.py [--count 2000] [--seed 0]
        [--format text|input-data] [--input-name text] [-o FILE]

`text`: one sentence per line. `input-data`: perf_analyzer's `--input-data` JSON (one
entry per sentence, a BYTES input of shape [1]), which `inferd bench --input-data` reads too.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

# The corpus's vocabulary: sentences are random draws from it (their lengths are what counts).
VOCABULARY = (
    "the a server model request batch sentence token embedding padding length queue client "
    "answer minute second quick brown fox jumps over lazy dog market fell sharply today "
    "guitar plays someone man is playing music people city river mountain green"
)


def corpus(count: int = 2000, seed: int = 0) -> list[bytes]:
    """`count` sentences of 3-60 words, most short, a long tail (lognormal lengths)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(12), 0.7, count), 3, 60).astype(int)
    return [
        (" ".join(rng.choice(VOCABULARY.split(), n)).capitalize() + ".").encode() for n in lengths
    ]


def input_data(sentences: list[bytes], input_name: str = "text") -> dict[str, object]:
    """perf_analyzer's --input-data document: one request per sentence."""
    return {"data": [{input_name: {"content": [s.decode()], "shape": [1]}} for s in sentences]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("text", "input-data"), default="text")
    parser.add_argument("--input-name", default="text", help="the BYTES input (input-data)")
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    sentences = corpus(args.count, args.seed)
    if args.format == "text":
        body = "".join(s.decode() + "\n" for s in sentences)
    else:
        body = json.dumps(input_data(sentences, args.input_name)) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(body)
    else:
        sys.stdout.write(body)


if __name__ == "__main__":
    main()
