"""Kafka security passes through: a broker with TLS (mutual), SASL_SSL (PLAIN) and
SASL_PLAINTEXT (OAUTHBEARER, unsecured tokens) listeners, with certificates and tokens the
test makes; `stream check --kafka`, the processor, producers and the auditor all go
through it."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from instanced_stream.kafka.security import client_options, register
from instanced_stream.settings import Settings
from instanced_stream_bench.harness.demo import launch_processor
from instanced_stream_bench.testing.broker import LocalKafka, Tls
from instanced_stream_bench.testing.listeners import unsecured_token
from instanced_stream_bench.testing.sim.server import Simulator

from tests.conftest import Deployment, _free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PASSWORD = f"pw-{secrets.token_hex(8)}"  # a canary: must never show in a log


def _pkcs8(pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    ca = trustme.CA(key_type=trustme.KeyType.RSA)
    server = ca.issue_cert("127.0.0.1", "localhost", key_type=trustme.KeyType.RSA)
    client = ca.issue_cert("stream-client", key_type=trustme.KeyType.RSA)
    files = {
        "ca": ca.cert_pem.bytes(),
        # Kafka's PEM keystore: an unencrypted PKCS#8 key, then the certificate chain.
        "keystore": _pkcs8(server.private_key_pem.bytes())
        + b"".join(c.bytes() for c in server.cert_chain_pems),
        "client_cert": b"".join(c.bytes() for c in client.cert_chain_pems),
        "client_key": client.private_key_pem.bytes(),
        "password": PASSWORD.encode(),
        "token": unsecured_token("stream-oauth").encode(),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.pem"
        paths[name].write_bytes(data)
    return paths


@pytest.fixture(scope="module")
def secure_broker(
    certs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalKafka]:
    tls = Tls(certs["keystore"], certs["ca"], client_auth=True, sasl_users={"alice": PASSWORD})
    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"), tls=tls, oauth=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _tls_env(certs: dict[str, Path]) -> dict[str, str]:
    return {
        "STREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
        "STREAM_KAFKA_SSL_CAFILE": str(certs["ca"]),
        "STREAM_KAFKA_SSL_CERTFILE": str(certs["client_cert"]),
        "STREAM_KAFKA_SSL_KEYFILE": str(certs["client_key"]),
    }


def _sasl_env(certs: dict[str, Path]) -> dict[str, str]:
    return {
        "STREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STREAM_KAFKA_SSL_CAFILE": str(certs["ca"]),
        "STREAM_KAFKA_SASL_MECHANISM": "PLAIN",
        "STREAM_KAFKA_SASL_USERNAME": "alice",
        "STREAM_KAFKA_SASL_PASSWORD_FILE": str(certs["password"]),
    }


def _oauth_env(certs: dict[str, Path]) -> dict[str, str]:
    """As docs/kafka-clients.md says: the mechanism and a token file, no user name."""
    return {
        "STREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "STREAM_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE": str(certs["token"]),
    }


def _register(bootstrap: str, env: dict[str, str]) -> None:
    """The test process's own clients (topics, producer, auditor) use the same settings."""
    fields = {k.removeprefix("STREAM_").lower(): v for k, v in env.items()}
    register(bootstrap, client_options(Settings.model_validate(fields)))


async def _deploy(
    bootstrap: str, env: dict[str, str], simulator: tuple[Simulator, str]
) -> Deployment:
    sim, url = simulator
    _register(bootstrap, env)
    settings, spec, proc = await launch_processor(
        bootstrap,
        url,
        f"sec{secrets.token_hex(3)}.",
        "stream-sec-",
        None,
        STREAM_WEB_PORT=str(_free_port()),
        STREAM_SESSION_TIMEOUT_S="6",
        **env,
    )
    return Deployment(bootstrap, settings, spec, sim, proc)


def _items(n: int, tag: str) -> list[dict[str, str]]:
    return [{"_instance": f"{tag}-{i}", "comment": f"kind words {i}"} for i in range(n)]


