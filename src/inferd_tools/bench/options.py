"""`inferd bench`'s command line, and the options that shape each request, shared with
`inferd tune` (which measures with the bench engine). Kept free of heavy imports: every
`inferd` command builds the parser."""

from __future__ import annotations

import argparse

from inferd.public import DefaultsOnceFormatter


def add_request_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http-binary",
        action="store_true",
        help="HTTP: send tensors with the binary tensor extension and ask for binary outputs "
        "(what perf_analyzer does); default: JSON",
    )
    parser.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE.json",
        help='input values: random, zeros, or a JSON file: {"input name": [values...]} (one '
        "request), or perf_analyzer's --input-data format "
        '{"data": [{"input name": {"content": [...], "shape": [...]}}, ...]}, one request per '
        "entry, sent in turn",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2",
        help="shape of an input with variable dims, without the batch dim (repeatable)",
    )
    parser.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per-request timeout")


def add_bench_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser(
        "bench",
        help="load a v2 server (inferd, Triton, MLServer) and measure latency and throughput",
        description="A load generator for any KServe v2 / Triton-protocol server, "
        "perf_analyzer's kind: closed loop (--concurrency) or open loop (--request-rate), "
        "over HTTP (JSON or binary tensors) or gRPC. See docs/bench.md.",
        formatter_class=DefaultsOnceFormatter,
    )
    bench.add_argument("-m", "--model", required=True, help="model to load")
    bench.add_argument(
        "-x", "--model-version", default="", help="model version (default: the server's choice)"
    )
    bench.add_argument(
        "-u",
        "--url",
        default=None,
        help="server address host:port (default 127.0.0.1:8000, or :8001 with -i grpc)",
    )
    bench.add_argument(
        "-i", "--protocol", choices=["http", "grpc"], default="http", help="protocol to load over"
    )
    add_request_options(bench)
    load = bench.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        default="1",
        metavar="LEVELS",
        help="closed loop: requests kept outstanding; a list 1,8,64, a range 1:16:4 or a "
        "geometric range 1:64:x2",
    )
    load.add_argument(
        "--request-rate",
        default=None,
        metavar="RATES",
        help="open loop: requests per second (list or range as for --concurrency); latency "
        "counts from each request's intended send time",
    )
    bench.add_argument(
        "--poisson",
        action="store_true",
        help="open loop: Poisson arrivals instead of evenly spaced",
    )
    bench.add_argument(
        "--warmup-s", type=float, default=2.0, help="seconds of load before measuring"
    )
    bench.add_argument("--window-s", type=float, default=5.0, help="length of a measurement window")
    bench.add_argument(
        "--stability-percentage",
        type=float,
        default=10.0,
        help="stable: 3 consecutive windows whose throughput and p99 are each within this "
        "percentage of their mean",
    )
    bench.add_argument(
        "--max-windows", type=int, default=10, help="windows measured at most, stable or not"
    )
    bench.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="measure one window of this length instead of waiting for stability",
    )
    bench.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes sharing the load (1: in the main process)",
    )
    bench.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="open loop: requests in flight at most; later ones wait in the client, and "
        "their wait counts as latency",
    )
    bench.add_argument(
        "--stats-url",
        default=None,
        metavar="HOST:PORT",
        help="read the server's statistics over HTTP here (default: the protocol used)",
    )
    bench.add_argument("--csv", default=None, metavar="FILE", help="write one row per level")
    bench.add_argument("--json", default=None, metavar="FILE", help="write the full results")
    bench.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="plot p50 and p99 against throughput (needs matplotlib: the 'bench' extra)",
    )
    bench.add_argument(
        "--progress",
        action="store_true",
        help="show the live progress line even when stderr is not a terminal",
    )
