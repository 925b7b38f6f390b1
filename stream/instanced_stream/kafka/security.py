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

__all__ = [
    "Token",
    "TokenFile",
    "client_options",
    "ignored_settings",
    "options_for",
    "register",
    "security_problems",
]

_OPTIONS: dict[str, dict[str, Any]] = {}


_SASL_PASSWORD = ("kafka_sasl_username", "kafka_sasl_password", "kafka_sasl_password_file")
_SASL_TOKEN = ("kafka_sasl_oauth_token", "kafka_sasl_oauth_token_file")
_TLS = ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile", "kafka_ssl_key_password")


def _names(fields: list[str]) -> str:
    return ", ".join(f"STREAM_{field.upper()}" for field in fields)


def _given(settings: Settings, fields: tuple[str, ...]) -> list[str]:
    return [field for field in fields if getattr(settings, field) is not None]


def security_problems(settings: Settings) -> list[str]:
    """Security settings the chosen protocol or mechanism would silently ignore: a
    credential that is never sent is almost always a protocol left at its default, and
    connecting without it would look like an authorisation problem much later."""
    protocol = settings.kafka_security_protocol
    sasl, tls = protocol.startswith("SASL"), protocol.endswith("SSL")
    problems = []
    credentials = _given(settings, _SASL_PASSWORD + _SASL_TOKEN)
    if credentials and not sasl:
        problems.append(
            f"{_names(credentials)} set, but STREAM_KAFKA_SECURITY_PROTOCOL={protocol} sends "
            "no SASL credentials: set it to SASL_SSL (or SASL_PLAINTEXT), or unset them"
        )
    tls_files = _given(settings, _TLS)
    if tls_files and not tls:
        problems.append(
            f"{_names(tls_files)} set, but STREAM_KAFKA_SECURITY_PROTOCOL={protocol} does not "
            "use TLS: set it to SSL (or SASL_SSL), or unset them"
        )
    oauth = settings.kafka_sasl_mechanism == "OAUTHBEARER"
    unused = _given(settings, _SASL_PASSWORD if oauth else _SASL_TOKEN)
    if sasl and unused:
        mechanism = f"STREAM_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism}"
        uses = "its token" if oauth else "a user name and password"
        problems.append(f"{_names(unused)} not used by {mechanism} (it sends {uses}): unset them")
    if tls and settings.kafka_ssl_certfile is None:
        without = _given(settings, ("kafka_ssl_keyfile", "kafka_ssl_key_password"))
        if without:
            problems.append(
                f"{_names(without)} set without STREAM_KAFKA_SSL_CERTFILE: a key is used "
                "only with a client certificate; set the certificate, or unset them"
            )
    return problems


def ignored_settings(settings: Settings) -> list[str]:
    """Settings the protocol ignores that a user may well mean to keep (one configuration
    shared by clusters with and without SASL): named in a warning, not refused."""
    protocol = settings.kafka_security_protocol
    warnings = []
    if not protocol.startswith("SASL") and "kafka_sasl_mechanism" in settings.model_fields_set:
        warnings.append(
            f"STREAM_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism} is ignored: "
            f"STREAM_KAFKA_SECURITY_PROTOCOL={protocol} uses no SASL"
        )
    if not protocol.endswith("SSL") and "kafka_ssl_check_hostname" in settings.model_fields_set:
        warnings.append(
            "STREAM_KAFKA_SSL_CHECK_HOSTNAME is ignored: "
            f"STREAM_KAFKA_SECURITY_PROTOCOL={protocol} uses no TLS"
        )
    return warnings


def client_options(settings: Settings) -> dict[str, Any]:
    """aiokafka keyword arguments for the settings' security protocol; StreamError, one
    line naming the setting, for a combination it would ignore or a file it cannot use."""
    problems = security_problems(settings)
    if problems:
        raise StreamError("; ".join(problems))
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
        # Read now, as the SCRAM password file is: a token missing at start is a
        # configuration mistake, not the "cannot reach Kafka" it would look like later.
        _token_text(token_file)
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
        return _token_text(self.path)


def _token_text(path: Path) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise StreamError(f"STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: cannot read: {exc}") from exc
    if not value:
        raise StreamError(f"STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: {path} is empty")
    return value


def _ssl_context(settings: Settings) -> ssl.SSLContext:
    for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile"):
        path = getattr(settings, name)
        if path is not None and not path.is_file():
            raise StreamError(f"STREAM_{name.upper()}: no such file: {path}")
    key_password = settings.kafka_ssl_key_password
    cafile, certfile, keyfile = (
        settings.kafka_ssl_cafile,
        settings.kafka_ssl_certfile,
        settings.kafka_ssl_keyfile,
    )
    try:
        context: ssl.SSLContext = create_ssl_context(cafile=str(cafile) if cafile else None)
    except ssl.SSLError as exc:
        raise StreamError(
            f"STREAM_KAFKA_SSL_CAFILE={cafile}: not a PEM file of CA certificates ({exc.reason})"
        ) from exc
    if certfile is not None:
        try:
            context.load_cert_chain(
                str(certfile),
                str(keyfile) if keyfile else None,
                key_password.get_secret_value() if key_password else None,
            )
        except ssl.SSLError as exc:
            raise StreamError(_cert_problem(certfile, keyfile, exc)) from exc
    context.check_hostname = settings.kafka_ssl_check_hostname
    return context


def _cert_problem(certfile: Path, keyfile: Path | None, exc: ssl.SSLError) -> str:
    """What OpenSSL's `PEM lib` means for the user's two settings."""
    if keyfile is None:
        return (
            f"STREAM_KAFKA_SSL_CERTFILE={certfile}: no private key in it ({exc.reason}): set "
            "STREAM_KAFKA_SSL_KEYFILE to the client's key (PEM), or give one file holding both"
        )
    return (
        f"STREAM_KAFKA_SSL_CERTFILE={certfile} with STREAM_KAFKA_SSL_KEYFILE={keyfile}: cannot "
        f"load them ({exc.reason}): not PEM, a key that does not match the certificate, or "
        "a wrong STREAM_KAFKA_SSL_KEY_PASSWORD"
    )


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
