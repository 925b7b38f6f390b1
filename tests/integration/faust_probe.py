"""A plain faust-streaming app, without the adapter, to measure what faust itself does
with a partition that holds an aborted transaction (tests/integration/test_faust_worker.py):

    python faust_probe.py BOOTSTRAP TOPIC GROUP DATADIR at_least_once|exactly_once

Its agent acks as faust's own `async for` does, prints `seen <call_id>` for every value,
and raises on the call_id `boom`, the way a failing handler would.
"""

from __future__ import annotations

import sys

import faust
import orjson
from faust.types import StreamT


def main() -> None:
    bootstrap, topic, group, datadir, guarantee = sys.argv[1:6]
    app = faust.App(
        group,
        broker=f"kafka://{bootstrap}",
        processing_guarantee=guarantee,
        consumer_auto_offset_reset="earliest",
        datadir=datadir,
        web_enabled=False,
        topic_disable_leader=True,
        broker_commit_interval=0.5,
    )

    async def probe(stream: StreamT[bytes]) -> None:
        async for value in stream:
            call_id = orjson.loads(value)["call_id"]
            print(f"seen {call_id}", flush=True)
            if call_id == "boom":
                raise RuntimeError("the handler failed")

    app.agent(app.topic(topic, value_serializer="raw"), name="probe")(probe)
    sys.argv = [sys.argv[0], "worker", "--loglevel", "info", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
