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
        return {
            "upper": np.char.encode(np.char.upper(decoded), self.encoding).astype(object),
            "length": np.char.str_len(decoded).astype(np.int32),
        }
