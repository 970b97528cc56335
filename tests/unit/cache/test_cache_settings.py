"""`--cache-config`: inferd's form and Triton's one-setting-per-flag form, merged per tier;
every refusal names the tier and the setting."""

from __future__ import annotations

import pytest

from inferd.cache import (
    CacheConfigError,
    CacheSettings,
    LocalSettings,
    RedisSettings,
    parse_cache_config,
)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], CacheSettings()),
        (["local,size=1048576"], CacheSettings(local=LocalSettings(1048576))),
        (["local,size=64K"], CacheSettings(local=LocalSettings(64 * 1024))),
        (["local,size=64KiB"], CacheSettings(local=LocalSettings(64 * 1024))),
        (["local,size=2m"], CacheSettings(local=LocalSettings(2 * 1024**2))),
        (["local,size=1G"], CacheSettings(local=LocalSettings(1024**3))),
        (["redis,host=cache"], CacheSettings(redis=RedisSettings("cache"))),
        (
            ["redis,host=cache,port=6380,password=pw,db=3,ttl=1.5,timeout_ms=20"],
            CacheSettings(redis=RedisSettings("cache", 6380, "pw", 3, 1.5, 20.0)),
        ),
        (  # Triton's form: one setting per flag, merged
            ["redis,host=cache", "redis,port=6380", "redis,password=pw", "local,size=1M"],
            CacheSettings(LocalSettings(1024**2), RedisSettings("cache", 6380, "pw")),
        ),
        (  # Triton's other redis cache settings
            ["redis,host=h,user=app,pool_size=4,wait_timeout=100", "redis,connect_timeout=0"]
            + ["redis,socket_timeout=2.5"],
            CacheSettings(
                redis=RedisSettings(
                    "h",
                    user="app",
                    pool_size=4,
                    wait_timeout_ms=100.0,
                    connect_timeout_ms=0.0,
                    socket_timeout_ms=2.5,
                )
            ),
        ),
        (  # the inserts' own bound (background work)
            ["redis,host=h,timeout_ms=30", "redis,insert_timeout_ms=2500"],
            CacheSettings(redis=RedisSettings("h", timeout_ms=30.0, insert_timeout_ms=2500.0)),
        ),
        (  # both forms mixed, a setting repeated with the same value
            ["redis,host=cache,port=6380", "redis,ttl=60", "redis,port=6380"],
            CacheSettings(redis=RedisSettings("cache", 6380, ttl_s=60.0)),
        ),
    ],
)
def test_parses_both_forms_and_merges_per_tier(values, expected):
    settings = parse_cache_config(values)
    assert settings == expected
    assert settings.enabled == bool(values)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (["disk,size=1"], ["'disk'", "local or redis"]),
        (["local"], ["no settings for local"]),
        (["local,size"], ["local", "'size'", "name=value"]),
        (["local,bytes=10"], ["--cache-config local,bytes", "unknown local setting"]),
        (["local,size=0"], ["--cache-config local,size=0", "K, M or G"]),
        (["local,size=-5"], ["local,size", "KiB"]),
        (["local,size=10T"], ["local,size", "positive number of bytes"]),
        (["local,size=ten"], ["local,size"]),
        (["redis,port=6379"], ["--cache-config redis,host", "redis needs host"]),
        (["redis,host="], ["redis,host"]),
        (["redis,host=h,port=0"], ["redis,port=0", "1..65535"]),
        (["redis,host=h,port=70000"], ["redis,port=70000"]),
        (["redis,host=h,port=x"], ["redis,port"]),
        (["redis,host=h,db=-1"], ["redis,db=-1", ">= 0"]),
        (["redis,host=h,ttl=0"], ["redis,ttl=0", "seconds"]),
        (["redis,host=h,ttl=nan"], ["redis,ttl"]),
        (["redis,host=h,timeout_ms=-1"], ["redis,timeout_ms", "milliseconds"]),
        (["redis,host=h,insert_timeout_ms=0"], ["redis,insert_timeout_ms=0", "number > 0"]),
        (["redis,host=h,insert_timeout=5"], ["redis,insert_timeout", "insert_timeout_ms"]),
        (["redis,host=h,username=u"], ["redis,username", "unknown redis setting", "user"]),
        (["redis,host=h,user="], ["redis,user", "a user name"]),
        (["redis,host=h,pool_size=0"], ["redis,pool_size=0", "integer > 0"]),
        (["redis,host=h,wait_timeout=10"], ["redis,wait_timeout", "without pool_size"]),
        (["redis,host=h,connect_timeout=-1"], ["redis,connect_timeout", ">= 0"]),
        (["redis,host=h,socket_timeout=x"], ["redis,socket_timeout", "milliseconds"]),
        (["redis,host=a", "redis,host=b"], ["redis,host", "given twice", "'a'", "'b'"]),
        (["local,size=1", "redis,host=h", "local,size=2"], ["local,size", "given twice"]),
    ],
)
def test_every_refusal_names_tier_and_setting(values, named):
    with pytest.raises(CacheConfigError) as caught:
        parse_cache_config(values)
    for text in named:
        assert text in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_the_defaults_bound_lookups_tightly_and_background_inserts_loosely():
    """What docs/cache.md says (When Redis fails): 50 ms a lookup, 1 s an insert."""
    settings = parse_cache_config(["redis,host=h"]).redis
    assert settings is not None
    assert (settings.timeout_ms, settings.insert_timeout_ms) == (50.0, 1000.0)


def test_a_password_is_never_echoed():
    with pytest.raises(CacheConfigError) as caught:
        parse_cache_config(["redis,host=h,password=secret1", "redis,password=secret2"])
    assert "redis,password" in str(caught.value)
    assert "secret" not in str(caught.value)
