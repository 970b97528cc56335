"""`inferd bench`: from parsed arguments to a run and its reports."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from inferd_tools.bench import report
from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.inputs import parse_shape_option
from inferd_tools.bench.runner import (
    BenchConfig,
    BenchResult,
    BenchRun,
    parse_levels,
    progress_printer,
)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.request_rate is not None:
        rates = parse_levels(args.request_rate, float)
        concurrency: list[int] = []
    else:
        rates = []
        concurrency = [int(c) for c in parse_levels(args.concurrency, int)]
    return BenchConfig(
        url=args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000"),
        protocol=args.protocol,
        model=args.model,
        version=args.model_version,
        http_binary=args.http_binary,
        input_data=args.input_data,
        shapes=parse_shape_option(args.shape),
        batch_size=args.batch_size,
        concurrency=concurrency,
        request_rates=rates,
        poisson=args.poisson,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        stability_percentage=args.stability_percentage,
        max_windows=args.max_windows,
        duration_s=args.duration_s,
        processes=args.processes,
        max_connections=args.max_connections,
        timeout_s=args.timeout_s,
        stats_url=args.stats_url,
    )


def _loop_factory(protocol: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop for HTTP (the lean load client runs faster on it); grpc.aio keeps the default."""
    if protocol != "http":
        return None
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(args: argparse.Namespace) -> int:
    bench_run: BenchRun | None = None
    try:
        config = config_from_args(args)
        if args.poisson and not config.request_rates:
            raise BenchError("--poisson applies to --request-rate (open loop) only")
        if args.plot is not None:
            report.check_plot_available()
        config.validate()
        show_progress = args.progress or sys.stderr.isatty()
        bench_run = BenchRun(config, progress_printer(show_progress))
        with asyncio.Runner(loop_factory=_loop_factory(config.protocol)) as runner:
            result = runner.run(bench_run.execute())
        if show_progress:
            sys.stderr.write("\n")
    except BenchError as e:
        print(f"inferd bench: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: the levels measured so far are reported and saved as a whole run's are.
        partial = bench_run.result if bench_run is not None else None
        if partial is None or not partial.levels:
            print("\ninferd bench: interrupted before any level was measured", file=sys.stderr)
            return 130
        print(
            f"\ninferd bench: interrupted; reporting the {len(partial.levels)} level(s) "
            "measured so far",
            file=sys.stderr,
        )
        _report(partial, args)
        return 130
    _report(result, args)
    return 0


def _report(result: BenchResult, args: argparse.Namespace) -> None:
    print(report.header(result))
    print(report.table(result))
    for level in result.levels:
        if level.stable is False:
            print(
                f"warning: {level.mode} {level.value:g} was not stable within "
                f"{result.config.stability_percentage:g}% after {level.windows} windows; the "
                "last 3 windows are reported",
                file=sys.stderr,
            )
    if args.csv is not None:
        report.write_csv(result, Path(args.csv))
    if args.json is not None:
        report.write_json(result, Path(args.json))
    if args.plot is not None:
        report.write_plot(result, Path(args.plot))
