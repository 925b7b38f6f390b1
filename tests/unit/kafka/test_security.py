"""Kafka client options from the settings: SASL OAUTHBEARER's token file, compression."""

from __future__ import annotations

from pathlib import Path

import pytest
from instanced_stream.errors import StreamError
from instanced_stream.kafka.security import TokenFile, client_options
from instanced_stream.settings import Settings


def _oauth(**extra: object) -> Settings:
    return Settings.model_validate(
        {
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "OAUTHBEARER",
            **extra,
        }
    )


async def test_oauthbearer_reads_the_token_file_at_every_authentication(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first.jwt.token\n")
    options = client_options(_oauth(kafka_sasl_oauth_token_file=token))
    assert options["sasl_mechanism"] == "OAUTHBEARER"
    provider = options["sasl_oauth_token_provider"]
    assert isinstance(provider, TokenFile)
    assert await provider.token() == "first.jwt.token"
    token.write_text("rotated.jwt.token")  # a sidecar refreshed it
    assert await provider.token() == "rotated.jwt.token"
    assert "sasl_plain_password" not in options


async def test_oauthbearer_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(StreamError, match="STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE"):
        client_options(_oauth())
    provider = TokenFile(tmp_path / "absent")
    with pytest.raises(StreamError, match="cannot read"):
        await provider.token()
    (tmp_path / "empty").write_text("")
    with pytest.raises(StreamError, match="is empty"):
        await TokenFile(tmp_path / "empty").token()


async def test_oauthbearer_takes_a_token_from_the_environment_and_no_user_name() -> None:
    from instanced_stream.ops.check import lint_settings

    settings = _oauth(kafka_sasl_oauth_token="env.jwt.token")
    provider = client_options(settings)["sasl_oauth_token_provider"]
    assert await provider.token() == "env.jwt.token"
    assert "env.jwt.token" not in repr(provider)
    assert lint_settings(settings) == []  # no STREAM_KAFKA_SASL_USERNAME asked for
    scram = Settings.model_validate(
        {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512"}
    )
    assert lint_settings(scram) == ["SASL SCRAM-SHA-512 needs STREAM_KAFKA_SASL_USERNAME"]


def test_compression_is_a_setting_with_a_cheap_default() -> None:
    assert Settings().kafka_compression == "lz4"
    assert Settings(kafka_compression="zstd").kafka_compression == "zstd"
    with pytest.raises(ValueError, match="kafka_compression"):
        Settings.model_validate({"kafka_compression": "brotli"})
