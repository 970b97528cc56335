"""The front ends' series on the engine's /metrics (the one endpoint of `--engine`): what
crossed the hop from each, and what each did alone while no engine was there."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.engine.engine_client import MAX_REFUSALS
from inferd.engine.engine_hop import EngineHop


class FrontEndCollector(Collector):
    def __init__(self, hop: EngineHop, front_ends: int) -> None:
        self.hop = hop
        self.front_ends = front_ends

    def collect(self) -> Iterator[Metric]:
        links = list(self.hop.links)
        yield GaugeMetricFamily(
            "inferd_front_ends", "Front end processes configured (--workers N --engine)",
            self.front_ends,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "inferd_front_ends_connected", "Front ends connected to the engine now", len(links)
        )
        requests = CounterMetricFamily(
            "inferd_front_end_requests",
            "Infer requests a front end passed to the engine",
            labels=["front_end"],
        )
        for index, count in sorted(self.hop.requests.items()):
            requests.add_metric([str(index)], count)
        yield requests
        invalid = CounterMetricFamily(
            "inferd_front_end_invalid",
            "Infer requests a front end found malformed (its body, a header, the model's "
            "signature) and noted to the engine, their tensors never crossing the hop (also "
            "counted as failed requests of their model)",
            labels=["front_end"],
        )
        for index, count in sorted(self.hop.invalid.items()):
            invalid.add_metric([str(index)], count)
        yield invalid
        dropped = CounterMetricFamily(
            "inferd_front_end_refusals_dropped",
            "Malformed infer requests a front end answered alone, at once, because "
            f"{MAX_REFUSALS} of its notes were unanswered by the engine: neither counted by the "
            "engine nor checked by its admission first",
            labels=["front_end"],
        )
        for index, counts in sorted(self.hop.reported.items()):
            dropped.add_metric([str(index)], counts.get("refusals_dropped", 0))
        yield dropped
        inflight = GaugeMetricFamily(
            "inferd_front_end_inflight",
            "Infer requests from a front end in the engine now",
            labels=["front_end"],
        )
        for link in sorted(links, key=lambda link: link.front_end):
            inflight.add_metric([str(link.front_end)], len(link.tasks))
        yield inflight
        for key, name, text in (
            ("refused", "inferd_front_end_refused",
             "Requests a front end answered 503 itself while no engine was connected"),
            ("engine_lost", "inferd_front_end_engine_lost",
             "Connections to the engine a front end lost (an engine crash or restart loses "
             "one, or more when a reconnection reached the dying engine)"),
        ):  # fmt: skip
            family = CounterMetricFamily(
                name, text + " (as of its last connection)", labels=["front_end"]
            )
            for index, counts in sorted(self.hop.reported.items()):
                family.add_metric([str(index)], counts.get(key, 0))
            yield family
