"""recall: the top-200 items of a 100,000 x 64 embedding table by dot product with the user.

The table is built from a fixed seed at load (never stored in git): the same seed gives the
same table, so examples/build_models.py and the tests can recompute any answer."""

import numpy as np

from inferd import ModelContext, PythonModel

CANDIDATES = 200


def embedding_table(items: int, seed: int) -> np.ndarray:
    """The item embeddings, unit length: the dot product with a user is a cosine score."""
    table = np.random.default_rng(seed).standard_normal((items, 64), dtype=np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    return table


class Model(PythonModel):
    def load(self, context: ModelContext) -> None:
        self.table = embedding_table(
            int(context.parameters.get("items", "100000")),
            int(context.parameters.get("seed", "17")),
        )

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        users = inputs["USER"]  # [batch, 64]
        scores = users @ self.table.T  # [batch, items]: one BLAS call for the whole batch
        top = np.argpartition(scores, -CANDIDATES, axis=1)[:, -CANDIDATES:]
        return {"CANDIDATES": top.astype(np.int64), "CANDIDATE_VECS": self.table[top]}
