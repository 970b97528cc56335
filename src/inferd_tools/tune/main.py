"""`inferd tune`: from parsed arguments to a sweep, its table and the chosen config."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from inferd.public import DefaultsOnceFormatter
from inferd_tools.bench.options import add_request_options
from inferd_tools.tune.errors import TuneError

if TYPE_CHECKING:
    from inferd_tools.tune.sweep import SweepSettings

# The sweep (and the bench engine with its HTTP client) is imported only when `tune` runs:
# building the parser must stay cheap, since every `inferd` command builds it.


def add_tune_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune",
        help="sweep a model's batching and instance settings and pick the best under a p99 budget",
        description="Load each candidate config (max_batch_size, preferred batch sizes, "
        "max_queue_delay_microseconds, instance count, and where given ONNX Runtime's "
        "intra-op threads and graph level and a padding model's length grouping) through the "
        "server's repository API (the server needs --admin-api on, or --model-control-mode "
        "explicit), measure it with the bench engine over HTTP or gRPC (-i), directly or "
        "through another model (--measure-model), and report the best: the highest throughput "
        "whose p99 is within --p99-ms. Loading always goes over HTTP (--url); with -i grpc the "
        "measurement goes to --grpc-url. The original config is loaded again at the end. "
        "See docs/tune.md.",
        formatter_class=DefaultsOnceFormatter,
    )
    tune.add_argument("model", metavar="MODEL", help="model to tune")
    tune.add_argument(
        "-u",
        "--url",
        default="127.0.0.1:8000",
        help="the server's HTTP address host:port: the repository API (loading candidates) "
        "and config calls always use it, and so does the measurement with -i http",
    )
    tune.add_argument(
        "-i",
        "--protocol",
        choices=["http", "grpc"],
        default="http",
        help="what the measurement uses, as for inferd bench",
    )
    tune.add_argument(
        "--grpc-url",
        default=None,
        metavar="HOST:PORT",
        help="with -i grpc: the server's gRPC address to measure at (default: --url's host "
        "and port + 1, e.g. 127.0.0.1:8001)",
    )
    tune.add_argument(
        "--p99-ms",
        type=float,
        default=None,
        help="latency budget: candidates whose p99 exceeds it are not picked (default: none)",
    )
    tune.add_argument(
        "--max-batch-sizes", default="1,8,32", metavar="LIST", help="max_batch_size values"
    )
    tune.add_argument(
        "--delays-us",
        default="0,2000",
        metavar="LIST",
        help="dynamic_batching.max_queue_delay_microseconds values",
    )
    tune.add_argument(
        "--instances", default="1,2", metavar="LIST", help="instance_group count values"
    )
    tune.add_argument(
        "--preferred",
        choices=["off", "on", "both"],
        default="off",
        help="dynamic_batching.preferred_batch_size: off (none), on ([max_batch_size]) or both",
    )
    tune.add_argument(
        "--intra-op-threads",
        default=None,
        metavar="LIST",
        help="ONNX Runtime models: parameters.intra_op_thread_count values (threads of each "
        "instance's session), e.g. 1,2; default: not swept, as the config has it",
    )
    tune.add_argument(
        "--graph-levels",
        default=None,
        metavar="LIST",
        help="ONNX Runtime models: optimization.graph.level values: -1 (basic), 0 (all), "
        "1 (extended), 2 (none); write --graph-levels=-1,0 (a list starting with -1 needs the "
        "=); default: not swept",
    )
    tune.add_argument(
        "--pad-grouping-waste",
        default=None,
        metavar="LIST",
        help="models with pad_inputs: parameters.pad_grouping_waste values (the padding a "
        "batch may carry, as a share of its real elements, or off: queue order), e.g. "
        "0.1,0.25,off; default: not swept",
    )
    tune.add_argument(
        "--pad-grouping-window",
        default=None,
        metavar="LIST",
        help="models with pad_inputs: parameters.pad_grouping_window values (queued requests "
        "looked at for a batch of similar length), e.g. 32,128; default: not swept",
    )
    tune.add_argument(
        "--measure-model",
        default=None,
        metavar="NAME",
        help="send the load to this model (e.g. the ensemble MODEL is a step of, as clients "
        "call it) while loading configs for MODEL and reading MODEL's statistics; default: "
        "MODEL itself",
    )
    tune.add_argument(
        "--concurrency", type=int, default=8, help="closed loop: requests kept outstanding"
    )
    tune.add_argument(
        "--duration-s", type=float, default=5.0, help="seconds measured per candidate"
    )
    tune.add_argument(
        "--warmup-s", type=float, default=1.0, help="seconds of unmeasured load per candidate"
    )
    add_request_options(tune)
    tune.add_argument(
        "--write-config",
        default=None,
        metavar="PATH",
        help="write the best candidate's config.pbtxt here",
    )
    tune.add_argument(
        "--keep-best",
        action="store_true",
        help="leave the best candidate loaded instead of restoring the original config",
    )


def _int_list(option: str, text: str, least: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < least for v in values):
        raise TuneError(f"{option} {text!r}: expected a list of integers >= {least}, e.g. 1,8,32")
    return sorted(set(values))


def _graph_levels(text: str) -> list[int]:
    from inferd_tools.tune.candidates import GRAPH_LEVELS

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v not in GRAPH_LEVELS for v in values):
        named = ", ".join(f"{k} ({v})" for k, v in GRAPH_LEVELS.items())
        raise TuneError(
            f"--graph-levels {text!r}: expected a list of optimization.graph.level values: {named}"
        )
    return sorted(set(values))


def _wastes(text: str) -> list[str]:
    from inferd.public import group_waste  # (reading it loads the config parser)

    out: set[str] = set()
    for raw in (v.strip() for v in text.split(",")):
        value = group_waste(raw)
        if value is None:
            raise TuneError(
                f"--pad-grouping-waste {text!r}: expected numbers >= 0 (the padding a batch may "
                f"carry, as a share of its real elements) or off, e.g. 0.1,0.25,off; got {raw!r}"
            )
        out.add("off" if value < 0 else f"{value:g}")
    return sorted(out, key=lambda v: math.inf if v == "off" else float(v))


def default_grpc_url(http_url: str) -> str:
    """inferd's layout: gRPC on the HTTP port + 1 (8000 and 8001), on the same host."""
    try:
        parts = urlsplit(http_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TuneError(f"--url {http_url!r}: expected host:port") from None
    host = parts.hostname or "127.0.0.1"
    if ":" in host:  # IPv6: the brackets urlsplit took off
        host = f"[{host}]"
    return f"{host}:{port + 1}"


def settings_from_args(args: argparse.Namespace) -> SweepSettings:
    from inferd_tools.bench.inputs import parse_shape_option
    from inferd_tools.tune.candidates import Axes
    from inferd_tools.tune.sweep import SweepSettings

    url = args.url.rstrip("/")
    url = url if "://" in url else f"http://{url}"
    if args.grpc_url is not None and args.protocol != "grpc":
        raise TuneError("--grpc-url applies to -i grpc only")
    grpc_url = ""
    if args.protocol == "grpc":
        grpc_url = args.grpc_url or default_grpc_url(url)
    preferred = {"off": [False], "on": [True], "both": [False, True]}[args.preferred]
    axes = Axes(
        max_batch_sizes=_int_list("--max-batch-sizes", args.max_batch_sizes, 1),
        delays_us=_int_list("--delays-us", args.delays_us, 0),
        # Instance counts go to the server as given: it is the judge of what is valid, and a
        # count it rejects is reported and skipped like any other failed load.
        instances=_int_list("--instances", args.instances, -(2**31)),
        preferred=preferred,
    )
    if args.intra_op_threads is not None:
        axes.intra_op_threads = _int_list("--intra-op-threads", args.intra_op_threads, 1)
    if args.graph_levels is not None:
        axes.graph_levels = _graph_levels(args.graph_levels)
    if args.pad_grouping_waste is not None:
        axes.pad_wastes = _wastes(args.pad_grouping_waste)
    if args.pad_grouping_window is not None:
        axes.pad_windows = _int_list("--pad-grouping-window", args.pad_grouping_window, 1)
    if args.measure_model is not None and not args.measure_model.strip():
        raise TuneError("--measure-model: give a model name")
    s = SweepSettings(
        url=url,
        model=args.model,
        axes=axes,
        measure_model=(args.measure_model or "").strip(),
        concurrency=args.concurrency,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        p99_ms=args.p99_ms,
        batch_size=args.batch_size,
        input_data=args.input_data,
        shapes=parse_shape_option(args.shape),
        http_binary=args.http_binary,
        timeout_s=args.timeout_s,
        protocol=args.protocol,
        grpc_url=grpc_url.split("://", 1)[-1].rstrip("/"),
    )
    if s.concurrency < 1:
        raise TuneError("--concurrency must be at least 1")
    if s.duration_s <= 0 or s.warmup_s < 0:
        raise TuneError("--duration-s must be positive and --warmup-s not negative")
    if s.p99_ms is not None and s.p99_ms <= 0:
        raise TuneError("--p99-ms must be positive")
    return s


def main(args: argparse.Namespace) -> int:
    from inferd_tools.bench.errors import BenchError
    from inferd_tools.tune.config_file import write_checked
    from inferd_tools.tune.sweep import sweep, table

    try:
        settings = settings_from_args(args)
        result = asyncio.run(sweep(settings, keep_best=args.keep_best))
    except (TuneError, BenchError) as e:
        print(f"inferd tune: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninferd tune: interrupted", file=sys.stderr)
        return 130
    print(table(result.outcomes, result.best, settings.p99_ms))
    code = 0
    if result.best is None:
        print("no candidate was measured within the p99 budget; nothing picked")
        code = 1
    else:
        print(f"best: {result.best.candidate.label()}")
        if args.write_config is not None:
            try:
                write_checked(Path(args.write_config), result.best.config, result.best.candidate)
            except TuneError as e:
                print(f"inferd tune: {e}", file=sys.stderr)
                code = 1
            else:
                print(f"wrote {args.write_config} (read back: it holds the chosen settings)")
    kept = "the best candidate" if args.keep_best and result.best is not None else "the original"
    if result.restored:
        print(f"{settings.model}: {kept} config is loaded again")
    else:
        print(
            f"inferd tune: could not load {kept} config of {settings.model} again "
            f"({result.restore_error}); check the model",
            file=sys.stderr,
        )
        code = 1
    return code
