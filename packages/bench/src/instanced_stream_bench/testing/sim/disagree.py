"""The simulator's batch effect: a set share of items decided otherwise in a batch than
alone (`Faults.disagree_rate`), as a real model's decisions drift with the window. Which
items is fixed by their text, so a test knows the agreement to expect."""

from __future__ import annotations

import hashlib
from typing import Any

from instanced_stream_bench.testing.sim.keyed_judge import KeyedJudge
from instanced_stream_bench.testing.sim.request import SimRequest

__all__ = ["Drifting", "disagreeing", "flip"]


def disagreeing(item: dict[str, Any], rate: float, seed: int) -> bool:
    text = "".join(f"{k}={v}" for k, v in sorted(item.items()) if k != "_instance")
    digest = hashlib.blake2b(f"{seed}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


def flip(call: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The call with each deciding argument (an enum of two or more, a boolean) set to
    another value: what the same tool decides the other way."""
    tool = next((t for t in tools if t.get("name") == call.get("_tool")), None)
    props = (tool or {}).get("parameters", {}).get("properties", {})
    out = dict(call)
    for name, schema in props.items():
        if name not in out or not isinstance(schema, dict):
            continue
        options = schema.get("enum")
        if isinstance(options, list) and len(options) > 1 and out[name] in options:
            out[name] = options[(options.index(out[name]) + 1) % len(options)]
        elif schema.get("type") == "boolean" and isinstance(out[name], bool):
            out[name] = not out[name]
    return out


class Drifting(KeyedJudge):
    """The judge, whose decisions in a request of several items are, for the share
    `disagree_rate` picks, the other way (alone, never)."""

    def solve(self, req: SimRequest) -> dict[str, Any]:
        solution = super().solve(req)
        rate = self.config.faults.disagree_rate
        if rate and len(req.items) > 1:
            picked = {i["_instance"] for i in req.items if disagreeing(i, rate, self.config.seed)}
            solution["calls"] = [
                flip(c, req.tools) if c.get("_instance") in picked else c for c in solution["calls"]
            ]
        return solution
