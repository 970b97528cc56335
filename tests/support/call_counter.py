"""Counting the Python calls of inferd's own functions per request, in every thread (the
server's event loop, the instances' executor threads): counts hold on a busy machine where
timings do not. Only code under `src/inferd` is counted, so the figure is inferd's own work,
not the event loop's or a library's, and does not move with how the loop happened to wake."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

import inferd

SOURCE = str(Path(inferd.__file__).parent) + "/"


class CallCounter:
    """A profile function (sys.setprofile) that counts, while `counting`, each call of a
    function defined under src/inferd, by `<path under src/inferd>:<qualified name>`."""

    def __init__(self) -> None:
        self.counting = False
        self.calls: Counter[str] = Counter()
        self._names: dict[Any, str | None] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.counting:
            return
        code = frame.f_code
        name = self._names.get(code, "")
        if name == "":
            name = self._names[code] = (
                f"{code.co_filename[len(SOURCE) :]}:{code.co_qualname}"
                if code.co_filename.startswith(SOURCE)
                else None
            )
        if name is not None:
            self.calls[name] += 1


@contextmanager
def profiled_threads(counter: CallCounter) -> Iterator[None]:
    """`counter` sees this thread and every thread started inside the block (a server's,
    its executors'): start the server inside it."""
    threading.setprofile(counter)
    sys.setprofile(counter)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def calls_per_request(
    counter: CallCounter, request: Callable[[], object], n: int, warmup: int = 50
) -> dict[str, float]:
    """inferd's calls per request, by function, over `n` requests made one after another
    (after `warmup` uncounted ones)."""
    for _ in range(warmup):
        request()
    counter.calls.clear()
    counter.counting = True
    try:
        for _ in range(n):
            request()
    finally:
        counter.counting = False
    return {name: count / n for name, count in counter.calls.items()}


def grpc_request(
    address: str, model: str, name: str, x: np.ndarray, stack: ExitStack, output: str = ""
) -> Callable[[], object]:
    """One gRPC infer of FP32 `x` as input `name` (asking for `output` alone, when given), to
    repeat while counting; its client closes with `stack`."""
    client = grpcclient.InferenceServerClient(address)
    stack.callback(client.close)
    inp = grpcclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outputs = [grpcclient.InferRequestedOutput(output)] if output else None
    return lambda: client.infer(model, [inp], outputs=outputs)
