"""`--trace-config`: Triton's flags parsed into the tracing the server starts with, every value
inferd cannot honour refused naming the flag and the value, and the command exiting 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.telemetry.trace_config import (
    DEFAULT_OTLP_URL,
    TraceConfig,
    TraceConfigError,
    check_trace_config,
    parse_trace_config,
)


def test_no_flag_is_tritons_defaults_with_nowhere_to_trace() -> None:
    config = parse_trace_config([])
    assert config == TraceConfig("triton", "OFF", 1000, -1, "", 0, "")
    assert not config.is_on


def test_tritons_documented_example() -> None:
    config = parse_trace_config(
        [
            "triton,file=/tmp/trace.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "count=100",
        ]
    )
    assert config == TraceConfig("triton", "TIMESTAMPS", 100, 100, "/tmp/trace.json", 50, "")
    assert config.is_on


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["triton,log_frequency=3"], {"log_frequency": 3}),  # the underscore spelling too
        (["triton,file=/tmp/a,b=c.json"], {"file": "/tmp/a,b=c.json"}),  # Triton's split
        (["level=TIMESTAMPS", "level=TIMESTAMPS"], {"level": "TIMESTAMPS"}),  # the same twice
        (["mode=triton"], {}),
        (["count=-1", "rate=1"], {"rate": 1}),
        (
            ["mode=opentelemetry"],
            {"mode": "opentelemetry", "url": DEFAULT_OTLP_URL},  # Triton's default URL
        ),
        (
            ["mode=opentelemetry", "opentelemetry,url=collector:4318/v1/traces"],
            {"mode": "opentelemetry", "url": "http://collector:4318/v1/traces"},
        ),
    ],
)
def test_accepted_values(values: list[str], expected: dict[str, object]) -> None:
    config = parse_trace_config(values)
    for name, value in expected.items():
        assert getattr(config, name) == value, name


def test_the_otlp_option_is_short_for_opentelemetry_every_request() -> None:
    config = parse_trace_config([], "http://c:4318/v1/traces")
    assert config == TraceConfig(
        "opentelemetry", "TIMESTAMPS", 1, -1, "", 0, "http://c:4318/v1/traces"
    )
    # Beside it, --trace-config sets level, rate and count, and may repeat mode and URL.
    config = parse_trace_config(
        ["rate=10", "mode=opentelemetry", "opentelemetry,url=http://c:4318/v1/traces"],
        "http://c:4318/v1/traces",
    )
    assert (config.rate, config.level) == (10, "TIMESTAMPS")


# (values, --trace-otlp-endpoint, words the message must hold)
REFUSED = [
    (["rate=often"], "", ["--trace-config rate=often", "integer from 1", "'often'"]),
    (["rate=0"], "", ["rate=0", "integer from 1"]),
    (["count=-2"], "", ["count=-2", "from -1"]),
    (["triton,log-frequency=-1"], "", ["log-frequency=-1", "from 0"]),
    (["level=TENSORS"], "", ["level=TENSORS", "TENSORS is not supported"]),
    (["level=ALL"], "", ["level=ALL", "unknown level 'ALL'"]),
    (["level=timestamps"], "", ["level=timestamps", "expected TIMESTAMPS or OFF"]),
    (["level=OFF", "level=TIMESTAMPS"], "", ["level=TIMESTAMPS", "already given as 'OFF'"]),
    (["mode=jaeger"], "", ["mode=jaeger", "unknown trace mode 'jaeger'"]),
    (["jaeger,url=x"], "", ["jaeger,url=x", "unknown trace mode 'jaeger'"]),
    (["colour=blue"], "", ["colour=blue", "unknown setting 'colour'", "mode, level, rate"]),
    (["triton,url=x"], "", ["triton,url=x", "unknown setting 'url'", "file, log-frequency"]),
    (["rate"], "", ["--trace-config rate:", "SETTING=VALUE"]),
    (["triton,file="], "", ["triton,file=:", "SETTING=VALUE"]),
    (
        ["mode=opentelemetry", "triton,file=/tmp/t.json"],
        "",
        ["triton,file=/tmp/t.json", "a setting of mode triton", "the trace mode is opentelemetry"],
    ),
    (["opentelemetry,url=c:1"], "", ["opentelemetry,url=c:1", "the trace mode is triton"]),
    (
        ["mode=opentelemetry", "opentelemetry,resource=service.name=x"],
        "",
        ["opentelemetry,resource=service.name=x", "OTEL_RESOURCE_ATTRIBUTES"],
    ),
    (["mode=triton"], "http://c:1", ["mode=triton", "--trace-otlp-endpoint", "one of the two"]),
    (
        ["opentelemetry,url=http://d:2"],
        "http://c:1",
        ["opentelemetry,url=http://d:2", "already names the collector"],
    ),
]


@pytest.mark.parametrize(
    ("values", "endpoint", "words"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED]
)
def test_values_inferd_cannot_honour_are_refused(
    values: list[str], endpoint: str, words: list[str]
) -> None:
    with pytest.raises(TraceConfigError) as info:
        parse_trace_config(values, endpoint)
    for word in words:
        assert word in str(info.value)


def test_the_files_directory_must_exist(tmp_path: Path) -> None:
    check_trace_config(TraceConfig(file=str(tmp_path / "trace.json")))
    missing = tmp_path / "nope" / "trace.json"
    with pytest.raises(TraceConfigError, match=r"file=.*nope/trace.json: directory .* does not"):
        check_trace_config(TraceConfig(file=str(missing)))


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("INFERD_")},
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--trace-config", "rate=often"], "inferd: --trace-config rate=often: expected an"),
        (
            ["--trace-config", "triton,file=/nonexistent/dir/trace.json"],
            "directory /nonexistent/dir does not exist",
        ),
        (
            ["--workers", "2", "--trace-config", "triton,file=/tmp/trace.json"],
            "with --workers > 1: each of the independent processes would write that file",
        ),
    ],
)
def test_the_command_exits_2_naming_the_flag(tmp_path: Path, args: list[str], words: str) -> None:
    result = _serve(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
