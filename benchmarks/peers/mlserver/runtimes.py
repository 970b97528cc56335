"""Custom MLServer runtimes for the peer benchmark (there is no mlserver-onnx on PyPI).

Both decode the V2 input with NumpyCodec, run the shared model from ../common_models.py and
encode every output back. Adaptive batching (model-settings.json: max_batch_size 32,
max_batch_time 0.002) hands predict() the merged batch and splits the outputs again.
run_peer.sh puts this folder and benchmarks/peers/ on PYTHONPATH.

MiniLMRuntime serves the minilm service (text -> embedding): adaptive batching hands
predict() the requests' `text` rows merged in arrival order; they are tokenised, padded to the
longest and encoded at once (common_models.MiniLM, which logs its padding).
"""

from __future__ import annotations

import common_models
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class _Base(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        outputs = self._fn(x)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in outputs.items()],
        )


class TinyRuntime(_Base):
    """OUTPUT = INPUT[:, :16] * 2."""

    async def load(self) -> bool:
        self._fn = common_models.tiny
        return True


class OnnxMlpRuntime(_Base):
    """The example ONNX MLP; parameters.uri in model-settings.json points at the .onnx file."""

    async def load(self) -> bool:
        self._fn = common_models.Mlp(await get_model_uri(self._settings))
        return True


class MiniLMRuntime(MLModel):
    """all-MiniLM-L6-v2 from the example models (common_models.MINILM_MODELS)."""

    async def load(self) -> bool:
        self._model = common_models.MiniLM()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        texts = StringCodec.decode_input(payload.inputs[0])
        embedding = self._model(texts)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output("embedding", embedding)],
        )
