"""faust_app turns the product's settings into faust's: brokers, credentials, a web port
that neither the processor nor the activities worker holds, exactly_once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faust.auth import OAuthCredentials, SASLCredentials
from faust.types.enums import ProcessingGuarantee
from instanced_stream.activities.faust_agent import serve_activities
from instanced_stream.activities.faust_app import faust_app, faust_brokers, faust_options
from instanced_stream.activities.worker import Activities
from instanced_stream.errors import SpecError, StreamError
from instanced_stream.settings import Settings


def _settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)


def test_the_default_web_ports_differ() -> None:
    s = _settings(bootstrap_servers="b:9092")
    assert faust_options(s)["web_port"] == 6068
    assert faust_options(s)["web_port"] not in (s.web_port, s.worker_web_port)


def test_brokers_credentials_and_guarantee_come_from_the_settings(tmp_path: Path) -> None:
    assert faust_brokers(_settings(bootstrap_servers="a:9092, b:9093")) == [
        "kafka://a:9092",
        "kafka://b:9093",
    ]
    with pytest.raises(StreamError, match="STREAM_BOOTSTRAP_SERVERS"):
        faust_brokers(_settings())
    plain = faust_options(_settings(bootstrap_servers="a:9092"))
    assert plain["broker_credentials"] is None
    assert plain["processing_guarantee"] == "exactly_once"
    assert "topic_replication_factor" not in plain
    sasl = faust_options(
        _settings(
            bootstrap_servers="a:9092",
            kafka_security_protocol="SASL_PLAINTEXT",
            kafka_sasl_mechanism="SCRAM-SHA-512",
            kafka_sasl_username="team",
            kafka_sasl_password="secret",
            replication_factor=3,
        )
    )
    creds = sasl["broker_credentials"]
    assert isinstance(creds, SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == (
        "team",
        "secret",
        "SCRAM-SHA-512",
    )
    assert sasl["topic_replication_factor"] == 3
    token = tmp_path / "token"
    token.write_text("t0k3n")
    oauth = faust_options(
        _settings(
            bootstrap_servers="a:9092",
            kafka_security_protocol="SASL_PLAINTEXT",
            kafka_sasl_mechanism="OAUTHBEARER",
            kafka_sasl_oauth_token_file=token,
        )
    )
    assert isinstance(oauth["broker_credentials"], OAuthCredentials)


def test_an_app_from_settings_takes_handlers_without_a_spec(tmp_path: Path) -> None:
    settings = _settings(bootstrap_servers="a:9092", topic_prefix="t.", faust_web_port=7000)
    app = faust_app("team", settings, datadir=str(tmp_path))
    assert app.conf.id == "t.team"
    assert app.conf.web_port == 7000
    guarantee: object = app.conf.processing_guarantee  # typed as its setting's class
    assert guarantee is ProcessingGuarantee.EXACTLY_ONCE
    activities = Activities()

    @activities.activity("lookupCustomer")
    async def lookup(call: object, tool: object, context: object) -> None:
        return None

    agent = serve_activities(app, activities, settings)
    assert list(agent.channel.topics) == ["t.activity.lookupCustomer"]
    with pytest.raises(SpecError, match="no handlers"):
        serve_activities(
            faust_app("other", settings, datadir=str(tmp_path)), Activities(), settings
        )
