"""The one place Kafka clients are made: producers, consumers and admin clients.

Each gets the security options registered for its bootstrap address
(instanced_stream.runtime.security) and the product's defaults; a caller passes only what is
particular to it. Clients are created unstarted: aiokafka binds a client to the event
loop that is running when it is made, so make them where they are started.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from instanced_stream.runtime.security import options_for

__all__ = ["admin", "consumer", "producer"]

# acks=all and idempotence: a publish counts only once every in-sync replica has it, and
# a send retried after a lost acknowledgement is not written twice.
_PRODUCER: dict[str, Any] = {"acks": "all", "enable_idempotence": True}
# Offsets are committed by the processor or not at all, never on a timer; and every
# consumer of the product reads committed records only (DESIGN.md section 8): an aborted
# transaction's records are never decided, counted or shown.
_CONSUMER: dict[str, Any] = {"enable_auto_commit": False, "isolation_level": "read_committed"}


def producer(bootstrap: str, **options: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, **{**options_for(bootstrap), **_PRODUCER, **options}
    )


def consumer(bootstrap: str, *topics: str, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics, bootstrap_servers=bootstrap, **{**options_for(bootstrap), **_CONSUMER, **options}
    )


def admin(bootstrap: str, **options: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, **{**options_for(bootstrap), **options})
