"""Reading a server's /metrics in the tests: scrape it, and read one sample's value."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import RunningServer


def scrape(server: RunningServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return scrape_url(server.metrics_url)


def scrape_url(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, frozenset(labels.items())), 0.0)
