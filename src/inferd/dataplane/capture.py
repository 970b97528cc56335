"""Sampled capture of answered requests (docs/capture.md).

`DataPlane.respond` hands an answered unary request here, whatever the protocol, when the
version that answered samples (its `capture_sample_rate`, copied into the request's record
as `capture_rate`): a version at 0, the default, costs nothing here. A sampled request:

- gets an id if its client sent none (16 random hex digits per process, then a counter in
  hex; the response carries it, so a client can send feedback), and keeps its own otherwise;
- leaves its predicted classes in the feedback index (feedback.py), with or without
  `--capture-dir`;
- with `--capture-dir` (and/or `--capture-redis`), is offered to each writer's bounded
  queue (capture_writer.py, capture_redis.py), which stores it on its own thread. Nothing
  is copied on the event loop except inputs in shared memory and those of `--engine`'s
  hop (views of a front end's slab), which their sender reuses once answered.

Nothing here can fail a request: a capture that cannot be kept is dropped and counted.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from random import random
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.errors import invalid, not_found
from inferd.events import Gone, forget_keys
from inferd.monitoring.accuracy import canary_is_worse
from inferd.monitoring.capture_files import CapturedRequest
from inferd.monitoring.capture_redis import RedisCaptureWriter
from inferd.monitoring.capture_settings import CaptureSettings
from inferd.monitoring.capture_writer import CaptureQueue, CaptureWriter, DropCounts
from inferd.monitoring.feedback import FeedbackIndex
from inferd.types import InferRequest, InferResponse, Tensor

if TYPE_CHECKING:
    from inferd.events import RequestRecord
    from inferd.repository.model_state import ModelVersion
    from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.capture")
routing_log = logging.getLogger("inferd.routing")  # rollbacks log where the guard's do


class Capture:
    def __init__(
        self,
        registry: ModelRegistry,
        settings: CaptureSettings | None = None,
        single_process: bool = True,
    ) -> None:
        """`single_process`: False in a worker of --workers N, where feedback is refused."""
        self.registry = registry
        self.settings = settings or CaptureSettings()
        self.drops = DropCounts()
        self.writer = CaptureWriter(self.settings, self.drops) if self.settings.directory else None
        # Every store a capture goes to: the directory's shards, a Redis stream, both.
        self.writers: list[CaptureQueue] = [self.writer] if self.writer is not None else []
        if self.settings.redis_url:
            s = self.settings
            self.writers.append(
                RedisCaptureWriter(s.redis_url, s.redis_stream, s.redis_maxlen, self.drops)
            )
        self.feedback = FeedbackIndex()
        self.captured: dict[tuple[str, str], int] = {}  # (model, version): sampled requests
        self.single_process = single_process
        # Server-made request ids: random per process (unique across restarts and workers),
        # then a counter (cheaper than a uuid per sampled request).
        self._id_prefix = secrets.token_hex(8)
        self._ids = itertools.count(1)
        self._logged_at = -60.0

    def start(self) -> None:
        for writer in self.writers:
            writer.start()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

    def forget(self, gone: Gone) -> None:
        """Unloaded versions' counts and feedback, and unloaded models' drops, go."""
        forget_keys(self.captured, gone)
        self.drops.forget(gone)
        self.feedback.forget(gone)

    def observe(self, record: RequestRecord, response: InferResponse) -> None:
        """An answered request, before it is encoded: captured or not, by its version's rate."""
        model = self.registry.models.get(response.model_name)
        mv = model.versions.get(response.model_version) if model is not None else None
        if mv is None:
            return
        rate = mv.spec.capture.sample_rate
        if rate == 0.0 or random() >= rate:  # rate 1: always (random() < 1)
            return
        request = record.request
        if request is None:
            return
        try:
            self._capture(mv, record, request, response)
        except Exception:  # a bug here must cost the capture, never the request
            self.drops.add(mv.name, "internal")
            now = time.monotonic()
            if now - self._logged_at >= 60:
                self._logged_at = now
                log.exception("capture of a request of model %s failed: dropped", mv.name)

    def _capture(
        self,
        mv: ModelVersion,
        record: RequestRecord,
        request: InferRequest,
        response: InferResponse,
    ) -> None:
        request_id = request.id or f"{self._id_prefix}{next(self._ids):x}"
        response.id = record.request_id = request_id
        key = (mv.name, mv.version)
        self.captured[key] = self.captured.get(key, 0) + 1
        self.feedback.remember(
            mv.name, mv.version, mv.spec.capture, mv.signature, request_id, response
        )
        if not self.writers:
            return
        inputs = request.inputs
        if request.uses_shared_memory or request.inputs_borrowed:
            inputs = [_copied(t) for t in inputs]
        # Outputs written to shared memory carry no data in the response: left out.
        outputs = [t for t in response.outputs if t.shared_memory is None]
        nbytes = sum(t.data.nbytes for t in inputs) + sum(t.data.nbytes for t in outputs)
        wall = record.ctx.wall_start_s or time.time()
        captured = CapturedRequest(
            request_id, wall, mv.name, mv.version, record.ctx.protocol, inputs, outputs, nbytes
        )
        for writer in self.writers:
            writer.offer(captured)

    def join_feedback(self, model: str, doc: dict[str, Any]) -> dict[str, Any]:
        """`POST /v2/models/{model}/feedback`: a label joined to its captured prediction."""
        if model not in self.registry.models:
            raise not_found(f"unknown model '{model}'")
        if all(
            v.spec.capture.sample_rate == 0 for v in self.registry.models[model].versions.values()
        ):
            raise invalid(
                f"model '{model}' captures no predictions to join labels to: set its "
                "parameter capture_sample_rate above 0 (docs/capture.md)"
            )
        if not self.single_process:
            raise invalid(
                "feedback needs a server of one process: with --workers N the prediction "
                "is kept by the worker that answered, which need not be this one (with "
                "--workers N --engine the engine keeps them all)"
            )
        answer = self.feedback.join(model, doc)
        self._judge_canaries(model)
        return answer

    def _judge_canaries(self, name: str) -> None:
        """With `canary_auto_rollback` and `canary_accuracy_margin`: a canary whose online
        accuracy falls below stable's by more than the margin loses its traffic, through the
        router's guard rollback, as the canary guard does for errors and latency. Judged at
        each label (of stable's or a canary's: either may be the one that decides)."""
        model = self.registry.models[name]
        router = model.router
        stable = router.stable
        if not router.policy.enabled or stable is None:
            return
        windows = self.feedback.windows
        base = windows.get((name, stable))
        for version, weight in list(router.weights.items()):
            mv = model.versions.get(version)
            if version == stable or weight == 0 or mv is None:
                continue
            margin = mv.spec.capture.accuracy_margin
            canary = windows.get((name, version))
            if margin is None or not canary_is_worse(
                canary, base, margin, router.policy.min_requests
            ):
                continue
            router.guard_rollback(version)
            assert canary is not None and base is not None
            routing_log.warning(
                "automatic rollback: model %s version %s weight -> 0 (online accuracy %.1f%% "
                "vs stable v%s %.1f%%, margin %.1f points)",
                name,
                version,
                100 * (canary.value or 0.0),
                stable,
                100 * (base.value or 0.0),
                100 * margin,
                extra={"model": name, "version": version, "event": "canary_rollback"},
            )

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until what was captured so far is stored (from any thread but the loop's)."""
        flushed = [writer.flush(timeout_s) for writer in self.writers]  # each, not the first
        return all(flushed)


def _copied(t: Tensor) -> Tensor:
    return Tensor(t.name, t.datatype, t.shape, np.array(t.data, copy=True))
