"""`response_cache` and the `cache_*` parameters, parsed at load (cache/model_cache_spec.py):
defaults, and a load error naming file and field for every value or combination not honoured."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.cache.keys import KeyOptions
from inferd.cache.model_cache_spec import DEFAULT_MAX_RESPONSE_BYTES, CacheOptions
from inferd.config.model_config import ConfigError
from inferd.repository.loader import prepare
from tests.support.config_models import LINEAR_CONFIG, make_model
from tests.support.model_specs import spec_of

CACHED = "response_cache { enable: true }"


def test_off_by_default_and_on_with_defaults() -> None:
    assert spec_of().cache == CacheOptions()
    assert not spec_of().cache.enabled
    on = spec_of(extra=CACHED).cache
    assert on == CacheOptions(enabled=True)
    assert (on.ttl_s, on.max_entries) == (None, None)
    assert on.max_response_bytes == DEFAULT_MAX_RESPONSE_BYTES
    assert on.key == KeyOptions()  # no normalisation unless asked


def test_normalizers_apply_in_one_order_whatever_the_order_written() -> None:
    written = {"cache_text_normalize": "nfc,lower , strip"}
    assert spec_of(written, "python", CACHED).cache.key.text_normalize == ("strip", "lower", "nfc")


# (parameters, extra config, words the error says after "m/config.pbtxt: ")
P = "parameters."
BAD: list[tuple[dict[str, str], str, str]] = [
    ({"cache_ttl_seconds": "0"}, CACHED,
     P + "cache_ttl_seconds must be a number of seconds > 0, got '0'"),
    ({"cache_ttl_seconds": "soon"}, CACHED, P + "cache_ttl_seconds must be"),
    ({"cache_ttl_seconds": "inf"}, CACHED, P + "cache_ttl_seconds must be"),
    ({"cache_max_entries": "0"}, CACHED, P + "cache_max_entries must be an integer >= 1, got '0'"),
    ({"cache_max_entries": "1.5"}, CACHED, P + "cache_max_entries must be an integer"),
    ({"cache_max_response_bytes": "-1"}, CACHED,
     P + "cache_max_response_bytes must be an integer >= 1"),
    ({"cache_float_decimals": "16"}, CACHED,
     P + "cache_float_decimals must be an integer within 0..15, got '16'"),
    ({"cache_text_normalize": "strip,upper"}, CACHED,
     P + "cache_text_normalize: 'upper' is not one of strip, space, lower, nfc"),
    ({"cache_size": "10"}, CACHED, P + "cache_size is not a cache parameter (typo?)"),
    ({"cache_ttl_seconds": "5"}, "",
     P + "cache_ttl_seconds is set but response_cache { enable: true } is not"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("parameters", "extra", "words"), BAD, ids=[w[len(P) : len(P) + 40] for *_, w in BAD]
)
def test_a_bad_cache_setting_fails_the_load_naming_it(
    parameters: dict[str, str], extra: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(parameters, "onnxruntime", extra)
    assert str(info.value).startswith("m/config.pbtxt: ")
    assert words in str(info.value)


def test_a_decoupled_model_cannot_enable_the_cache() -> None:
    extra = CACHED + "\nmodel_transaction_policy { decoupled: true }"
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: response_cache\.enable: .*decoupled"):
        spec_of(backend="python", extra=extra)


def test_a_sequence_batched_model_cannot_enable_the_cache() -> None:
    extra = CACHED + "\nsequence_batching { }"
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: response_cache\.enable: .*stateful"):
        spec_of(extra=extra)


def test_the_load_of_a_model_with_a_bad_cache_parameter_fails(tmp_path: Path) -> None:
    text = (
        LINEAR_CONFIG
        + CACHED
        + '\nparameters { key: "cache_max_entries" value: { string_value: "x" } }\n'
    )
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: parameters\.cache_max_entries"):
        prepare(make_model(tmp_path, text))
    *_, spec = prepare(make_model(tmp_path / "ok", LINEAR_CONFIG + CACHED))
    assert spec.cache.enabled
