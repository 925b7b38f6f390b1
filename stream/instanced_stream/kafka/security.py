"""Kafka security (TLS, SASL PLAIN/SCRAM/OAUTHBEARER) for every Kafka client the product creates.

Settings say how to reach a cluster (`STREAM_KAFKA_*`); `register` files those options
under the cluster's bootstrap address once, at start-up, and every client built for that
address (producers, consumers, admin clients) asks `options_for` it. The
address is what the code already passes everywhere, and one process may talk to two
clusters (the tests do), so a lookup by address keeps both apart without threading a
second argument through every function. Secrets are read here, from the settings or a
mounted file, and never logged: the options are handed to the clients only.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

from instanced_stream.errors import StreamError
from instanced_stream.settings import Settings

__all__ = ["Token", "TokenFile", "client_options", "options_for", "register"]

_OPTIONS: dict[str, dict[str, Any]] = {}


def client_options(settings: Settings) -> dict[str, Any]:
    """aiokafka keyword arguments for the settings' security protocol."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _ssl_context(settings)
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    if sasl and settings.kafka_sasl_mechanism == "OAUTHBEARER":
        options.update(sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=_token(settings))
    elif sasl:
        password = _sasl_password(settings)
        if not settings.kafka_sasl_username or password is None:
            raise StreamError(
                f"{protocol} needs STREAM_KAFKA_SASL_USERNAME and STREAM_KAFKA_SASL_PASSWORD "
                "(or STREAM_KAFKA_SASL_PASSWORD_FILE)"
            )
        options.update(
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_plain_username=settings.kafka_sasl_username,
            sasl_plain_password=password,
        )
    return options


def _token(settings: Settings) -> AbstractTokenProvider:
    token_file, token = settings.kafka_sasl_oauth_token_file, settings.kafka_sasl_oauth_token
    if token_file is not None:
        return TokenFile(token_file)
    if token is not None and token.get_secret_value().strip():
        return Token(token.get_secret_value().strip())
    raise StreamError(
        "OAUTHBEARER needs STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE (a file kept fresh) or "
        "STREAM_KAFKA_SASL_OAUTH_TOKEN"
    )


class Token(AbstractTokenProvider):  # type: ignore[misc]
    """A token given once (STREAM_KAFKA_SASL_OAUTH_TOKEN): for tokens that outlive the
    process, or a test; one that expires needs TokenFile."""

    def __init__(self, value: str) -> None:
        self._value = value

    async def token(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Token(***)"  # a token never reaches a log


class TokenFile(AbstractTokenProvider):  # type: ignore[misc]
    """SASL OAUTHBEARER's token, read from a file every time the client authenticates: the
    file is kept fresh by whoever owns the identity (a Kubernetes projected token, a
    sidecar of the cloud's identity agent), so a token never outlives its rotation here."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def token(self) -> str:
        try:
            value = self.path.read_text().strip()
        except OSError as exc:
            raise StreamError(f"STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: cannot read: {exc}") from exc
        if not value:
            raise StreamError(f"STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: {self.path} is empty")
        return value


def _ssl_context(settings: Settings) -> ssl.SSLContext:
    for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile"):
        path = getattr(settings, name)
        if path is not None and not path.is_file():
            raise StreamError(f"STREAM_{name.upper()}: no such file: {path}")
    key_password = settings.kafka_ssl_key_password
    context: ssl.SSLContext = create_ssl_context(
        cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None,
        certfile=str(settings.kafka_ssl_certfile) if settings.kafka_ssl_certfile else None,
        keyfile=str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
        password=key_password.get_secret_value() if key_password else None,
    )
    context.check_hostname = settings.kafka_ssl_check_hostname
    return context


def _sasl_password(settings: Settings) -> str | None:
    if settings.kafka_sasl_password is not None:
        return settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_sasl_password_file is not None:
        try:
            return settings.kafka_sasl_password_file.read_text().strip()
        except OSError as exc:
            raise StreamError(f"STREAM_KAFKA_SASL_PASSWORD_FILE: cannot read: {exc}") from exc
    return None


def register(bootstrap: str, options: dict[str, Any]) -> None:
    """Every client for `bootstrap` gets these options from now on."""
    _OPTIONS[bootstrap] = dict(options)


def options_for(bootstrap: str) -> dict[str, Any]:
    return dict(_OPTIONS.get(bootstrap, {}))
