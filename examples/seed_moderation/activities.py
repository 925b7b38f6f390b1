"""Activities of the seeds' moderation example: the decision is all there is to record.
Run them with `stream activities examples/seed_moderation/activities.py`."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from instanced_stream.activities.worker import Activities
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import Tool

activities = Activities()
decisions: Counter[str] = Counter()
log = logging.getLogger("seed-moderation")


@activities.activity("moderateComment")
async def moderate_comment(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    decisions[call.arguments["decision"]] += 1
    log.info("%s %s", call.arguments["decision"], call.instance)
