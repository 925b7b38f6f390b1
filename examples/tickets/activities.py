"""Activities of the tickets example: `stream activities examples/tickets/activities.py`.

lookupCustomer and assessUrgency are awaited (their results go into the instance's
state); assessUrgency picks a branch of its output path; routeTicket is fire-and-forget,
and so is pageOnCall, which reads only the urgent branch: the processor publishes it
once assessUrgency wrote †state.urgent, and never for a routine ticket.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from instanced_stream.activities.worker import Activities, Branch, paths_of
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import Tool

activities = Activities()
routed: Counter[str] = Counter()
paged: list[str] = []
log = logging.getLogger("tickets")

_VIP = {"acme", "globex", "initech"}
_URGENT = re.compile(r"down|outage|cannot log in|data loss|urgent|asap", re.IGNORECASE)


def _ticket(context: list[dict[str, Any]]) -> dict[str, Any]:
    """The ticket itself: the call imported its own input through `_scopes`."""
    return next((m for m in context if m.get("type", "input") == "input"), {})


@activities.activity("lookupCustomer")
async def lookup_customer(call: Call, tool: Tool, context: list[dict[str, Any]]) -> Any:
    customer = str(_ticket(context).get("customer", "unknown")).lower()
    return {
        "name": customer,
        "plan": "enterprise" if customer in _VIP else "free",
        "vip": customer in _VIP,
    }


@activities.activity("assessUrgency")
async def assess_urgency(call: Call, tool: Tool, context: list[dict[str, Any]]) -> Branch:
    ticket = _ticket(context)
    text = f"{ticket.get('subject', '')} {ticket.get('body', '')}"
    urgent, routine = ([*paths_of(call), "†state.urgent", "†state.routine"])[:2]
    if _URGENT.search(text):
        return Branch(urgent, {"why": "service impact"})
    return Branch(routine, {"why": "no service impact"})


@activities.activity("routeTicket")
async def route_ticket(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    routed[call.arguments["queue"]] += 1
    log.info("ticket %s -> %s", call.instance, call.arguments["queue"])


@activities.activity("pageOnCall")
async def page_on_call(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
    # Its context is what its `_scopes` import: the urgent branch, written before it ran.
    paged.append(call.instance)
    log.info("ticket %s: on-call paged (%s)", call.instance, context)
