"""`inferd bench`: a load generator for any KServe v2 / Triton-protocol server.

Closed loop (a fixed number of outstanding requests) or open loop (a request rate, latency
measured from each request's intended send time), over HTTP (a lean asyncio HTTP/1.1
client; JSON or binary tensors) or gRPC (grpc.aio, raw tensors), spread over worker
processes if asked. See docs/bench.md.
"""

from __future__ import annotations

from inferd_tools.bench.errors import BenchError

__all__ = ["BenchError"]
