"""Extra listeners of the local broker for security tests: SASL/OAUTHBEARER with unsecured
tokens, and the tokens a client presents to it.

Kafka's OAUTHBEARER validates tokens through a server callback; without one configured it
uses its built-in validator of *unsecured* JWTs (`alg: none`, no signature), which checks
the claims (subject, expiry) but trusts their issuer. That is enough to prove a client's
whole OAUTHBEARER path (mechanism, token provider, re-authentication) against a real
broker with nothing but the broker's own jars; it is never a production setup.
"""

from __future__ import annotations

import base64
import json
import time

__all__ = ["OAUTH_LISTENER", "oauth_listener", "unsecured_token"]

OAUTH_LISTENER = "OAUTH"  # the listener's name in the broker's properties
_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def oauth_listener(props: dict[str, str], host: str, port: int) -> dict[str, str]:
    """The broker properties that add a SASL_PLAINTEXT listener on `host:port` taking
    OAUTHBEARER with unsecured tokens, appended to what `props` already lists. Every
    setting is under the listener's own prefix, so a PLAIN listener beside it keeps its
    mechanisms."""
    name, prefix = OAUTH_LISTENER, f"listener.name.{OAUTH_LISTENER.lower()}."
    return {
        "listeners": f"{props['listeners']},{name}://{host}:{port}",
        "advertised.listeners": f"{props['advertised.listeners']},{name}://{host}:{port}",
        "listener.security.protocol.map": f"{props['listener.security.protocol.map']},"
        f"{name}:SASL_PLAINTEXT",
        prefix + "sasl.enabled.mechanisms": "OAUTHBEARER",
        # the broker's own login (it never talks to this listener as a client, but Kafka
        # wants a login module per mechanism); the unsecured validator is the default
        prefix + "oauthbearer.sasl.jaas.config": (
            f'{_LOGIN_MODULE} required unsecuredLoginStringClaim_sub="broker";'
        ),
    }


def _part(claims: dict[str, object]) -> str:
    raw = json.dumps(claims, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsecured_token(principal: str, lifetime_s: int = 3600) -> str:
    """An unsigned JWT naming `principal`, valid for `lifetime_s`: what the listener above
    accepts (and what no real identity provider issues)."""
    now = int(time.time())
    header = _part({"alg": "none"})
    body = _part({"sub": principal, "iat": now, "exp": now + lifetime_s})
    return f"{header}.{body}."
