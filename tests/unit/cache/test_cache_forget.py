"""The cache's per-model counts go with a model that is unloaded (or out of the repository):
its series with them (docs/metrics.md, "Series of unloaded versions")."""

from __future__ import annotations

from inferd.cache import CacheSettings, LocalSettings, ResponseCache


def test_an_unloaded_models_counts_go() -> None:
    cache = ResponseCache(CacheSettings(local=LocalSettings(1 << 20)))
    (stats,) = cache.stats
    for model in ("kept", "gone"):
        stats.hit(model)
        stats.miss(model)
        cache.coalesced_by_model[model] = 1
    cache.forget(lambda model, version: model == "gone")
    assert stats.hits_by_model == stats.misses_by_model == cache.coalesced_by_model == {"kept": 1}
    assert (stats.hits, stats.misses) == (2, 2)  # the tier's own totals stay
