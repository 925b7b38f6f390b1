"""Processors SIGKILLed and restarted while items flow keep deciding them: progress is
asserted from what happened while they ran (docs/performance.md), before any stop's drain
could finish what a stuck group left; then nothing lost and nothing decided twice. The
restart storm of `stream bench --churn --restarts N`, small, with static members (the
chart's default: each restarted member rejoins under its name)."""

from __future__ import annotations

import pytest
from instanced_stream_bench.harness.storm import StormPlan, run_storm

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(720)]


async def test_members_killed_and_restarted_keep_every_partition_deciding(bootstrap: str) -> None:
    plan = StormPlan(
        partitions=6,
        states=300,
        processors=3,
        # Aimed in a commit; at random; a pair whose second dies joining; aimed again, the
        # restarted member armed to kill itself inside a commit; ...
        restarts=6,
        rate=4.0,
        lead_s=8.0,
        # Past the session timeout: each kill is noticed and rebalanced before the next.
        session_timeout_s=8.0,
        gap_s=(11.0, 15.0),
        aim_s=6.0,
        quiet_s=10.0,
        bound_s=60.0,
        latency_ms=100.0,
        # Room for the settling after the last ticket (bound_s + 5) on a loaded machine:
        # the run cuts its settling short to keep 150 s of its budget for the stop and
        # the audit, and a short budget made `settled_before_stop` fail once in 7 runs.
        budget_s=560.0,
        seed=44,
    )
    report = await run_storm(bootstrap, plan, say=lambda _: None)
    storm = report["storm"]
    # The storm happened as asked: six kills (a seventh if the armed member's own came
    # late), one while the restarted member joined (its own `joined` fault point).
    assert report["membership"] == "static"
    assert report["restarts"] >= 6, storm["kills"]
    assert report["kills_by_phase"].get("joining", 0) >= 1, storm["kills"]
    assert storm["all_open_at_start"] and storm["items"] >= 100
    assert storm["owner_polls"] >= 100  # the group's partitions were watched throughout
    # Progress, measured while the processors ran (every figure stops at the stop).
    assert report["decided_late"] == 0, storm["late_examples"]
    assert report["max_unowned_s"] <= 30, storm["unowned_spans"]
    assert report["max_join_s"] <= 30, storm["joins"]
    assert report["rebalances_per_min"] <= 30, storm["generations"]
    assert report["crashes"] == 0, storm["crashes"]
    # Every workflow ended too (three turns, each awaiting activities) before the stop.
    assert storm["settled_before_stop"], storm["unended_examples"]
    # Safety, after the quiet period and the stop.
    assert report["missing"] == 0
    assert report["duplicate_outcomes"] == 0
    # The kills' redos may take answers that came back before a kill from the journal;
    # how many depends on where the kills land (a storm has re-asked a single item), so
    # the figure is printed, not held above 0: test_answer_journal proves the reuse with
    # a kill aimed at it. Paid twice is reported, not held at 0: a member
    # that lost a partition may still journal a batch in flight after the new owner
    # read the journal (docs/performance.md, the answer journal).
    figures = {k: report[k] for k in ("asks_saved", "answers_paid_twice", "items_asked_again")}
    print(f"storm answers: {figures}")
    assert report["asks_saved"] >= 0, figures
    assert 0 <= report["answers_paid_twice"] <= report["asks_saved"] + storm["items"], figures
    assert report["audit"]["inputs"] == storm["items"]
