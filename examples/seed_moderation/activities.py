"""Activities of the seeds' moderation example: the decision is all there is to record.
Run them with `stream activities examples/seed_moderation/activities.py`."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from stream.activities.worker import Activities
from stream.core.messages import Call
from stream.core.spec import Tool

activities = Activities()
decisions: Counter[str] = Counter()
log = logging.getLogger("seed-moderation")


@activities.activity("moderateComment")
async def moderate_comment(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    decisions[call.arguments["decision"]] += 1
    log.info("%s %s", call.arguments["decision"], call.instance)
