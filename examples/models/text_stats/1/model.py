"""An example inferd Python model: batched string processing with numpy."""

import numpy as np

from inferd import ModelContext, PythonModel


class Model(PythonModel):
    def load(self, context: ModelContext) -> None:
        self.encoding = context.parameters.get("encoding", "utf-8")
        print(f"text_stats loaded from {context.version_dir.name}")  # goes to the log

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        text = inputs["text"]  # shape [batch, 1], bytes elements
        decoded = np.char.decode(text.astype(np.bytes_), self.encoding)
        # Element by element as Python strings: upper-casing may lengthen one ("ß" -> "SS"),
        # which a fixed-width numpy string array would cut to its width.
        upper = _upper(decoded.astype(object))
        return {
            "upper": _encode(upper, self.encoding),
            "length": np.char.str_len(decoded).astype(np.int32),
        }


_upper = np.frompyfunc(str.upper, 1, 1)
_encode = np.frompyfunc(str.encode, 2, 1)
