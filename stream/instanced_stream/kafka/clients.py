"""The one place Kafka clients are made: producers, consumers and admin clients.

Each gets the security options registered for its bootstrap address
(instanced_stream.kafka.security), the producer options registered for it (compression),
a client.id naming this process (broker logs, quotas and metrics tell processes apart by
it), and the product's defaults; a caller passes only what is particular to it. Clients
are created unstarted: aiokafka binds a client to the event loop that is running when it
is made, so make them where they are started.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from instanced_stream.kafka.security import options_for

__all__ = ["admin", "client_id", "consumer", "producer", "register_producer"]

_PRODUCERS: dict[str, dict[str, Any]] = {}

# acks=all and idempotence: a publish counts only once every in-sync replica has it, and
# a send retried after a lost acknowledgement is not written twice.
_PRODUCER: dict[str, Any] = {"acks": "all", "enable_idempotence": True}
# Offsets are committed by the processor or not at all, never on a timer; and every
# consumer of the product reads committed records only (docs/architecture.md, exactly
# once): an aborted transaction's records are never decided, counted or shown.
_CONSUMER: dict[str, Any] = {"enable_auto_commit": False, "isolation_level": "read_committed"}


def client_id(role: str) -> str:
    """`instanced-stream-<role>-<host>-<pid>`: one per process and role. In a pod the host
    name is the pod's name."""
    return f"instanced-stream-{role}-{socket.gethostname()}-{os.getpid()}"


def register_producer(bootstrap: str, compression: str) -> None:
    """Every producer for `bootstrap` compresses with `compression` from now on."""
    _PRODUCERS[bootstrap] = {} if compression == "none" else {"compression_type": compression}


def producer(bootstrap: str, **options: Any) -> AIOKafkaProducer:
    defaults = {"client_id": client_id("producer"), **_PRODUCERS.get(bootstrap, {})}
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **{**defaults, **options_for(bootstrap), **_PRODUCER, **options},
    )


def consumer(bootstrap: str, *topics: str, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        **{"client_id": client_id("consumer"), **options_for(bootstrap), **_CONSUMER, **options},
    )


def admin(bootstrap: str, **options: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        **{"client_id": client_id("admin"), **options_for(bootstrap), **options},
    )
