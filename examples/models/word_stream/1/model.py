"""Streams the input text back one word per response: a decoupled model with inferd's API."""

import numpy as np

from inferd import PythonModel, ResponseSender


class Model(PythonModel):
    def predict_stream(self, inputs: dict[str, np.ndarray], responses: ResponseSender) -> None:
        text = inputs["text_input"].ravel()[0]
        for word in text.split():
            if responses.is_cancelled():  # the client has gone: stop working
                break
            responses.send({"text_output": np.array([word], dtype=object)})
        responses.close()  # the final flag: nothing more comes for this request
