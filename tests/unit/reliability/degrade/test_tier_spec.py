"""The `degrade_*` parameters, parsed at load (reliability/degrade/tier_spec.py,
reliability/degrade/tiers.py):
the tiers as written, defaults, and a load error naming file and parameter for every value or
combination inferd would not honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.model_config import ConfigError
from inferd.reliability.degrade.tiers import DegradePolicy, Tier
from inferd.repository.loader import prepare
from tests.support.config_models import LINEAR_CONFIG, make_model
from tests.support.model_specs import spec_of

TIERS = "500: fallback=25% queue=16; 1000: fallback stale; 2000: rollback open_circuit"
CACHED = "response_cache { enable: true }"


def test_no_tiers_unless_declared() -> None:
    assert spec_of().degrade == DegradePolicy()
    assert not spec_of().degrade.enabled


def test_tiers_parse_as_written_with_defaults() -> None:
    spec = spec_of({"degrade_p99_ms": TIERS, "fallback_model": "light"}, "python", CACHED)
    policy = spec.degrade
    assert policy.tiers == (
        Tier(1, 0.5, fallback_share=0.25, queue_limit=16),
        Tier(2, 1.0, fallback_share=1.0, stale=True),
        Tier(3, 2.0, open_circuit=True, rollback=True),
    )
    assert policy.fallback_model == "light"
    assert (policy.window_s, policy.min_requests, policy.release_ratio) == (10.0, 20, 0.8)
    assert (policy.dwell_s, policy.probe_interval_s) == (10.0, 0.1)
    # A stale tier keeps the cache's entries past their TTL for it.
    assert spec.cache.stale_s == policy.stale_s == 300.0


def test_every_setting_is_read() -> None:
    written = {
        "degrade_p99_ms": "100: queue=4",
        "degrade_window_s": "2.5",
        "degrade_min_requests": "7",
        "degrade_release_ratio": "0.5",
        "degrade_dwell_s": "0",
        "degrade_probe_interval_ms": "250",
    }
    policy = spec_of(written).degrade
    assert (policy.window_s, policy.min_requests, policy.release_ratio) == (2.5, 7, 0.5)
    assert (policy.dwell_s, policy.probe_interval_s) == (0.0, 0.25)
    assert spec_of(written).cache.stale_s == 0.0  # no stale tier: nothing kept


# (parameters, extra config, words the error says after "m/config.pbtxt: ")
P = "parameters."
FB = {"fallback_model": "light"}
BAD: list[tuple[dict[str, str], str, str]] = [
    ({"degrade_window_s": "5"}, "",
     P + "degrade_window_s is set but degrade_p99_ms is not"),
    ({"degrade_p99_ms": "500: fallback"}, "",
     P + "degrade_p99_ms: tier 1 sends traffic to the fallback model, but "
     "parameters.fallback_model is not set"),
    ({"degrade_p99_ms": "500: stale"}, "",
     P + "degrade_p99_ms: tier 1 answers from stale cache entries, but response_cache"),
    ({"degrade_p99_ms": "500: queue=8", "degrade_stale_s": "60"}, "",
     P + "degrade_stale_s is set but no tier of degrade_p99_ms has the action 'stale'"),
    ({"degrade_p99_ms": "500: queue=8", "degrade_rollback_within_s": "60"}, "",
     P + "degrade_rollback_within_s is set but no tier"),
    ({"degrade_p99_ms": "500: fly"}, "", P + "degrade_p99_ms: tier 1: unknown action 'fly'"),
    ({"degrade_p99_ms": "500"}, "", P + "degrade_p99_ms: tier 1 '500' must be 'P99_MS: ACTION"),
    ({"degrade_p99_ms": "500:"}, "", P + "degrade_p99_ms: tier 1 (500 ms) has no action"),
    ({"degrade_p99_ms": "soon: queue=2"}, "",
     P + "degrade_p99_ms: tier 1: the threshold 'soon' must be a number of milliseconds > 0"),
    ({"degrade_p99_ms": "-5: queue=2"}, "", P + "degrade_p99_ms: tier 1: the threshold"),
    ({"degrade_p99_ms": "500: queue=2; 400: queue=1"}, "",
     P + "degrade_p99_ms: tier 2: thresholds must rise"),
    ({"degrade_p99_ms": "500: queue=0"}, "", P + "degrade_p99_ms: tier 1: 'queue' needs a bound"),
    ({"degrade_p99_ms": "500: fallback=0%", **FB}, "",
     P + "degrade_p99_ms: tier 1: 'fallback=0%' must be a share"),
    ({"degrade_p99_ms": "500: fallback=50", **FB}, "", P + "degrade_p99_ms: tier 1: 'fallback=50'"),
    ({"degrade_p99_ms": "500: queue=2 queue=3"}, "",
     P + "degrade_p99_ms: tier 1: action 'queue' is given twice"),
    ({"degrade_p99_ms": "500: rollback=1"}, "",
     P + "degrade_p99_ms: tier 1: action 'rollback' takes no value"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_window": "5"}, "",
     P + "degrade_window is not a degradation parameter (typo?)"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_window_s": "0"}, "",
     P + "degrade_window_s must be a number > 0, got '0'"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_min_requests": "2.5"}, "",
     P + "degrade_min_requests must be an integer >= 1, got '2.5'"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_release_ratio": "1.5"}, "",
     P + "degrade_release_ratio must be a number > 0 and <= 1, got '1.5'"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_dwell_s": "-1"}, "",
     P + "degrade_dwell_s must be a number >= 0, got '-1'"),
    ({"degrade_p99_ms": "500: queue=2", "degrade_probe_interval_ms": "nan"}, "",
     P + "degrade_probe_interval_ms must be a number > 0"),
    ({"degrade_p99_ms": "500: queue=2"}, "model_transaction_policy { decoupled: true }",
     P + "degrade_p99_ms: a decoupled model's requests are streams"),
    ({"degrade_p99_ms": "500: queue=2"}, "sequence_batching { }",
     P + "degrade_p99_ms: a sequence-batched (stateful) model"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("parameters", "extra", "words"), BAD, ids=[w[len(P) : len(P) + 50] for *_, w in BAD]
)
def test_a_bad_degradation_setting_fails_the_load_naming_it(
    parameters: dict[str, str], extra: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(parameters, "python", extra)
    assert str(info.value).startswith("m/config.pbtxt: ")
    assert words in str(info.value)


def test_the_load_of_a_model_with_bad_tiers_fails(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + 'parameters { key: "degrade_p99_ms" value: { string_value: "x" } }\n'
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: parameters\.degrade_p99_ms: "):
        prepare(make_model(tmp_path, text))
