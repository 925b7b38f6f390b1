"""deploy/: the KEDA wiring (TriggerAuthentication component, names filled from the
settings, scale-out gated on the circuit) and the activity worker's probes, offline.

kustomize is not available as a Python package, so the two kustomize features used here
(a Component's JSON patches, an overlay's replacements) are applied by hand below, the
way kustomize applies them, and the results validated like the plain manifests."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import promql_parser
import pytest
import yaml

from instanced_stream.ops.metrics import Metrics
from instanced_stream.settings import Settings, Topics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "example"
AUTH = DEPLOY / "components" / "kafka-auth"

# KEDA's TriggerAuthentication as far as we use it (hand-written, as for ScaledObject).
TRIGGER_AUTHENTICATION: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
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
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base(kind: str, name: str) -> dict[str, Any]:
    for path in BASE.glob("*.yaml"):
        for doc in _docs(path):
            if doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind}/{name} in the base")


def _add(doc: dict[str, Any], path: str, value: Any) -> None:
    """A JSON Patch `add` (RFC 6902): the parent must exist, `-` appends."""
    *parents, last = [p for p in path.split("/") if p]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node.append(value) if last == "-" else node.insert(int(last), value)
    else:
        node[last] = value


def _patched(kind: str, name: str) -> dict[str, Any]:
    doc = copy.deepcopy(_base(kind, name))
    for patch in yaml.safe_load((AUTH / "kustomization.yaml").read_text())["patches"]:
        target = patch["target"]
        if target["kind"] == kind and re.fullmatch(target["name"], name):
            for op in yaml.safe_load(patch["patch"]):
                assert op["op"] == "add"
                _add(doc, op["path"], op["value"])
    return doc


def _overlay() -> dict[str, Any]:
    return dict(yaml.safe_load((OVERLAY / "kustomization.yaml").read_text()))


def _overlay_settings() -> dict[str, str]:
    (generated,) = [g for g in _overlay()["configMapGenerator"] if g["name"] == "stream-settings"]
    return dict(item.split("=", 1) for item in generated["literals"])


def _set(doc: dict[str, Any], field_path: str, value: str) -> None:
    """kustomize's replacement field path: dots, and `[name=x]` to pick a list item."""
    node: Any = doc
    *parents, last = re.findall(r"\[[^\]]+\]|[^.\[\]]+", field_path)
    for part in parents:
        if part.startswith("["):
            key, _, want = part[1:-1].partition("=")
            matches = [item for item in node if item.get(key) == want]
            assert len(matches) == 1, f"{field_path}: {part} matches {len(matches)} items"
            node = matches[0]
        else:
            node = node[part]
    assert last in node, f"{field_path}: no field {last} to replace"
    node[last] = value


def test_trigger_authentication_component() -> None:
    component = yaml.safe_load((AUTH / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (auth,) = [d for r in component["resources"] for d in _docs(AUTH / r)]
    errors = list(jsonschema.Draft202012Validator(TRIGGER_AUTHENTICATION).iter_errors(auth))
    assert not errors, [e.message for e in errors]
    secrets = {ref["name"] for ref in auth["spec"]["secretTargetRef"]}
    assert secrets == {"kafka-client"}
    scaled = _patched("ScaledObject", "stream-processor")
    kafka = next(t for t in scaled["spec"]["triggers"] if t["type"] == "kafka")
    assert kafka["authenticationRef"] == {"name": auth["metadata"]["name"]}


@pytest.mark.parametrize("deployment", ["stream-processor", "stream-activities"])
def test_auth_component_patches_give_valid_deployments(deployment: str) -> None:
    doc = _patched("Deployment", deployment)
    kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    env = {e["name"]: e for e in doc["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STREAM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "kafka-client"
    assert set(env) - {"OPENAI_API_KEY"} <= {f"STREAM_{f.upper()}" for f in Settings.model_fields}


def test_scaled_object_names_follow_the_settings() -> None:
    settings = _overlay_settings()
    scaled = copy.deepcopy(_base("ScaledObject", "stream-processor"))
    for replacement in _overlay()["replacements"]:
        source = replacement["source"]
        assert (source["kind"], source["name"]) == ("ConfigMap", "stream-settings")
        value = settings[source["fieldPath"].removeprefix("data.")]
        for target in replacement["targets"]:
            assert target["select"] == {"kind": "ScaledObject", "name": "stream-processor"}
            for path in target["fieldPaths"]:
                _set(scaled, path, value)
    # What the processors use, computed by the product itself from the same settings.
    prefix = settings.get("STREAM_TOPIC_PREFIX", "")
    kafka = next(t for t in scaled["spec"]["triggers"] if t["name"] == "lag")["metadata"]
    assert kafka["consumerGroup"] == prefix + settings["STREAM_APP_ID"]
    assert kafka["topic"] == Topics(prefix, settings["STREAM_INPUT_TOPIC"]).input


def test_scale_out_is_gated_on_the_circuit() -> None:
    spec = _base("ScaledObject", "stream-processor")["spec"]
    triggers = {t["name"]: t for t in spec["triggers"]}
    formula = spec["advanced"]["scalingModifiers"]["formula"]
    assert set(re.findall(r"[a-z]+", formula)) == set(triggers)
    query = triggers["circuit"]["metadata"]["query"]
    promql_parser.parse(query)
    assert "stream_circuit_open" in query
    assert "stream_circuit_open" in Metrics().render().decode()


def test_activities_worker_serves_probes_on_its_own_port() -> None:
    deployment = _base("Deployment", "stream-activities")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = Settings.model_fields["worker_web_port"].default
    assert port != Settings.model_fields["web_port"].default
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert "--group" in container["args"]
