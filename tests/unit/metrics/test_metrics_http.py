"""The /metrics endpoint: text format 0.0.4 with Triton's bare-named counters typed as
counters, and clear answers to what it does not serve."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from inferd.metrics.metrics_endpoint import MetricsServer, exposition


class _Families(Collector):
    def __init__(self) -> None:
        self.broken = False

    def collect(self) -> Iterator[Metric]:
        if self.broken:
            raise RuntimeError("a collector bug")
        bare = Metric("nv_inference_count", "Rows", "counter")
        bare.add_sample("nv_inference_count", {"model": "m", "version": "1"}, 7.0)
        yield bare
        suffixed = CounterMetricFamily("inferd_request_success", "Requests", labels=["model"])
        suffixed.add_metric(["m"], 3.0)
        yield suffixed


def _registry() -> tuple[CollectorRegistry, _Families]:
    registry = CollectorRegistry(auto_describe=False)
    families = _Families()
    registry.register(families)
    return registry, families


def test_bare_counters_stay_counters_under_their_own_name() -> None:
    text = exposition(_registry()[0]).decode()
    assert "# TYPE nv_inference_count counter\n" in text
    assert 'nv_inference_count{model="m",version="1"} 7.0\n' in text
    assert "# TYPE inferd_request_success_total counter\n" in text
    assert 'inferd_request_success_total{model="m"} 3.0\n' in text
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types == {"nv_inference_count": "counter", "inferd_request_success": "counter"}


def test_the_endpoint() -> None:
    registry, families = _registry()
    server = MetricsServer(registry, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}"
    try:
        with httpx.Client() as client:
            # OpenMetrics asked for, text 0.0.4 answered (as Triton), gzipped when accepted.
            r = client.get(
                url + "/metrics",
                headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            )
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert r.headers["content-encoding"] == "gzip"
            assert "# TYPE nv_inference_count counter" in r.text  # httpx un-gzips
            raw = client.get(url + "/metrics", headers={"Accept-Encoding": "identity"})
            assert "content-encoding" not in raw.headers
            assert raw.text == r.text
            r = client.get(url + "/elsewhere")
            assert r.status_code == 404 and "/metrics" in r.text
            r = client.get(url + "/metrics?name[]=nv_inference_count&x=1")
            assert r.status_code == 400 and "name[], x" in r.text
            # A collector that raises fails its scrape, visibly, and only that scrape.
            families.broken = True
            r = client.get(url + "/metrics")
            assert r.status_code == 500 and "see the server log" in r.text
            families.broken = False
            assert client.get(url + "/metrics").status_code == 200
    finally:
        server.close()
