"""Loading one model version: its instances, their warm-up, and the scheduler that runs
its batches (the registry decides which versions to load, and swaps them in)."""

from __future__ import annotations

import asyncio
import encodings.cp437  # noqa: F401  (imported before any model loads: see below)
import logging
import time
from pathlib import Path

import numpy.random  # noqa: F401  (idem)

from inferd.backends.base import Backend, RequestListInstance
from inferd.backends.python.pb_utils.host import HostProvider
from inferd.config.model_config import backend_name
from inferd.events import Telemetry
from inferd.monitoring.drift_setup import monitor_for_load
from inferd.repository.loader import load_instances, model_file
from inferd.repository.model_state import ModelVersion, State
from inferd.repository.warmup import warm_up
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.sequence.sequence_batcher import SequenceBatcher

# numpy 2 imports numpy.random lazily, at the first `np.random` a process runs. Versions load
# in threads, several at once, and two models' first uses racing there failed a load with
# KeyError: 'numpy.random.mtrand' (CI: the example repository's `recall`). Imported with
# this module, before any model's code runs, it is never first imported by two threads.
# The same for the codec zipfile decodes member names with: two drift references (.npz, a
# zip) read at once failed a load with KeyError: 'encodings.cp437' (CI: test_deploy.py).

log = logging.getLogger("inferd.repository")


async def load_version(
    mv: ModelVersion,
    backend: Backend,
    model_dir: Path,
    model_host: HostProvider | None,
    telemetry: Telemetry,
) -> None:
    """One load attempt of one version: its instances, their warm-up, its scheduler. A
    failure leaves it UNAVAILABLE with the reason; success, READY."""
    version_dir = model_dir / mv.version
    count = mv.spec.instance_count
    started = time.monotonic()
    try:
        if model_file(backend, version_dir) is None:
            raise RuntimeError(
                f"{mv.name}/{mv.version}/ holds no {' or '.join(backend.model_files)}"
            )
        # Drift monitoring's reference first: a bad reference.npz fails the load, naming it,
        # before any instance is built.
        drift = await asyncio.to_thread(
            monitor_for_load, mv.name, mv.version, mv.config, mv.spec.drift, version_dir
        )
        instances = await asyncio.to_thread(
            load_instances,
            backend,
            mv.name,
            mv.version,
            mv.config,
            version_dir,
            mv.spec,
            model_host,
        )
        if mv.signature.ragged.padding is not None and any(
            isinstance(inst, RequestListInstance) for inst in instances
        ):
            for inst in instances:
                inst.close()
            raise RuntimeError(
                f"{mv.name}/config.pbtxt: parameters.pad_inputs: {mv.name}/{mv.version}/"
                "model.py implements execute(requests), which sees each request at its own "
                "length; padding is for a model that takes the merged batch"
            )
    except Exception as exc:
        mv.state = State.UNAVAILABLE
        mv.reason = f"load failed: {exc}"
        # The text, not the exception: its traceback holds the model's frames, and a
        # handler that keeps records would keep the failed version alive with them.
        log.error("model %s version %s failed to load: %s", mv.name, mv.version, str(exc))
        return
    loaded = time.monotonic()
    try:
        warmed = await asyncio.to_thread(
            warm_up,
            instances,
            mv.config,
            model_dir,
            mv.signature,
            mv.sequence,
            mv.spec.auto_warmup,
        )
    except Exception as exc:
        for inst in instances:
            inst.close()
        mv.state = State.UNAVAILABLE
        mv.reason = f"load failed: {exc}"
        log.error("model %s version %s failed to warm up: %s", mv.name, mv.version, str(exc))
        return
    if warmed.warning:
        mv.warning = warmed.warning
        log.warning("model %s version %s: %s", mv.name, mv.version, warmed.warning)
    if mv.sequence is not None:
        mv.batcher = SequenceBatcher(
            mv.name,
            instances,
            mv.sequence,
            mv.version,
            telemetry,
            execution_timeout_s=mv.execution_timeout_s,
            unready_after_failures=mv.spec.unready_after_failures,
        )
    else:
        mv.batcher = DynamicBatcher(
            mv.name,
            instances,
            mv.spec.batching,
            mv.version,
            telemetry,
            mv.signature.ragged,
            execution_timeout_s=mv.execution_timeout_s,
            unready_after_failures=mv.spec.unready_after_failures,
            probe_sample=warmed.probe,
        )
    if drift is not None and isinstance(mv.batcher, DynamicBatcher | SequenceBatcher):
        drift.start()
        mv.batcher.observe(drift)
        mv.drift = drift
    mv.devices = [inst.device for inst in instances]
    mv.providers = [inst.provider for inst in instances]
    mv.load_duration_s = loaded - started
    mv.warmup_duration_s = time.monotonic() - loaded
    mv.state = State.READY
    log.info(
        "loaded model %s version %s (%s, %d instance%s on %s, max_batch_size %d, "
        "batching %s) in %.2fs, warm-up %.2fs (%d sample%s)",
        mv.name,
        mv.version,
        backend_name(mv.config),
        count,
        "" if count == 1 else "s",
        ",".join(sorted(set(mv.devices))),
        mv.config.max_batch_size,
        _batching(mv),
        mv.load_duration_s,
        mv.warmup_duration_s,
        warmed.samples,
        "" if warmed.samples == 1 else "s",
    )
    delay_us = mv.config.dynamic_batching.max_queue_delay_microseconds
    batching = mv.spec.batching
    if (
        delay_us
        and mv.sequence is None
        and batching.batches
        and batching.policy == "work_conserving"
    ):
        # Triton waits up to the delay for a fuller batch; inferd's default never waits. Said
        # once per load, so that a config ported from Triton does not differ silently.
        log.info(
            "model %s version %s: notice: dynamic_batching.max_queue_delay_microseconds "
            "(%d) is an upper bound under inferd's default batching_policy work_conserving: "
            "a batch leaves at once when an instance is free. Triton waits up to the delay "
            "for a fuller batch: parameters.batching_policy `window` does that "
            "(docs/batching.md)",
            mv.name,
            mv.version,
            delay_us,
        )


def _batching(mv: ModelVersion) -> str:
    if mv.sequence is not None:
        return f"sequence ({mv.sequence.strategy})"
    return mv.spec.batching.policy if mv.config.max_batch_size else "off"
