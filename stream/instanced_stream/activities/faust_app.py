"""A faust app built from the product's settings: the broker, its credentials and a web port
that a processor on the same host does not hold.

    app = faust_app("my-team-activities", Settings())
    serve_activities(app, activities, Settings())

faust has its own names for everything `STREAM_*` already says (`broker`, `broker_credentials`,
`web_port`, `topic_replication_factor`), and its defaults clash with the product's: its web
server takes port 6066, the processor's port, so an app started beside a processor dies with
"address already in use"; its own topics are created with one replica. This module turns
the settings into faust's, so a team writes none of that by hand (docs/faust.md).
"""

from __future__ import annotations

from typing import Any

import faust
from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from instanced_stream.errors import StreamError
from instanced_stream.kafka.security import client_options
from instanced_stream.settings import Settings

__all__ = ["faust_app", "faust_brokers", "faust_credentials", "faust_options"]


def faust_brokers(settings: Settings) -> list[str]:
    """`STREAM_BOOTSTRAP_SERVERS` (comma-separated host:port) as faust's broker URLs."""
    if not settings.bootstrap_servers:
        raise StreamError("a faust app needs STREAM_BOOTSTRAP_SERVERS: the cluster to join")
    hosts = [h.strip() for h in settings.bootstrap_servers.split(",") if h.strip()]
    return [h if "://" in h else f"kafka://{h}" for h in hosts]


def faust_credentials(settings: Settings) -> CredentialsT | None:
    """`STREAM_KAFKA_*` as faust's credentials object; None for PLAINTEXT. The same
    options every product client gets (kafka/security.py), so one check covers both."""
    options = client_options(settings)
    protocol = options.get("security_protocol")
    context = options.get("ssl_context")
    if protocol is None:
        return None
    if protocol == "SSL":
        return SSLCredentials(context)
    if options["sasl_mechanism"] == "OAUTHBEARER":
        return OAuthCredentials(oauth_cb=options["sasl_oauth_token_provider"], ssl_context=context)
    return SASLCredentials(
        username=options["sasl_plain_username"],
        password=options["sasl_plain_password"],
        ssl_context=context,
        mechanism=options["sasl_mechanism"],
    )


def faust_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of `faust.App` for an app that runs activity handlers."""
    options: dict[str, Any] = {
        "broker": faust_brokers(settings),
        "broker_credentials": faust_credentials(settings),
        # faust's only way to read the activity topics read_committed (faust_agent.py)
        "processing_guarantee": "exactly_once",
        "consumer_auto_offset_reset": "earliest",
        "web_port": settings.faust_web_port,
        "web_host": settings.web_host,
    }
    if settings.replication_factor is not None:
        # faust's own topics (its leader topic, tables' changelogs) default to one replica
        options["topic_replication_factor"] = settings.replication_factor
    return options


def faust_app(app_id: str, settings: Settings, **overrides: Any) -> faust.App:
    """A `faust.App` whose group is `app_id` (prefixed with `STREAM_TOPIC_PREFIX`, as the
    product's own groups are), configured from `settings`; `overrides` are faust settings
    that win over the derived ones."""
    if not app_id:
        raise StreamError("a faust app needs an id: its consumer group, one per team")
    return faust.App(settings.topic_prefix + app_id, **{**faust_options(settings), **overrides})
