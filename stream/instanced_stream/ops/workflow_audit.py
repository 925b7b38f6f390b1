"""The audit of stateful workflows: every started workflow is done, dead-lettered, or
pending with a stated reason and age. Read from the state table's changelog (the latest
record of each instance), so it needs nothing from a running processor."""

from __future__ import annotations

import time
from collections import Counter

from pydantic import BaseModel, Field, ValidationError

from instanced_stream.core.plan_graph import RAN_ON_MISSING_INPUT, SKIPPED_BRANCH
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.topics import read_topic, state_changelog
from instanced_stream.settings import Settings

__all__ = ["PendingWorkflow", "WorkflowReport", "audit_workflows"]


class PendingWorkflow(BaseModel):
    instance: str
    status: str
    reason: str
    age_s: float = Field(description="Seconds since the workflow's state last changed")


class WorkflowReport(BaseModel):
    started: int
    done: int = Field(description="Ended by the model, a finish advisor, a limit or a person")
    dead_lettered: int = Field(description="Ended because a turn ended in a dead letter")
    forgotten: int = Field(description="Ended longer ago than the state retention")
    pending: list[PendingWorkflow]
    ended_by: dict[str, int]
    plan_counts: dict[str, int] = Field(
        default_factory=dict,
        description="What the workflows' plans counted as they ran, summed: steps skipped "
        "on a branch not taken, steps started without an input their producer writes",
    )

    def summary(self) -> dict[str, object]:
        return {
            "started": self.started,
            "done": self.done,
            "dead_lettered": self.dead_lettered,
            "forgotten": self.forgotten,
            "pending": len(self.pending),
            "oldest_pending_s": max((p.age_s for p in self.pending), default=0.0),
            "pending_by_status": dict(Counter(p.status for p in self.pending)),
            "ended_by": self.ended_by,
            # Counted by the processor in each instance's state (core/plan_graph.py).
            SKIPPED_BRANCH: self.plan_counts.get(SKIPPED_BRANCH, 0),
            RAN_ON_MISSING_INPUT: self.plan_counts.get(RAN_ON_MISSING_INPUT, 0),
        }


def _why(st: InstanceState) -> str:
    if st.status == "pending":
        tools = sorted({p.tool for p in st.pending.values()})
        due = min((p.deadline for p in st.pending.values()), default=time.time())
        return (
            f"waiting for {len(st.pending)} results ({', '.join(tools)}); the first is "
            f"due in {max(0.0, due - time.time()):.0f}s"
        )
    if st.status == "awaiting_approval":
        return f"turn {st.turn} proposes {len(st.proposal)} calls; waiting for `stream approve`"
    if st.status == "ready":
        return f"turn {st.turn + 1} is queued for the model"
    return "its first turn is with the model"


async def audit_workflows(bootstrap: str, settings: Settings) -> WorkflowReport:
    latest: dict[bytes, tuple[bytes | None, int]] = {}
    async for rec in read_topic(bootstrap, state_changelog(settings)):
        if rec.key is not None:
            latest[rec.key] = (rec.value, rec.timestamp)
    now_ms = time.time() * 1000
    done = dead = forgotten = 0
    ended_by: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    pending: list[PendingWorkflow] = []
    for key, (value, ts) in latest.items():
        if value is None:
            forgotten += 1  # deleted after the retention: it had ended
            continue
        try:
            st = InstanceState.model_validate_json(value)
        except ValidationError:
            pending.append(
                PendingWorkflow(
                    instance=key.decode(), status="?", reason="unreadable state", age_s=0
                )
            )
            continue
        counts.update(st.counts)
        if st.status == "done":
            how = st.ended.status if st.ended else "done"
            ended_by[how] += 1
            if how == "dead_lettered":
                dead += 1
            else:
                done += 1
            continue
        pending.append(
            PendingWorkflow(
                instance=st.instance,
                status=st.status,
                reason=_why(st),
                age_s=round(max(0.0, now_ms - ts) / 1000, 1),
            )
        )
    return WorkflowReport(
        started=len(latest),
        done=done,
        dead_lettered=dead,
        forgotten=forgotten,
        pending=sorted(pending, key=lambda p: -p.age_s),
        ended_by=dict(ended_by),
        plan_counts=dict(counts),
    )
