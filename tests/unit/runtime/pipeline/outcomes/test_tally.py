"""The one counter of what records mean (runtime/pipeline/outcomes/tally.py): events into
the metrics, decisions onto the live page."""

from __future__ import annotations

from collections import Counter

from instanced_stream.core.spec import load_spec
from instanced_stream.runtime.assembly import metrics_for
from instanced_stream.runtime.pipeline.outcomes.records import Planned
from instanced_stream.runtime.pipeline.outcomes.tally import Tally
from instanced_stream.settings import DEFAULT_SPEC


def test_a_planned_batch_s_events_and_decisions_are_counted_once() -> None:
    metrics = metrics_for(load_spec(DEFAULT_SPEC))
    tally = Tally(metrics)
    decision = {"instance": "p-1", "decision": "approve"}
    tally(Planned(events=Counter({"forwarded": 2}), decisions=[decision]))
    tally(Planned(events=Counter({"forwarded": 1})))
    assert metrics.counts()["forwarded"] == 3
    assert list(metrics.decisions)[-1] == decision
