"""gRPC's own ceiling beside inferd's HTTP binary and gRPC: how far can inferd's gRPC go?

One inferd process serves the peers' `tiny` (benchmarks/peers/inferd_repo.py); beside it a
bare grpc.aio server (this file with `--stub`) answers Triton's metadata and config calls with
inferd's own answers and every ModelInfer with one canned response, doing no work at all: no
parsing, no model, no inferd code. perf_analyzer (C++ client, concurrency 64) loads, in turn
and alternating order each round, inferd over HTTP binary, inferd over gRPC, and the stub.

    .venv/bin/python benchmarks/grpc_ceiling.py [--rounds 3] [--duration-s 5] [--concurrency 64]
        [--stub-uvloop] [--stability 50] [--engine N]

The stub's throughput is the most any server built on grpcio's asyncio server can answer on
this machine with this client; divided by inferd's HTTP binary figure it bounds what inferd's
gRPC can reach relative to its HTTP (docs/benchmarks.md, "gRPC's ceiling").
`--stub-uvloop` runs the stub on uvloop, as inferd runs. `--engine N` adds a second inferd,
`--workers N --engine` (N front ends owning the ports, one engine: docs/workers.md), loaded
over HTTP binary and gRPC in the same rounds: grpcio's per-call work then runs in the front
ends' processes, off the engine's thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.ab_commits import ROOT, Run, _perf_analyzer, repository  # noqa: E402
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

METHODS = ("ServerLive", "ServerReady", "ModelReady", "ModelMetadata", "ModelConfig",
           "ServerMetadata")  # fmt: skip


def stub(source: str, model: str, port: int, use_uvloop: bool) -> None:
    """Serve `model`'s metadata and config as `source` (an inferd gRPC address) answers them,
    and one canned ModelInfer response to every request."""
    import grpc
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2 as pb

    client = grpcclient.InferenceServerClient(source)
    answers = {
        "ServerLive": pb.ServerLiveResponse(live=True),
        "ServerReady": pb.ServerReadyResponse(ready=True),
        "ModelReady": pb.ModelReadyResponse(ready=True),
        "ModelMetadata": client.get_model_metadata(model),
        "ModelConfig": client.get_model_config(model),
        # No extensions named: perf_analyzer then asks for no statistics (the stub keeps none)
        "ServerMetadata": pb.ServerMetadataResponse(name="bare-grpc-aio", version="0"),
    }
    (tensor,) = answers["ModelMetadata"].inputs
    shape = [1 if d < 0 else d for d in tensor.shape]
    x = grpcclient.InferInput(tensor.name, shape, tensor.datatype)
    x.set_data_from_numpy(np.ones(shape, np.float32))
    canned = client.infer(model, [x]).get_response().SerializeToString()
    client.close()

    def answer(response: object) -> object:
        async def method(request: object, context: object) -> object:
            return response

        return method

    async def infer(request: bytes, context: object) -> bytes:
        return canned

    handlers = {
        m: grpc.unary_unary_rpc_method_handler(
            answer(answers[m]),
            request_deserializer=getattr(pb, f"{m}Request").FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
        for m in METHODS
    }
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(infer)

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("serving", flush=True)
        await server.wait_for_termination()

    if use_uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stub-uvloop", action="store_true")
    parser.add_argument(
        "--stability", type=int, default=50,
        help="perf_analyzer's --stability-percentage (raise it on a busy machine)",
    )  # fmt: skip
    parser.add_argument(
        "--engine", type=int, default=0, metavar="N",
        help="also load `inferd serve --workers N --engine` (0: not)",
    )  # fmt: skip
    parser.add_argument("--stub", nargs=2, metavar=("SOURCE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = "tiny"
    args.max_trials = 10  # windows perf_analyzer may take to find 3 stable ones
    if args.stub:
        stub(args.stub[0], args.model, int(args.stub[1]), args.stub_uvloop)
        return
    root = Path(tempfile.mkdtemp(prefix="inferd-grpc-ceiling-"))
    repo = repository(root)
    http, grpc_port, stub_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
         "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", "0",
         "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    bare = engine = None
    try:
        wait_until_serving(server.pid, http, exit_code=server.poll, listeners=1)
        if args.engine:
            e_http, e_grpc = free_port(), free_port()
            engine = subprocess.Popen(
                [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
                 "--http-port", str(e_http), "--grpc-port", str(e_grpc), "--metrics-port",
                 "0", "--log-level", "WARNING", "--workers", str(args.engine), "--engine"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            wait_until_serving(engine.pid, e_http, exit_code=engine.poll, listeners=args.engine)
        bare = subprocess.Popen(
            [sys.executable, __file__, "--stub", f"127.0.0.1:{grpc_port}", str(stub_port),
             *(["--stub-uvloop"] if args.stub_uvloop else [])],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert bare.stdout is not None and bare.stdout.readline().strip() == "serving"
        targets = {
            "inferd http-binary": ("http-binary", http),
            "inferd grpc": ("grpc", grpc_port),
            "bare grpc.aio": ("grpc", stub_port),
        }
        if engine is not None:
            targets[f"engine{args.engine} http-binary"] = ("http-binary", e_http)
            targets[f"engine{args.engine} grpc"] = ("grpc", e_grpc)
        runs: dict[str, list[Run]] = {name: [] for name in targets}
        for r in range(args.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                wire, port = targets[name]
                runs[name].append(_perf_analyzer(args, wire, port))
                time.sleep(0.5)  # let the last connections close before the next load
        base = statistics.median(r[0] for r in runs["inferd http-binary"])
        print(f"tiny, perf_analyzer, concurrency {args.concurrency}, {args.rounds} alternating "
              f"rounds of {args.duration_s:g} s: infer/s each round; median p50 / p99 ms; "
              "median throughput / inferd http-binary's")  # fmt: skip
        for name, got in runs.items():
            rps = " / ".join(f"{r[0]:,.0f}" for r in got)
            p50 = statistics.median(r[1] for r in got)
            p99 = statistics.median(r[2] for r in got)
            ratio = statistics.median(r[0] for r in got) / base
            print(f"  {name:19} {rps}  (p50 {p50:.2f}, p99 {p99:.2f})  {ratio:.2f}x")
    finally:
        for process in (bare, engine, server):
            if process is not None:
                process.terminate()
                process.wait(timeout=60)


if __name__ == "__main__":
    main()
