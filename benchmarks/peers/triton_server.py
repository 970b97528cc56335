"""Serve "tiny" or "mlp" with NVIDIA PyTriton (Triton Inference Server + Python callable).

    benchmarks/peers/run_peer.sh triton tiny 8100     # preferred: sets LD_LIBRARY_PATH
    .venv-triton/bin/python triton_server.py --model tiny --port 8100

HTTP on --port, gRPC on --port+1, metrics on --port+2 (override with --grpc-port/--metrics-port).
Dynamic batching: max_batch_size 32, max_queue_delay 2 ms. One model instance.

Trap: Triton's Python-backend stub (bundled by PyTriton) dlopens libpython3.11.so; unless
LD_LIBRARY_PATH starts with this interpreter's sysconfig LIBDIR, it can load the system
libpython instead and the model never loads. This script re-execs itself with it set.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import sysconfig

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common_models  # noqa: E402


def _ensure_libdir() -> None:
    libdir = sysconfig.get_config_var("LIBDIR")
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and not current.startswith(libdir):
        os.environ["LD_LIBRARY_PATH"] = libdir + (":" + current if current else "")
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(common_models.SIGNATURES), required=True)
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument("--grpc-port", type=int, default=None, help="default: --port + 1")
    p.add_argument("--metrics-port", type=int, default=None, help="default: --port + 2")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    _ensure_libdir()

    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    model = common_models.load(args.model)
    in_name = common_models.SIGNATURES[args.model][0][0][0]

    @batch
    def infer_fn(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return model(inputs[in_name])

    ins, outs = common_models.SIGNATURES[args.model]
    config = TritonConfig(
        http_port=args.port,
        grpc_port=args.grpc_port or args.port + 1,
        metrics_port=args.metrics_port or args.port + 2,
        log_verbose=1 if args.verbose else 0,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=infer_fn,
            inputs=[Tensor(name=n, dtype=d, shape=s) for n, d, s in ins],
            outputs=[Tensor(name=n, dtype=d, shape=s) for n, d, s in outs],
            config=ModelConfig(
                max_batch_size=common_models.MAX_BATCH,
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=int(common_models.MAX_DELAY_S * 1e6)
                ),
            ),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
