"""The `parameters` keys of a model config that inferd and its backends read.

A key nobody reads would be silently ignored, so for the ONNX Runtime and PyTorch backends an
unknown key fails the load, naming it and the accepted keys. Python models read their own
keys (inferd's `context.parameters`, Triton's `args['model_config']`), so for them unknown
keys are passed through; only keys that Triton's Python backend itself acts on, and inferd
does not, are refused. docs/model-config.md lists these tables; a test checks that every key
the source reads is here.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

# Read by inferd itself, whatever the backend: key -> what it does.
INFERD_PARAMETERS: dict[str, str] = {
    "batching_policy": "`work_conserving` (default), `window` or `none` (docs/batching.md)",
    "auto_warmup": "`false` turns the automatic warm-up off (docs/lifecycle.md)",
    "unready_after_failures": (
        "after this many failed executions in a row, an input the model served (or its "
        "warm-up sample) is executed again: readiness turns false only if that fails too "
        "(at once for a model with nothing to probe with); default 5, 0 never "
        "(docs/reliability.md#failing-or-fed-garbage)"
    ),
    "execution_timeout_ms": (
        "how long one execution may take before its requests fail with 504 and its instance "
        "is taken out of service; default `--execution-timeout-ms` (decoupled models: none), "
        "0 none (docs/reliability.md)"
    ),
    "pad_inputs": (
        "`input:pad_value, ...`: requests of any length in these inputs' one variable "
        "dimension batch together, padded to the batch's longest (docs/batching.md#padding)"
    ),
    "padded_outputs": "outputs carrying the padded dimension, cut back to each request's length",
    "pad_grouping_waste": (
        "with pad_inputs: the padding a batch may carry, as a share of its real elements, when "
        "batches are grouped by length; default 0.25, `off` keeps queue order"
    ),
    "pad_grouping_window": "queued requests looked at for a batch of similar length; 4 batches",
    "max_input_shape": "per-input bound on the non-batch dims, JSON (docs/limits.md)",
    "max_input_elements": "elements per input tensor (docs/limits.md)",
    "max_bytes_element_size": "bytes per BYTES element (docs/limits.md)",
    "text_inputs": (
        "BYTES inputs the model decodes as UTF-8 (`a,b`): other bytes are refused with 400 "
        "before batching (docs/limits.md)"
    ),
    "canary_weights": 'traffic split, JSON `{"2": 10, "1": 90}` (docs/lifecycle.md)',
    "canary_auto_rollback": "`true`: a failing canary loses its traffic (docs/lifecycle.md)",
    "canary_window_s": "the canary guard's window (docs/lifecycle.md)",
    "canary_min_requests": "requests in the window before the guard judges (docs/lifecycle.md)",
    "canary_error_rate_margin": "error rate a canary may exceed stable's by (docs/lifecycle.md)",
    "canary_p99_ratio": "p99 a canary may reach, times stable's (docs/lifecycle.md)",
    "circuit_breaker_failures": "model errors in a row that open the circuit (docs/reliability.md)",
    "circuit_breaker_error_rate": "error rate that opens the circuit (docs/reliability.md)",
    "circuit_breaker_window_s": "the error-rate window (docs/reliability.md)",
    "circuit_breaker_min_requests": "requests before the rate counts (docs/reliability.md)",
    "circuit_breaker_open_s": "how long the circuit stays open (docs/reliability.md)",
    "fallback_model": (
        "where requests go while the circuit is open, and a degradation tier's `fallback` "
        "(docs/reliability.md)"
    ),
    "degrade_p99_ms": (
        "degradation tiers, `P99_MS: ACTION ...; ...` with actions fallback[=N%], stale, "
        "queue=N, open_circuit, rollback (docs/reliability.md#degradation-tiers)"
    ),
    "degrade_window_s": "the degradation p99's window; default 10 (docs/reliability.md)",
    "degrade_min_requests": "requests in the window before a tier moves; default 20",
    "degrade_release_ratio": "a tier is left under its threshold x this; default 0.8",
    "degrade_dwell_s": "the least time in a tier before moving down; default 10",
    "degrade_probe_interval_ms": (
        "while a tier sends everything away, one probe per this still reaches the model; "
        "default 100"
    ),
    "degrade_stale_s": "with a `stale` tier: seconds entries are kept past their TTL; 300",
    "degrade_rollback_within_s": "a `rollback` tier undoes a promote this recent; default 600",
    "health_p99_baseline_ms": "the p99 the health score compares with (docs/metrics.md)",
    "capture_sample_rate": (
        "share of answered requests captured for --capture-dir and feedback, 0..1; default 0 "
        "(docs/capture.md)"
    ),
    "accuracy_window": "labelled rows the online accuracy is over; default 1000 (docs/capture.md)",
    "accuracy_output": "the class output feedback labels are judged on; default the first",
    "feedback_ttl_s": "how long a captured prediction waits for its label; default 3600",
    "canary_accuracy_margin": (
        "with canary_auto_rollback: online accuracy a canary may fall below stable's by "
        "(docs/capture.md)"
    ),
    "drift_reference": (
        "`file` (default when `<version>/reference.npz` exists), `first:K` (the first K rows "
        "served) or `none` (docs/monitoring.md)"
    ),
    "drift_window": "rows per drift window, default 1000 (docs/monitoring.md)",
    "drift_sample_rate": "0..1, share of executed batches sampled, default 1 (docs/monitoring.md)",
    "drift_max_columns": "flattened columns tested per tensor, default 64 (docs/monitoring.md)",
    "drift_cpu_budget": "share of one core the drift tests may use, 0.02 (docs/monitoring.md)",
    "drift_p_value_threshold": "KS / chi-square alert below, default 0.001 (docs/monitoring.md)",
    "drift_psi_threshold": "PSI alert threshold, default 0.2 (docs/monitoring.md)",
    "drift_class_outputs": "outputs tested as predicted classes, `a,b` (docs/monitoring.md)",
    "cache_ttl_seconds": (
        "with response_cache: seconds an answer stays cached (default: the tier's; docs/cache.md)"
    ),
    "cache_max_entries": "with response_cache: the model's entries in the local tier, at most",
    "cache_max_response_bytes": (
        "with response_cache: larger answers are not cached; default 1 MiB (docs/cache.md)"
    ),
    "cache_float_decimals": (
        "with response_cache: float inputs rounded to N decimals (0..15) before keying"
    ),
    "cache_text_normalize": (
        "with response_cache: BYTES inputs normalised before keying, any of strip,space,lower,nfc"
    ),
    "model_checksum": (
        "set by inferd in the config it serves (the files' sha256); a value given is replaced"
    ),
}

# Read by one backend: backend -> key -> what it does.
BACKEND_PARAMETERS: dict[str, dict[str, str]] = {
    "onnxruntime": {
        "intra_op_thread_count": "threads per session (default: cores / instances)",
        "inter_op_thread_count": "ONNX Runtime's inter-op threads (default 0: its own choice)",
        "execution_mode": "0 sequential (default), 1 parallel",
    },
    "pytorch": {
        "INTRA_OP_THREAD_COUNT": "torch's intra-op threads, process-wide (default: cores / N)",
        "intra_op_thread_count": "the same as INTRA_OP_THREAD_COUNT",
        "torch_compile": "`true`: torch.compile the module at load (docs/pytorch-models.md)",
    },
    "python": {
        "isolation": "`thread` (default) or `process`, its own worker (docs/python-models.md)",
        "EXECUTION_ENV_PATH": (
            "the model's own environment, as Triton's: a conda-pack archive or a virtual "
            "environment's folder; its worker process runs that interpreter "
            "(docs/python-models.md#the-models-own-environment)"
        ),
    },
}

# Backends whose models receive the whole config and read custom keys themselves.
PASS_THROUGH_BACKENDS = ("python",)


def accepted_keys(backend: str) -> list[str]:
    return sorted({*INFERD_PARAMETERS, *BACKEND_PARAMETERS.get(backend, {})})


def refused_parameters(config: mc.ModelConfig, backend: str) -> list[tuple[str, str]]:
    """(key, why) for each `parameters` key the model's backend would ignore."""
    found: list[tuple[str, str]] = []
    for key in sorted(config.parameters):
        if key in INFERD_PARAMETERS or key in BACKEND_PARAMETERS.get(backend, {}):
            continue
        if backend not in PASS_THROUGH_BACKENDS:
            found.append(
                (
                    key,
                    f"neither inferd nor the {backend or 'model'} backend reads it; accepted "
                    f"keys: {', '.join(accepted_keys(backend))}",
                )
            )
    return found
