"""The `inferd` command line: parse arguments into Settings and run. No logic lives here."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from inferd import __version__
from inferd.cli.capture_options import add_capture_options, capture_settings
from inferd.cli.env import EnvironmentParser, unknown_variables
from inferd.cli.help_format import DefaultsOnceFormatter
from inferd.cli.limit_options import add_limit_options, limits_from
from inferd.cli.security_options import SecurityOptionError, add_security_options, security_settings
from inferd.dataplane.access import TOKEN_ENV
from inferd.monitoring.capture_settings import CaptureOptionError
from inferd.settings import MIB, Settings
from inferd_tools import commands as tools

# INFERD_* variables that are not options (the admin token; the test suite's switch): no
# warning that they name no option.
OTHER_VARIABLES = frozenset({TOKEN_ENV, "INFERD_REQUIRE_TEST_TOOLS"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferd",
        description="inferd: a model inference server speaking KServe v2 / Triton's protocol.",
    )
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # `serve` alone reads INFERD_* variables (env.py); bench and tune are run by hand.
    commands._parser_class = EnvironmentParser
    serve = commands.add_parser(
        "serve",
        help="serve a model repository over HTTP and gRPC",
        description="Serve a Triton-layout model repository over the KServe v2 protocol "
        "(HTTP/REST and gRPC).",
        formatter_class=DefaultsOnceFormatter,
        epilog="Every option can also be set by an environment variable: INFERD_ and its "
        "name in capitals, dashes as underscores (--http-port: INFERD_HTTP_PORT; a flag takes "
        "true/false). The command line wins over the environment (docs/deploy.md).",
    )
    commands._parser_class = argparse.ArgumentParser
    defaults = Settings()
    serve.add_argument(
        "--model-repository",
        type=Path,
        default=defaults.model_repository,
        metavar="DIR",
        help="model repository: DIR/<model>/config.pbtxt and DIR/<model>/<version>/model.*",
    )
    serve.add_argument("--host", default=defaults.host, help="address to listen on")
    serve.add_argument(
        "--http-port", type=int, default=defaults.http_port, help="port of the HTTP endpoint"
    )
    serve.add_argument(
        "--grpc-port",
        type=int,
        default=defaults.grpc_port,
        help="port of the gRPC endpoint (inference.GRPCInferenceService); 0 turns it off",
    )
    serve.add_argument(
        "--max-request-mib",
        type=float,
        default=defaults.max_request_bytes / MIB,
        help="largest request accepted, in MiB: HTTP bodies past it get 413, gRPC "
        "messages RESOURCE_EXHAUSTED",
    )
    serve.add_argument(
        "--max-response-mib",
        type=float,
        default=defaults.max_response_bytes / MIB,
        help="largest response sent, in MiB: past it the request fails with HTTP 413 / "
        "gRPC RESOURCE_EXHAUSTED naming the limit",
    )
    serve.add_argument(
        "--log-level",
        default=defaults.log_level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="least severe log level printed",
    )
    serve.add_argument(
        "--log-format",
        default=defaults.log_format,
        choices=["text", "json"],
        help="log lines as text or as one JSON object per line",
    )
    serve.add_argument(
        "--log-sample-rate",
        type=float,
        default=defaults.log_sample_rate,
        metavar="FRACTION",
        help="share of successful requests written to the request log (0..1); "
        "failed requests are always logged",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=defaults.metrics_port,
        help="port of the Prometheus endpoint (GET /metrics); 0 turns it off",
    )
    serve.add_argument(
        "--metrics-triton-names",
        action="store_true",
        help="also export Triton's metric names, for existing dashboards and perf_analyzer "
        "--collect-metrics: nv_inference_* per model, nv_cpu_* and (with the gpu extra) nv_gpu_*",
    )
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="tracing, as Triton's flag (repeatable, one setting each): triton,file=PATH "
        "(a Triton JSON trace file), triton,log-frequency=N (write PATH.<n> every N traces), "
        "rate=N (one request in N; 1000 unless set), level=TIMESTAMPS|OFF (OFF unless set), "
        "count=N (-1: no limit), mode=triton|opentelemetry, opentelemetry,url=HOST:PORT/PATH "
        "(docs/observability-logs-traces.md)",
    )
    serve.add_argument(
        "--trace-otlp-endpoint",
        default="",
        metavar="URL",
        help="send every request's OpenTelemetry spans to this OTLP/HTTP endpoint (e.g. "
        "http://127.0.0.1:4318/v1/traces): short for --trace-config mode=opentelemetry "
        "--trace-config opentelemetry,url=URL --trace-config level=TIMESTAMPS "
        "--trace-config rate=1; needs the 'otel' extra. Empty: none",
    )
    serve.add_argument(
        "--model-control-mode",
        default=defaults.model_control_mode,
        choices=["none", "poll", "explicit"],
        help="none: load the repository at start; poll: also apply changes found on disk; "
        "explicit: load only --load-model at start, then what the repository API asks",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=defaults.repository_poll_s,
        help="poll mode: seconds between two scans of the repository",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' loads all)",
    )
    serve.add_argument(
        "--admin-api",
        choices=["on", "off"],
        default=None,
        help="repository load/unload and canary routing calls (default: on in explicit "
        "mode, off otherwise)",
    )
    serve.add_argument(
        "--docs-ui",
        choices=["on", "off"],
        default="on" if defaults.docs_ui else "off",
        help="GET /docs: Swagger UI over GET /v2/openapi.json, to try each model from a "
        "browser (the metadata API's access rules apply to both; docs/openapi.md)",
    )
    serve.add_argument(
        "--print-openapi",
        action="store_true",
        help="write the OpenAPI document the server would serve with these options (its "
        "routes, and each model's request: the models are loaded, no port is opened) to "
        "stdout, and exit",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        metavar="N",
        help="server processes sharing the HTTP and gRPC ports, each with its own copy of "
        "the models; more than 1 lifts the one-core bound of a Python process (needs model "
        "control mode none or poll; docs/workers.md)",
    )
    serve.add_argument(
        "--engine",
        action="store_true",
        default=defaults.engine,
        help="the --workers N processes are front ends (parsing, decoding, encoding) of one "
        "engine process that holds the models once and batches every connection's requests "
        "together; explicit control, the repository API and canary routing work; N=1 is one "
        "front end and the engine, two processes (docs/workers.md)",
    )
    serve.add_argument(
        "--max-inflight-requests",
        type=int,
        default=defaults.max_inflight_requests,
        metavar="N",
        help="server-wide limit of requests being served; past it new ones get HTTP 429 / "
        "RESOURCE_EXHAUSTED at once (0: no limit; per-model limits are the config's "
        "max_queue_size)",
    )
    serve.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=defaults.exit_timeout_s,
        help="on shutdown, how long queued and running requests may take to finish; the "
        "process exits at most a few seconds later, with status 1 if a model call was stuck",
    )
    serve.add_argument(
        "--execution-timeout-ms",
        type=int,
        default=defaults.execution_timeout_ms,
        metavar="MS",
        help="how long one model execution may take before its requests fail with 504 / "
        "DEADLINE_EXCEEDED and its instance is taken out of service (a process-isolated one "
        "is replaced); a model's parameter execution_timeout_ms overrides it; 0: no limit",
    )
    serve.add_argument(
        "--verbose-errors",
        action="store_true",
        help="send a model's exception text to clients whole; by default they get it on one "
        "line, bounded, with file paths cut to their last component and no traceback (the "
        "server log always has the full text)",
    )
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="TIER,KEY=VALUE",
        help="the response cache (Triton's flag), for models whose config sets response_cache "
        "{ enable: true }: local,size=BYTES (an LRU of that many bytes; K/M/G suffixes) and/or "
        "redis,host=H[,port=P][,password=...][,db=N][,ttl=SECONDS][,timeout_ms=50]"
        "[,insert_timeout_ms=1000] (and Triton's user, pool_size, wait_timeout, "
        "connect_timeout, socket_timeout); repeatable, "
        "one setting per flag as Triton's works too; both: local in front of Redis "
        "(docs/cache.md)",
    )
    add_security_options(serve)
    add_limit_options(serve)
    add_capture_options(serve)
    tools.add_parsers(commands)  # bench, tune, optimize: inferd_tools, apart from the server
    return parser


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `serve` subcommand's parser, out of build_parser()'s."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve: argparse.ArgumentParser = commands.choices["serve"]
    return serve


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in tools.NAMES:
        return tools.run(args)
    if args.command == "serve":
        from inferd import log
        from inferd.server import build as server

        if not 0.0 <= args.log_sample_rate <= 1.0:
            print("inferd: --log-sample-rate must be within 0..1", file=sys.stderr)
            return 2
        if args.workers < 1:
            print("inferd: --workers must be at least 1", file=sys.stderr)
            return 2
        if args.execution_timeout_ms < 0:
            print("inferd: --execution-timeout-ms must be >= 0 (0: no limit)", file=sys.stderr)
            return 2
        log.configure(args.log_level, args.log_format)
        for name in unknown_variables(serve_parser(parser), os.environ):
            if name not in OTHER_VARIABLES:
                logging.getLogger("inferd").warning(
                    "environment variable %s names no option of inferd serve: ignored", name
                )
        if not args.model_repository.is_dir():
            print(
                f"inferd: model repository {args.model_repository} is not a directory",
                file=sys.stderr,
            )
            return 2
        from inferd.cache.cache_settings import CacheConfigError
        from inferd.cache.response_cache import ResponseCache
        from inferd.dataplane.access import AccessError
        from inferd.protocol.tls import TlsError
        from inferd.telemetry.trace_config import TraceConfigError, check_trace_config
        from inferd.workers import supervisor
        from inferd.workers.supervisor import WorkersError

        try:
            settings = settings_from(args)
            server.access_policy(settings)  # the security options, checked before anything runs
            check_trace_config(settings.trace)
            if settings.cache is not None and settings.cache.enabled:
                # Built once here to check it (a Redis tier needs the redis package) before
                # any worker starts; it connects to nothing yet.
                ResponseCache(settings.cache)
        except (
            SecurityOptionError,
            AccessError,
            TlsError,
            CaptureOptionError,
            CacheConfigError,
            TraceConfigError,
        ) as exc:
            print(f"inferd: {exc}", file=sys.stderr)
            return 2
        if args.print_openapi:
            from inferd.server.openapi_print import openapi_document

            sys.stdout.buffer.write(openapi_document(settings) + b"\n")
            sys.stdout.flush()
            return 0
        try:
            if settings.engine:
                from inferd.engine import supervisor as engine_supervisor

                engine_supervisor.run(settings)  # front ends and one engine
            elif settings.workers > 1:
                supervisor.run(settings)  # it starts the workers, each a worker_role.run_worker
            else:
                server.run(settings)
        except WorkersError as exc:
            print(f"inferd: {exc}", file=sys.stderr)
            return 2
    return 0


def settings_from(args: argparse.Namespace) -> Settings:
    from inferd.cache.cache_settings import parse_cache_config  # CacheConfigError when bad
    from inferd.telemetry.trace_config import parse_trace_config  # TraceConfigError when bad

    return Settings(
        model_repository=args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port or None,
        max_request_bytes=int(args.max_request_mib * MIB),
        max_response_bytes=int(args.max_response_mib * MIB),
        log_level=args.log_level,
        log_format=args.log_format,
        log_sample_rate=args.log_sample_rate,
        metrics_port=args.metrics_port or None,
        metrics_triton_names=args.metrics_triton_names,
        trace=parse_trace_config(args.trace_config, args.trace_otlp_endpoint),
        model_control_mode=args.model_control_mode,
        repository_poll_s=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        admin_api=None if args.admin_api is None else args.admin_api == "on",
        docs_ui=args.docs_ui == "on",
        exit_timeout_s=args.exit_timeout_secs,
        execution_timeout_ms=args.execution_timeout_ms,
        verbose_errors=args.verbose_errors,
        max_inflight_requests=args.max_inflight_requests,
        workers=args.workers,
        engine=args.engine,
        **security_settings(args),
        limits=limits_from(args),
        capture=capture_settings(args),
        cache=parse_cache_config(args.cache_config),
    )


if __name__ == "__main__":
    sys.exit(main())
