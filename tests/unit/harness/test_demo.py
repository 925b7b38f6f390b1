"""`wait_accounted` fails loudly on a timeout: four integration tests ignored the report it
returned, so they could not fail when items went missing."""

from __future__ import annotations

from typing import Any

import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.ops.audit import AuditReport
from instanced_stream.settings import DEFAULT_SPEC, Settings
from instanced_stream_bench.harness import demo
from instanced_stream_bench.harness.demo import NotAccounted, report_when_accounted, wait_accounted


def _report(missing: int) -> AuditReport:
    return AuditReport.model_validate(
        {
            "inputs": 3,
            "accounted": 3 - missing,
            "missing": [("items", 0, i) for i in range(missing)],
            "duplicate_calls": 0,
            "unexpected": 0,
            "calls_by_tool": {},
            "fire_and_forget": 0,
            "reviewed": 0,
            "no_action": 0,
            "dead_letters": {},
            "item_dead_letters": 0,
        }
    )


async def test_a_timeout_raises_with_the_last_report(monkeypatch: pytest.MonkeyPatch) -> None:
    async def one_missing(*args: Any, **kwargs: Any) -> AuditReport:
        return _report(1)

    monkeypatch.setattr(demo, "audit", one_missing)
    settings, spec = Settings(bootstrap_servers="unused:9092"), load_spec(DEFAULT_SPEC)
    with pytest.raises(NotAccounted, match="1 without an outcome") as err:
        await wait_accounted("unused:9092", settings, spec, 3, 0.0)
    assert err.value.report.unaccounted == 1
    # The demo's summary shows the report instead of stopping.
    shown = await report_when_accounted("unused:9092", settings, spec, 3, 0.0)
    assert shown.unaccounted == 1


async def test_everything_accounted_returns_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    async def complete(*args: Any, **kwargs: Any) -> AuditReport:
        return _report(0)

    monkeypatch.setattr(demo, "audit", complete)
    settings, spec = Settings(bootstrap_servers="unused:9092"), load_spec(DEFAULT_SPEC)
    assert (await wait_accounted("unused:9092", settings, spec, 3, 0.0)).unaccounted == 0
