"""The simulator's routing rules: a global instruction that names one instance (the
Instancing seed's manager example: only the named instance acts; the others get NoAction,
or no call at all where the prompt says silence is an answer), and a council's choice
among argument-less tools (the Advisor seed's deploy / rollback / delay)."""

from __future__ import annotations

import re
from typing import Any

from instanced_stream_bench.testing.sim.request import SimRequest

__all__ = ["choose_tool", "route_instruction"]


def route_instruction(req: SimRequest, views: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A global instruction about one named instance: only that instance acts."""
    text = req.instruction
    quoted = re.findall(r"'([^']+)'|\"([^\"]+)\"", text)
    task = next((a or b for a, b in quoted), text)
    status = "High Priority" if re.search(r"high.priority|urgent", text, re.I) else "Normal"
    tools = [t for t in req.tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
    calls: list[dict[str, Any]] = []
    # Silence is an answer where the prompt says so (spec `silence: no_action`).
    silent = "silence is\nrecorded as no action" in req.system
    for token, view in views.items():
        name = str(view["state"].get("name") or view["input"].get("name") or "")
        # A shown id (spec instance_ids: shown) names the instance too: employee_B is
        # "employee B" in an instruction.
        shown = str(view["state"].get("_id") or view["input"].get("_id") or "")
        said = re.escape(shown).replace("_", "[ _]") if shown else ""
        if (name and re.search(rf"\b{re.escape(name)}\b", text)) or (
            said and re.search(rf"\b{said}\b", text, re.IGNORECASE)
        ):
            name = name or shown
            tool = tools[0]
            strings = [
                k
                for k, v in tool.get("parameters", {}).get("properties", {}).items()
                if v.get("type") == "string"
            ]
            args = dict(zip(strings, [task, status], strict=False))
            if req.free_form and shown and not req.call_fields:
                # No schema holds the keys: the seed's own answer, verbatim (the shown id
                # for `_instance`, the output path spelled "output").
                seed = {"_tool": tool["name"], "_instance": shown, **args}
                calls.append(seed | ({"output": tool["paths"][0]} if tool.get("paths") else {}))
                continue
            call = {
                "_tool": tool["name"],
                "_instance": token,
                "_reasoningForCall": f"the instruction names {name}",
                **args,
            }
            if tool.get("paths"):
                call["_outputPath"] = tool["paths"][0]
            calls.append(call)
        elif not silent:
            calls.append(
                {
                    "_tool": "NoAction",
                    "_instance": token,
                    "_reasoningForCall": "the instruction is about someone else",
                    "reason": "not addressed by the instruction",
                }
            )
    return calls


_RISKY = re.compile(r"(?:no|lacks?) integration tests|rolled back|untested", re.IGNORECASE)


def choose_tool(tools: list[dict[str, Any]], text: str) -> tuple[str, dict[str, int]] | None:
    """A council choosing among three or more argument-less tools (the Advisor seed's
    deploy / rollback / delay): independent confidence scores per tool, as the seed
    writes them (10, 5, 95 for a risky change), and the call follows the top one."""
    real = [t for t in tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
    if len(real) < 3 or any(t.get("parameters", {}).get("properties") for t in real):
        return None
    names = [t["name"] for t in real]
    risky = bool(_RISKY.search(text))
    scores = [10, 5, 95] if risky else [90, 5, 10]
    votes = dict(zip(names, scores + [0] * (len(names) - 3), strict=True))
    return max(votes, key=lambda n: votes[n]), votes
