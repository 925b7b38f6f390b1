"""The simulator's keyed answers (`model.answer: keyed`): the judge's calls grouped by
instance number. What the judge skipped stays skipped (its injected faults model a
model that ignores the schema), so the validator's re-asks are still exercised."""

from __future__ import annotations

from typing import Any

import orjson
from instanced_stream.core import keyed

from instanced_stream_bench.testing.sim.judge import Judge
from instanced_stream_bench.testing.sim.request import SimRequest

__all__ = ["KeyedJudge"]


class KeyedJudge(Judge):
    def answer(self, req: SimRequest) -> str:
        text = super().answer(req)
        if keyed.MARK not in req.system:
            return text
        try:
            solution = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text  # a poisoned answer stays spoilt
        calls = solution.get("calls")
        if not isinstance(calls, list):
            return text
        grouped: dict[str, list[dict[str, Any]]] = {}
        for call in calls:
            body = {k: v for k, v in call.items() if k != "_instance"}
            grouped.setdefault(str(call.get("_instance")), []).append(body)
        return orjson.dumps({**solution, "calls": grouped}).decode()
