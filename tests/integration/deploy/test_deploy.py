"""deploy/: the Grafana dashboard and the Prometheus rules, checked against a real server.

promtool validates the rules (and runs their unit tests, deploy/prometheus/alerts.test.yaml);
every metric the dashboard and the alerts query must exist in a live scrape; and a real
Prometheus scrapes a live server, evaluates the alerts and answers the dashboard's queries.

promtool and prometheus come from scripts/install-test-tools.sh (Debian's `prometheus`
package, through apt-get, with sudo when not root), which `make test` runs first. Where it
cannot install them (no apt-get, no sudo rights), the tests that need them are skipped, each
saying why. CI sets INFERD_REQUIRE_TEST_TOOLS=1 (.ci/run): there they fail instead, so CI
can never pass them silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferd.cache.cache_settings import parse_cache_config
from tests.support.redis_servers import own_redis
from tests.support.server_process import free_port, wait_until_serving
from tests.support.servers import RunningServer, run_server

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "inferd.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Series Prometheus writes itself rather than scraping them.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

P99_MLP = (
    "histogram_quantile(0.99, "
    "sum by (le, model) (rate(inferd_request_duration_seconds_bucket[1m])))"
)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = (
            f"`{name}` is not on PATH: scripts/install-test-tools.sh installs it (Debian's "
            "prometheus package, with apt-get; `make test` runs it first)"
        )
        if os.environ.get("INFERD_REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


# -- the expressions ---------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and query variables."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs: list[str] = []

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for panel in panels(dashboard["panels"]):
        exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert inner, f"unexpected variable query {query!r}"
            exprs.append(inner.group(1))
    return exprs


def alert_rules() -> list[dict[str, str]]:
    """Name, expr and annotation keys of each rule of alerts.yaml.

    A reader for the file's own layout (`- alert:` items, `expr:` inline or as a `|` block),
    so the tests need no YAML library; promtool checks the file is what it looks like.
    """
    rules: list[dict[str, str]] = []
    lines = ALERTS.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\w+)\s*$", line):
            rules.append({"alert": m.group(1)})
        elif rules and (m := re.match(r"(\s*)expr: (.*)$", line)):
            indent, value = len(m.group(1)), m.group(2).strip()
            if value in ("|", ">", "|-", ">-"):
                block = []
                for following in lines[i + 1 :]:
                    if following.strip() and len(following) - len(following.lstrip()) <= indent:
                        break
                    block.append(following.strip())
                value = " ".join(b for b in block if b)
            rules[-1]["expr"] = value
        elif rules and (m := re.match(r"\s*(summary|description): (.*)$", line)):
            rules[-1][m.group(1)] = m.group(2).strip()
    return rules


PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, `$model` among them
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        name, is_call = m.group(1), m.group(2)
        if not is_call and name.lower() not in PROMQL_WORDS:
            names.add(name)
    return names


def test_metric_name_parser() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, model) (rate(inferd_request_duration_seconds_bucket"
        '{job=~"$job", model=~"$model"}[$__rate_interval]))) / on (model) group_left '
        "sum by (model) (inferd_inference_count_total) > 0.5 unless up offset 5m"
    )
    assert metric_names(expr) == {
        "inferd_request_duration_seconds_bucket",
        "inferd_inference_count_total",
        "up",
    }


# -- promtool ----------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    out = run_tool(tool("promtool"), "check", "rules", str(ALERTS)).stdout
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    run_tool(tool("promtool"), "test", "rules", str(ALERT_TESTS))


def test_every_alert_has_a_unit_test_and_annotations() -> None:
    tests = ALERT_TESTS.read_text(encoding="utf-8")
    for rule in alert_rules():
        assert f"alertname: {rule['alert']}" in tests, f"{rule['alert']} has no unit test"
        assert rule.get("expr") and rule.get("summary") and rule.get("description"), rule


def test_promtool_checks_the_example_config() -> None:
    # rule_files are relative to the config file, so this checks alerts.yaml too.
    out = run_tool(tool("promtool"), "check", "config", str(PROMETHEUS_YML)).stdout
    assert "SUCCESS: 1 rule files found" in out


# -- a live server -----------------------------------------------------------------------


def mlp_body(value: float = 0.5, rows: int = 1) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [rows, 8], "data": [value] * (8 * rows)}
        ]
    }


def send_traffic(server: RunningServer, rounds: int = 1) -> None:
    """Successes, failures of several reasons, and concurrent requests (batches > 1)."""
    faulty_bad = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [-1] * 4}]}
    faulty_ok = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
    counter = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2, 3], "data": [1.0] * 6}]}
    with server.client() as client:
        for _ in range(rounds):
            for model, body, status in (
                ("mlp", mlp_body(), 200),
                ("mlp", mlp_body(rows=3), 200),
                ("counter", counter, 200),
                ("faulty", faulty_ok, 200),
                ("faulty", faulty_bad, 500),  # model_error
                ("mlp", {"inputs": [{"name": "input", "datatype": "FP32"}]}, 400),
                ("no_such_model", mlp_body(), 404),
            ):
                response = client.post(f"/v2/models/{model}/infer", json=body)
                assert response.status_code == status, (model, response.text)

    def burst() -> None:
        with server.client() as client:
            for _ in range(5):
                assert client.post("/v2/models/mlp/infer", json=mlp_body()).status_code == 200

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def with_drift_monitoring(good_repository: Path, repo: Path) -> Path:
    """The good repository with mlp's default version (2) drift-monitored: a reference of
    its input and its predicted label, windows of 10 rows (docs/monitoring.md), so the
    dashboard's and the alerts' inferd_drift_* series exist after a little traffic."""
    shutil.copytree(good_repository, repo)
    rng = np.random.default_rng(0)
    reference = {"input": rng.random((100, 8)), "label": rng.integers(0, 4, (100, 1))}
    np.savez(repo / "mlp" / "2" / "reference.npz", **reference)  # type: ignore[arg-type]
    with (repo / "mlp" / "config.pbtxt").open("a", encoding="utf-8") as config:
        for key, value in (("drift_window", "10"), ("drift_class_outputs", "label")):
            config.write(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n')
        config.write('parameters { key: "drift_cpu_budget" value: { string_value: "1" } }\n')
    # And `counter` cached, so the dashboard's response-cache row has series (docs/cache.md).
    with (repo / "counter" / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write("response_cache { enable: true }\n")
    # And `faulty` degraded from its first success on (a p99 past 1 µs), its fallback a copy
    # of itself, so the degradation row and alert have series (docs/reliability.md).
    backup = repo / "faulty_backup"
    shutil.copytree(repo / "faulty", backup)
    config_path = backup / "config.pbtxt"
    config_path.write_text(
        config_path.read_text(encoding="utf-8").replace('"faulty"', '"faulty_backup"'),
        encoding="utf-8",
    )
    with (repo / "faulty" / "config.pbtxt").open("a", encoding="utf-8") as config:
        for key, value in (
            ("degrade_p99_ms", "0.001: fallback"),
            ("degrade_min_requests", "1"),
            ("degrade_probe_interval_ms", "60000"),
            ("fallback_model", "faulty_backup"),
        ):
            config.write(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n')
    return repo


@pytest.fixture(scope="module")
def live(
    good_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    repo = with_drift_monitoring(good_repository, tmp_path_factory.mktemp("deploy") / "repo")
    # Both tiers, so the Redis tier's series (and the alert on them) are in the scrape.
    with own_redis() as shared:
        cache = parse_cache_config(["local,size=1M", f"redis,host=127.0.0.1,port={shared.port}"])
        with run_server(repo, metrics_triton_names=True, cache=cache) as server:
            send_traffic(server)
            with server.client() as client:  # counter's request again: a cache hit
                body = {
                    "inputs": [
                        {"name": "IN", "datatype": "FP32", "shape": [2, 3], "data": [1.0] * 6}
                    ]
                }
                assert client.post("/v2/models/counter/infer", json=body).status_code == 200
                # faulty is degraded now: its fallback answers (after one probe of faulty).
                faulty = {
                    "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]
                }
                answered = [client.post("/v2/models/faulty/infer", json=faulty) for _ in range(3)]
                assert [r.status_code for r in answered] == [200] * 3
                names = [r.json()["model_name"] for r in answered]
                assert "faulty_backup" in names, names
            monitor = server.server.registry.get("mlp").drift
            assert monitor is not None
            monitor.wait_idle()  # the windows of that traffic are tested
            yield server


def scraped_sample_names(server: RunningServer) -> set[str]:
    """Sample names as exposed: histograms as their _bucket/_sum/_count, counters as _total."""
    text = httpx.get(server.metrics_url, timeout=10).text
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def scraped_family_names(server: RunningServer) -> set[str]:
    text = httpx.get(server.metrics_url, timeout=10).text
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_queried_metric_exists_in_a_live_scrape(live: RunningServer, source: str) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else [r["expr"] for r in alert_rules()]
    used = set().union(*(metric_names(e) for e in exprs)) - PROMETHEUS_SYNTHETIC
    # Compared with sample names, not family names: `inferd_inference_count_total` is a
    # counter (not a histogram's _count), and a histogram is queried as name_bucket.
    scraped = scraped_sample_names(live)
    assert used, f"no metric names found in the {source}'s expressions"
    assert "inferd_request_duration_seconds_bucket" in used
    missing = sorted(used - scraped)
    assert not missing, f"the {source} queries metrics the server does not export: {missing}"


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert "label_values(inferd_request_success_total" in variables["model"]["definition"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert panel["targets"], panel["title"]
    all_exprs = " ".join(dashboard_exprs())
    for needed in (
        "inferd_request_failure_total",
        "inferd_queue_duration_seconds",
        "inferd_compute_infer_duration_seconds",
        "inferd_batch_size_bucket",
        "inferd_batch_close_total",
        "inferd_queue_depth",
        "inferd_inflight_requests",
        "inferd_health_score",
        "inferd_model_state",
        "process_resident_memory_bytes",
        "inferd_process_memory_returned_bytes_total",
        "inferd_gc_pause_seconds",
        "inferd_drift_score",
        "inferd_drift_samples_dropped_total",
        "inferd_cache_hits_total",
        "inferd_cache_misses_total",
        "inferd_cache_errors_total",
        "inferd_cache_evictions_total",
        "inferd_cache_dropped_inserts_total",
        "inferd_cache_bytes",
        "inferd_cache_lookup_seconds_bucket",
        "inferd_degradation_tier",
        "inferd_degraded_requests_total",
        "inferd_degradation_p99_seconds",
    ):
        assert needed in all_exprs, f"no panel shows {needed}"


def test_the_metrics_doc_names_every_exported_metric(live: RunningServer) -> None:
    doc = METRICS_DOC.read_text(encoding="utf-8")
    ours = {n for n in scraped_family_names(live) if n.startswith(("inferd_", "nv_"))}
    assert "inferd_request_duration_seconds" in ours and "nv_inference_count" in ours
    missing = sorted(n for n in ours if not re.search(rf"`{n}(_total)?`", doc))
    assert not missing, f"docs/metrics.md does not describe: {missing}"


# -- a real Prometheus -------------------------------------------------------------------


@contextlib.contextmanager
def prometheus(tmp_path: Path, target_port: int) -> Iterator[tuple[str, Path]]:
    """A Prometheus on a free port scraping 127.0.0.1:target_port every second."""
    binary = tool("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        f"rule_files: [{json.dumps(str(ALERTS))}]\n"
        "scrape_configs:\n"
        "  - job_name: inferd\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n",
        encoding="utf-8",
    )
    log_path = tmp_path / "prometheus.log"
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            # Ours, alive and answering on its port before any query
            # (tests/support/server_process.py).
            wait_until_serving(
                process.pid,
                port,
                "/-/ready",
                exit_code=process.poll,
                output=lambda: log_path.read_text(encoding="utf-8", errors="replace")[-4000:],
                timeout_s=60,
            )
            yield f"http://127.0.0.1:{port}", log_path
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def query(client: httpx.Client, url: str, expr: str) -> list[dict[str, Any]]:
    response = client.get(f"{url}/api/v1/query", params={"query": expr})
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_prometheus_scrapes_a_live_server_end_to_end(live: RunningServer, tmp_path: Path) -> None:
    metrics_port = live.server.metrics_server.port  # type: ignore[union-attr]
    with prometheus(tmp_path, metrics_port) as (url, log_path), httpx.Client(timeout=5) as client:

        def logs() -> str:
            return log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

        deadline = time.monotonic() + 60
        p99: float | None = None
        while p99 is None:
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus never answered a p99 for mlp. Its log:\n{logs()}")
            send_traffic(live)  # keeps the rate over the window above zero
            time.sleep(0.5)
            with contextlib.suppress(httpx.TransportError):  # still starting
                for series in query(client, url, P99_MLP):
                    if series["metric"].get("model") == "mlp":
                        value = float(series["value"][1])
                        if value == value:  # not NaN: the window holds two scrapes
                            p99 = value
        assert 0 < p99 < 10, p99

        # The target is up: a scrape that failed to parse would show up == 0 here.
        (up,) = query(client, url, 'up{job="inferd"}')
        assert up["value"][1] == "1", logs()

        # Triton's names as Triton's Prometheus has them: bare-named counters, typed counter.
        assert query(client, url, 'nv_inference_count{model="mlp"}')
        assert query(client, url, 'nv_inference_request_failure{reason="OTHER"}')
        assert query(client, url, "nv_cpu_utilization")
        metadata = client.get(f"{url}/api/v1/metadata").json()["data"]
        assert metadata["nv_inference_count"][0]["type"] == "counter", metadata
        assert metadata["nv_inference_request_success"][0]["type"] == "counter"
        assert metadata["nv_cpu_memory_used_bytes"][0]["type"] == "gauge"

        # Every dashboard query is valid PromQL that Prometheus evaluates without error.
        for expr in dashboard_exprs():
            concrete = (
                expr.replace("$__rate_interval", "1m")
                .replace('"$job"', '".*"')
                .replace('"$model"', '".*"')
            )
            assert "$" not in concrete, concrete
            query(client, url, concrete)
        assert query(client, url, 'sum by (reason) (inferd_batch_close_total{model="mlp"})')

        # The alert rules are loaded and evaluate without error (e.g. no many-to-many match).
        evaluated: dict[str, dict[str, Any]] = {}
        while len(evaluated) < len(alert_rules()):
            if time.monotonic() > deadline + 30:
                pytest.fail(f"rules not evaluated: {evaluated}. Prometheus' log:\n{logs()}")
            groups = client.get(f"{url}/api/v1/rules").json()["data"]["groups"]
            evaluated = {
                r["name"]: r
                for g in groups
                for r in g["rules"]
                if r.get("lastEvaluation", "").startswith("2") and r["health"] != "unknown"
            }
            time.sleep(0.5)
        bad = {n: r.get("lastError") for n, r in evaluated.items() if r["health"] != "ok"}
        assert not bad, bad
        assert set(evaluated) == {r["alert"] for r in alert_rules()}
