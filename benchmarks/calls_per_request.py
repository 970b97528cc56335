"""Python function calls per request on the in-process path: an identity model (FP32 [1, 64],
max batch 8), each request through the DataPlane's steps as an adapter takes them (start,
admit, infer, respond), counted with cProfile after a warm-up. Counts, unlike seconds, hold
on a busy machine: compare two commits by pointing `--tree` at a worktree of the other.

    .venv/bin/python benchmarks/calls_per_request.py [--requests 500] [--top 15]
    git worktree add ../before <commit>
    .venv/bin/python benchmarks/calls_per_request.py --tree ../before

`--tree` runs the same measurement on that checkout's `src/` (this venv's packages): the
script itself knows the layouts before and after the packages of docs/architecture.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--top", type=int, default=0, help="also list the N most called")
    parser.add_argument("--tree", type=Path, help="measure this checkout's src/ instead")
    args = parser.parse_args()
    if args.tree is not None:
        env = {**os.environ, "PYTHONPATH": str(args.tree.resolve() / "src")}
        argv = [sys.executable, __file__, "--requests", str(args.requests), "--top", str(args.top)]
        sys.exit(subprocess.run(argv, env=env, check=False).returncode)
    sys.path.insert(0, str(HERE.parent))  # examples/build_models.py's builders, via tests
    asyncio.run(measure(args.requests, args.top))


async def measure(requests: int, top: int) -> None:
    from onnx import TensorProto
    from tests.support.models import builders

    import inferd
    from inferd.events import CallContext, Telemetry
    from inferd.repository.registry import ModelRegistry
    from inferd.types import InferRequest, Tensor

    try:
        from inferd.dataplane.plane import DataPlane
    except ImportError:  # the layout before docs/architecture.md's packages
        from inferd.dataplane import DataPlane  # type: ignore[attr-defined,no-redef]

    root = Path(tempfile.mkdtemp()) / "repo"
    model = builders.identity(TensorProto.FLOAT, ["batch", "n"])
    builders._save(model, root / "identity" / "1" / "model.onnx")
    config = 'name: "identity"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
    (root / "identity" / "config.pbtxt").write_text(config)
    telemetry = Telemetry()
    registry = ModelRegistry(root, telemetry)
    plane: Any = DataPlane(registry, telemetry)
    await registry.load_all()
    x = np.ones((1, 64), np.float32)

    async def one() -> None:
        ctx = CallContext("http", "127.0.0.1:1", "", time.time(), time.perf_counter_ns())
        with plane.start("identity", "", ctx) as call:
            plane.admit(call)
            tensor = Tensor("INPUT0", "FP32", (1, 64), x)
            request = InferRequest(model_name="identity", model_version="", inputs=[tensor])
            plane.respond(call, await plane.infer(call, request))

    for _ in range(200):
        await one()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(requests):
        await one()
    profile.disable()
    await registry.unload_all()
    stats = pstats.Stats(profile)
    source = Path(inferd.__file__).parent
    print(f"{source}: {stats.total_calls / requests:.1f} calls per request ({requests} requests)")
    if top:
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])[:top]  # type: ignore[attr-defined]
        for (file, line, name), (_, calls, *_rest) in rows:
            print(f"  {calls / requests:6.1f}  {Path(file).name}:{line} {name}")


if __name__ == "__main__":
    main()
