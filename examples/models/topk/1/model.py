"""topk: the 10 best-scored candidates of each row, best first."""

import numpy as np

from inferd import PythonModel

K = 10


class Model(PythonModel):
    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, scores = inputs["CANDIDATES"], inputs["SCORES"]  # [batch, 200] each
        best = np.argsort(-scores, axis=1, kind="stable")[:, :K]
        return {
            "IDS": np.take_along_axis(ids, best, axis=1),
            "TOP_SCORES": np.take_along_axis(scores, best, axis=1),
        }
