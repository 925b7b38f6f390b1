"""A faust-streaming app that answers the tickets example's calls through
`instanced_stream.activities.faust_agent`, as a team's faust service would:

    python faust_worker.py BOOTSTRAP PREFIX GROUP DATADIR

Each handler run prints `handled <call_id>` first, so the test counts runs per call.
SIGTERM stops it as faust's worker stops (the agent ends, offsets commit, the group is left).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import faust
from instanced_stream.activities.faust_agent import serve_activities
from instanced_stream.activities.worker import Activities, load_activities
from instanced_stream.core.messages import ActivityRecord
from instanced_stream.core.spec import Tool, load_spec
from instanced_stream.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tickets"


class Counted(Activities):
    async def handle(self, record: ActivityRecord, tool: Tool) -> Any:
        print(f"handled {record.call_id}", flush=True)
        return await super().handle(record, tool)


def main() -> None:
    bootstrap, prefix, group, datadir = sys.argv[1:5]
    activities = Counted()
    activities.handlers = load_activities(str(EXAMPLE / "activities.py")).handlers
    app = faust.App(
        group,
        broker=f"kafka://{bootstrap}",
        processing_guarantee="exactly_once",
        consumer_auto_offset_reset="earliest",
        datadir=datadir,
        web_enabled=False,
        # no leader topic to create: this app has no tables to assign
        topic_disable_leader=True,
        broker_commit_interval=0.5,
    )
    settings = Settings(topic_prefix=prefix, bootstrap_servers=bootstrap)
    serve_activities(app, activities, settings, load_spec(EXAMPLE / "agent.yaml"))
    sys.argv = [sys.argv[0], "worker", "--loglevel", "info", "--without-web"]
    code = 1
    try:
        app.main()
    except SystemExit as done:
        # sys.exit() and sys.exit(None) are a success; a message or other object is not.
        code = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
    finally:
        # faust-streaming 0.15.3 under exactly_once sometimes fails its last commit on stop
        # (IllegalOperation "Not in the middle of a transaction"); its consumer thread is
        # then never stopped and keeps the process alive after the loop closed (docs/faust.md).
        sys.stdout.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
