"""Activities of the moderation example: run them with
`stream activities examples/moderation/activities.py`."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from typing import Any

import orjson
from instanced_stream.activities.worker import Activities
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import Tool

activities = Activities()
decisions: Counter[str] = Counter()
log = logging.getLogger("moderation")


@activities.activity("moderateComment")
async def moderate_comment(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    """Records each decision: counted here, and appended to STREAM_DECISIONS_FILE if set."""
    decision = call.arguments["decision"]
    decisions[decision] += 1
    log.info("%s %s: %s", decision, call.instance, call.arguments.get("reason", ""))
    path = os.environ.get("STREAM_DECISIONS_FILE")
    if path:
        line = orjson.dumps({"instance": call.instance, **call.arguments}) + b"\n"
        await asyncio.to_thread(_append, path, line)


def _append(path: str, line: bytes) -> None:
    with open(path, "ab") as out:
        out.write(line)


@activities.activity("notifyAuthor")
async def notify_author(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    """Fire-and-forget: a real deployment would send an e-mail here."""
    log.info("notify author of %s: %s", call.instance, call.arguments["message"])
