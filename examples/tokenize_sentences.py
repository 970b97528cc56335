"""Tokenised sentences for `inferd optimize` on a sentence-embedding model such as
minilm_encoder (docs/optimize.md, "Embedding models"): a text file of one sentence per line
in, a .npz of `input_ids` and `attention_mask` out, each INT64 [sentences, longest]: every
sentence tokenised as minilm_tokenize does in the server (truncated at --max-tokens), then
padded with 0 to the longest one, the attention mask 0 over the padding.

    python examples/tokenize_sentences.py examples/sentences/validation.txt validation.npz

--tokenizer names the tokenizer.json (default: the minilm example's, which
examples/build_models.py copies into examples/models/minilm_tokenize/1). Needs the
`tokenizers` package (the `examples` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parent
DEFAULT_TOKENIZER = EXAMPLES / "models" / "minilm_tokenize" / "1" / "tokenizer.json"
DEFAULT_MAX_TOKENS = 128  # minilm_tokenize's truncation, minilm_encoder's max_input_shape
PAD_ID = 0  # [PAD]; minilm_encoder's pad_inputs pads input_ids and attention_mask with 0


class InputError(Exception):
    """A file or option the user must fix; the message names it."""


def read_sentences(path: Path) -> list[str]:
    """The file's non-empty lines, stripped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read it as UTF-8 text: {e}") from None
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if not sentences:
        raise InputError(f"{path}: no sentence in it (one sentence per line)")
    return sentences


def tokenize(
    sentences: list[str], tokenizer_file: Path, max_tokens: int = DEFAULT_MAX_TOKENS
) -> dict[str, np.ndarray]:
    """`input_ids` and `attention_mask`, [len(sentences), longest], padded with PAD_ID."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(
            "the tokenizers package is not installed: pip install -e '.[examples]'"
        ) from None
    if not tokenizer_file.is_file():
        raise InputError(
            f"--tokenizer {tokenizer_file}: no such file (the minilm example's is copied there "
            "by examples/build_models.py: make models)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as e:  # tokenizers raises its own exception type for a bad file
        raise InputError(f"--tokenizer {tokenizer_file}: not a tokenizer.json: {e}") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    encodings = tokenizer.encode_batch(sentences)
    longest = max(len(e.ids) for e in encodings)
    ids = np.full((len(sentences), longest), PAD_ID, np.int64)
    mask = np.zeros((len(sentences), longest), np.int64)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = encoding.attention_mask
    return {"input_ids": ids, "attention_mask": mask}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Tokenise one sentence per line into a .npz of padded input_ids and "
        "attention_mask, for inferd optimize's --validation and --calibration."
    )
    parser.add_argument("sentences", type=Path, help="text file, one sentence per line")
    parser.add_argument("output", type=Path, help="the .npz to write")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=DEFAULT_TOKENIZER,
        help="tokenizer.json (default: the minilm example's)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"truncate each sentence at this many tokens (default: {DEFAULT_MAX_TOKENS})",
    )
    args = parser.parse_args(argv)
    try:
        if args.max_tokens < 2:
            raise InputError(f"--max-tokens {args.max_tokens}: expected at least 2")
        sentences = read_sentences(args.sentences)
        arrays = tokenize(sentences, args.tokenizer, args.max_tokens)
        np.savez(args.output, **arrays)  # type: ignore[arg-type]
    except (InputError, OSError) as e:
        print(f"tokenize_sentences: {e}", file=sys.stderr)
        return 2
    ids = arrays["input_ids"]
    real = int(arrays["attention_mask"].sum())
    print(
        f"wrote {args.output}: {ids.shape[0]} sentences padded to {ids.shape[1]} tokens "
        f"({real} real tokens, {ids.size - real} padding)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
