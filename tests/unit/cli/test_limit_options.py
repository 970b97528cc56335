"""`inferd serve`'s client-limit options: each reaches Settings.limits; bad values are refused."""

from __future__ import annotations

import pytest

from inferd.cli.main import build_parser, settings_from
from inferd.limits import KIB, MIB, Limits


def test_every_limit_option_reaches_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--max-header-kib", "16",
            "--max-header-count", "50",
            "--max-url-kib", "4",
            "--header-timeout-secs", "2.5",
            "--body-timeout-secs", "7",
            "--keep-alive-timeout-secs", "1",
            "--max-connections", "200",
            "--max-bytes-elements", "1000",
            "--max-stream-pending", "8",
            "--offload-threshold-kib", "256",
            "--max-response-mib", "3",
        ]
    )  # fmt: skip
    settings = settings_from(args)
    assert settings.limits == Limits(
        max_header_bytes=16 * KIB,
        max_header_count=50,
        max_url_bytes=4 * KIB,
        header_timeout_s=2.5,
        body_timeout_s=7.0,
        keep_alive_timeout_s=1.0,
        max_connections=200,
        max_bytes_elements=1000,
        max_stream_pending=8,
        offload_bytes=256 * KIB,
    )
    assert settings.max_response_bytes == 3 * MIB


def test_the_defaults_are_the_limits_defaults() -> None:
    assert settings_from(build_parser().parse_args(["serve"])).limits == Limits()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--max-connections", "0"), ("--header-timeout-secs", "-1"), ("--max-header-kib", "x")],
)
def test_a_bad_value_is_refused_naming_the_option(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", option, value])
    assert info.value.code == 2
    assert option in capsys.readouterr().err
