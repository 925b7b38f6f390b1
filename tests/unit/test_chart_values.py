"""The Helm chart takes your spec, your handlers and your cluster's ways: a custom spec
with the example's handlers is refused at render time in one line; mutual TLS and
OAUTHBEARER reach the pods and KEDA; the usual extra values land on both pods; and
values.schema.json refuses a misspelt value."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.unit.test_deploy import (
    CHART,
    NAMESPACE,
    RELEASE,
    REQUIRED,
    VARIANTS,
    _container,
    _merged,
    _render,
    _settings,
    _workload,
)


def _refusal(extra: dict[str, Any]) -> str:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as failed:
        chart.render(_merged(REQUIRED, extra), name=RELEASE, namespace=NAMESPACE)
    return str(failed.value)


def _env(component: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in _container(component, docs)["env"]
    }


def _trigger_keys(docs: list[dict[str, Any]]) -> list[str]:
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    return [r["parameter"] for r in auth["spec"]["secretTargetRef"]]


def test_your_spec_with_the_example_handlers_is_refused_in_one_line() -> None:
    message = _refusal({"spec": "name: mine\ntools: []\n"})
    reason = message.split("): ", 1)[-1]
    assert reason.startswith("activities.module is required with your own spec"), message
    assert "\n" not in reason.strip()
    # your handlers' module, or no workers, and it renders
    own = _render({"spec": "name: mine\n", "activities": {"module": "/app/ours.py"}})
    assert _container("activities", own)["args"][1] == "/app/ours.py"
    assert _render({"spec": "name: mine\n", "activities": {"enabled": False}})
    # the chart's own spec keeps the example's handlers
    assert _container("activities", _render())["args"][1].endswith("moderation/activities.py")


def test_mutual_tls_mounts_the_client_certificate_for_the_pods_and_keda() -> None:
    docs = _render(VARIANTS["mtls"])
    for component in ("processor", "activities"):
        env = _env(component, docs)
        assert env["STREAM_KAFKA_SSL_CERTFILE"] == "/etc/kafka-client/cert"
        assert env["STREAM_KAFKA_SSL_KEYFILE"] == "/etc/kafka-client/key"
        assert env["STREAM_KAFKA_SSL_CAFILE"] == "/etc/kafka-client/ca"
        mounts = {m["name"]: m["mountPath"] for m in _container(component, docs)["volumeMounts"]}
        assert mounts["kafka-client"] == "/etc/kafka-client"
    assert _trigger_keys(docs) == ["tls", "ca", "cert", "key"]
    assert "STREAM_KAFKA_SASL_USERNAME" not in _settings(docs)
    message = _refusal({"kafka": {"securityProtocol": "SSL", "tls": {"clientAuth": True}}})
    assert "kafka.clientSecret is required with kafka.tls.clientAuth" in message


def test_oauthbearer_sets_the_token_file_and_asks_no_user_name() -> None:
    docs = _render(VARIANTS["oauth"])
    settings = _settings(docs)
    assert settings["STREAM_KAFKA_SASL_MECHANISM"] == "OAUTHBEARER"
    assert "STREAM_KAFKA_SASL_USERNAME" not in settings
    token = "/var/run/secrets/kafka-oauth/token"
    for component in ("processor", "activities"):
        env = _env(component, docs)
        assert env["STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE"] == token
        assert "STREAM_KAFKA_SASL_PASSWORD" not in env
        pod = _workload(component, docs)["spec"]["template"]["spec"]
        (projected,) = [v for v in pod["volumes"] if v["name"] == "kafka-oauth"]
        source = projected["projected"]["sources"][0]["serviceAccountToken"]
        assert (source["path"], source["audience"]) == ("token", "kafka")
        mounts = {m["name"]: m["mountPath"] for m in _container(component, docs)["volumeMounts"]}
        assert f"{mounts['kafka-oauth']}/token" == token
    # KEDA cannot read the pods' token: it takes client credentials and the endpoint
    keys = _trigger_keys(docs)
    assert {"sasl", "username", "password", "oauthTokenEndpointUri", "tls", "ca"} == set(keys)
    # a token file of your own (a sidecar's) replaces the projected token
    own = _merged(VARIANTS["oauth"], {"kafka": {"sasl": {"oauth": {"tokenFile": "/t/tok"}}}})
    docs = _render(own)
    assert _env("processor", docs)["STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE"] == "/t/tok"
    pod = _workload("processor", docs)["spec"]["template"]["spec"]
    assert "kafka-oauth" not in {v["name"] for v in pod["volumes"]}
    no_audience = _merged(VARIANTS["oauth"], {"kafka": {"sasl": {"oauth": {"audience": ""}}}})
    assert "kafka.sasl.oauth.audience is required" in _refusal(no_audience)


def test_extra_values_reach_both_pods() -> None:
    extras = VARIANTS["extras"]
    docs = _render(extras)
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["annotations"] == extras["serviceAccount"]["annotations"]
    for component in ("processor", "activities"):
        pod = _workload(component, docs)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["nodeSelector"] == {"pool": "stream"}
        assert pod["tolerations"] == extras["tolerations"]
        assert pod["affinity"] == extras["affinity"]
        assert {"name": "handlers-config", "configMap": {"name": "ours"}} in pod["volumes"]
        container = _container(component, docs)
        assert {"name": "handlers-config", "mountPath": "/etc/ours"} in container["volumeMounts"]
        assert _env(component, docs)["STREAM_LOG_LEVEL"] == "DEBUG"
    plain = _workload("processor", _render())["spec"]["template"]["spec"]
    assert not {"serviceAccountName", "imagePullSecrets", "nodeSelector"} & set(plain)


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"activities": {"replicaz": 3}}, "/activities"),
        ({"partitions": "four"}, "/partitions"),
        ({"kafka": {"sasl": {"mechanism": "GSSAPI"}}}, "/kafka/sasl/mechanism"),
        ({"settings": {"LOG_LEVEL": "DEBUG"}}, "LOG_LEVEL"),
    ],
)
def test_the_values_schema_refuses_a_misspelt_or_mistyped_value(
    values: dict[str, Any], path: str
) -> None:
    message = _refusal(values)
    assert "schema" in message and path in message, message
