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


def _tls_files(tmp_path: Path) -> dict[str, Path]:
    import trustme

    ca = trustme.CA()
    client = ca.issue_cert("client.example")
    files = {name: tmp_path / name for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert"]))
    client.private_key_pem.write_to_path(str(files["key"]))
    return files


def _one_line(settings: Settings) -> str:
    with pytest.raises(StreamError) as refused:
        client_options(settings)
    assert "\n" not in refused.value.message
    return refused.value.message


def test_a_missing_or_empty_oauth_token_file_is_refused_at_start(tmp_path: Path) -> None:
    missing = _one_line(_oauth(kafka_sasl_oauth_token_file=tmp_path / "absent"))
    assert missing.startswith("STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: cannot read")
    (tmp_path / "empty").write_text("\n")
    empty = _one_line(_oauth(kafka_sasl_oauth_token_file=tmp_path / "empty"))
    assert empty == f"STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: {tmp_path / 'empty'} is empty"


def test_a_client_certificate_without_its_key_is_one_line_naming_both(tmp_path: Path) -> None:
    files = _tls_files(tmp_path)
    tls = {"kafka_security_protocol": "SSL", "kafka_ssl_cafile": files["ca"]}
    alone = _one_line(Settings.model_validate({**tls, "kafka_ssl_certfile": files["cert"]}))
    assert alone.startswith(f"STREAM_KAFKA_SSL_CERTFILE={files['cert']}: no private key")
    assert "STREAM_KAFKA_SSL_KEYFILE" in alone
    wrong = {**tls, "kafka_ssl_certfile": files["cert"], "kafka_ssl_keyfile": files["ca"]}
    assert "cannot load them" in _one_line(Settings.model_validate(wrong))
    right = {**tls, "kafka_ssl_certfile": files["cert"], "kafka_ssl_keyfile": files["key"]}
    assert "ssl_context" in client_options(Settings.model_validate(right))
    # one file holding the certificate and its key is what OpenSSL takes without a keyfile
    both = tmp_path / "both"
    both.write_bytes(files["cert"].read_bytes() + files["key"].read_bytes())
    assert "ssl_context" in client_options(
        Settings.model_validate({**tls, "kafka_ssl_certfile": both})
    )
    key_only = _one_line(Settings.model_validate({**tls, "kafka_ssl_keyfile": files["key"]}))
    assert key_only.startswith("STREAM_KAFKA_SSL_KEYFILE set without STREAM_KAFKA_SSL_CERTFILE")


def test_sasl_credentials_over_plaintext_are_refused_naming_them(tmp_path: Path) -> None:
    plain = Settings.model_validate({"kafka_sasl_username": "alice", "kafka_sasl_password": "pw"})
    message = _one_line(plain)
    assert message.startswith(
        "STREAM_KAFKA_SASL_USERNAME, STREAM_KAFKA_SASL_PASSWORD set, but "
        "STREAM_KAFKA_SECURITY_PROTOCOL=PLAINTEXT sends no SASL credentials"
    )
    files = _tls_files(tmp_path)
    no_tls = {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_ssl_cafile": files["ca"]}
    no_tls |= {"kafka_sasl_username": "alice", "kafka_sasl_password": "pw"}
    assert "STREAM_KAFKA_SSL_CAFILE set, but" in _one_line(Settings.model_validate(no_tls))


def test_a_mechanism_only_warns_where_the_protocol_has_no_sasl() -> None:
    from instanced_stream.kafka.security import ignored_settings

    assert ignored_settings(Settings()) == []
    shared = Settings.model_validate({"kafka_sasl_mechanism": "SCRAM-SHA-512"})
    assert client_options(shared) == {}
    assert ignored_settings(shared) == [
        "STREAM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 is ignored: "
        "STREAM_KAFKA_SECURITY_PROTOCOL=PLAINTEXT uses no SASL"
    ]


def test_settings_a_mechanism_does_not_use_are_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a.jwt.token")
    with_user = _oauth(kafka_sasl_oauth_token_file=token, kafka_sasl_username="alice")
    assert _one_line(with_user) == (
        "STREAM_KAFKA_SASL_USERNAME not used by STREAM_KAFKA_SASL_MECHANISM=OAUTHBEARER "
        "(it sends its token): unset them"
    )
    scram = Settings.model_validate(
        {
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-256",
            "kafka_sasl_username": "alice",
            "kafka_sasl_password": "pw",
            "kafka_sasl_oauth_token_file": token,
        }
    )
    assert _one_line(scram).startswith("STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE not used by")