@pytest.mark.parametrize("listener", ["mutual TLS", "SASL_SSL", "OAUTHBEARER"])
async def test_items_flow_end_to_end_through_a_secured_listener(
    listener: str,
    secure_broker: LocalKafka,
    certs: dict[str, Path],
    simulator: tuple[Simulator, str],
) -> None:
    if listener == "mutual TLS":
        bootstrap, env = secure_broker.ssl_bootstrap, _tls_env(certs)
    elif listener == "OAUTHBEARER":
        bootstrap, env = secure_broker.oauth_bootstrap, _oauth_env(certs)
    else:
        bootstrap, env = secure_broker.sasl_ssl_bootstrap, _sasl_env(certs)
    dep = await _deploy(bootstrap, env, simulator)
    try:
        await dep.produce_items(_items(30, "sec"))
        report = await dep.settle(30, wait_s=120)
        assert report.unaccounted == 0 and report.unexpected == 0
        assert report.calls_by_tool["moderateComment"] == 30
    finally:
        dep.proc.stop()
    log = dep.proc.log_path.read_text(errors="replace")
    assert PASSWORD not in log


def _stream_topics(
    bootstrap: str, env: dict[str, str], *command: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "instanced_stream", *(command or ("topics",))],
        env={**os.environ, "STREAM_BOOTSTRAP_SERVERS": bootstrap, **env},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


async def test_a_client_without_the_ca_or_the_password_fails_clearly(
    secure_broker: LocalKafka, certs: dict[str, Path]
) -> None:
    # topics of their own, created over TLS: a listing of absent ones is an error now
    probe = ("topics", "--create")
    mine = {**_tls_env(certs), "STREAM_TOPIC_PREFIX": "tls-probe-"}
    ok = await asyncio.to_thread(_stream_topics, secure_broker.ssl_bootstrap, mine, *probe)
    assert ok.returncode == 0, ok.stderr[-1500:]
    untrusting = {**_tls_env(certs)}
    untrusting.pop("STREAM_KAFKA_SSL_CAFILE")
    refused = await asyncio.to_thread(_stream_topics, secure_broker.ssl_bootstrap, untrusting)
    assert refused.returncode == 3, refused.stderr[-1500:]
    assert "cannot reach Kafka" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = {**_sasl_env(certs), "STREAM_KAFKA_SASL_PASSWORD_FILE": str(certs["ca"]) + ".nope"}
    unreadable = await asyncio.to_thread(_stream_topics, secure_broker.sasl_ssl_bootstrap, missing)
    assert unreadable.returncode == 2
    assert "STREAM_KAFKA_SASL_PASSWORD_FILE: cannot read" in unreadable.stderr
    assert PASSWORD not in refused.stderr + unreadable.stderr + ok.stdout + ok.stderr


async def test_stream_check_connects_with_an_oauth_token(
    secure_broker: LocalKafka, certs: dict[str, Path], tmp_path: Path
) -> None:
    bootstrap = secure_broker.oauth_bootstrap
    check = ("check", "--kafka")
    # an endpoint `check` lints but, without --endpoint, never contacts
    oauth = {**_oauth_env(certs), "STREAM_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    ok = await asyncio.to_thread(_stream_topics, bootstrap, oauth, *check)
    assert ok.returncode == 0, ok.stderr[-1500:]
    assert f"kafka {bootstrap}: connected over SASL_PLAINTEXT (OAUTHBEARER)" in ok.stdout
    # the token from the environment instead of a file
    token = certs["token"].read_text()
    by_env = {**oauth, "STREAM_KAFKA_SASL_OAUTH_TOKEN": token}
    by_env.pop("STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE")
    env_ok = await asyncio.to_thread(_stream_topics, bootstrap, by_env, *check)
    assert env_ok.returncode == 0, env_ok.stderr[-1500:]
    # a token the broker refuses (expired) is one line and exit code 3, never a traceback
    expired = tmp_path / "expired"
    expired.write_text(unsecured_token("stream-oauth", lifetime_s=-60))
    stale = {**oauth, "STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE": str(expired)}
    refused = await asyncio.to_thread(_stream_topics, bootstrap, stale, *check)
    assert refused.returncode == 3, refused.stdout + refused.stderr[-1500:]
    assert "cannot reach Kafka" in refused.stderr and "Traceback" not in refused.stderr
    assert token not in ok.stdout + ok.stderr + env_ok.stdout + env_ok.stderr
