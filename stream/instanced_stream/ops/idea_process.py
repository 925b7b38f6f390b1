"""`stream process-idea`: the plans' Idea Process as it stands, read from its compacted
topic (the partitions' shares summed: core/idea_process.py), or where one instance stands
(`--instance ID`: its state's latest changelog record, its plan step by step)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from instanced_stream.core.idea_process import BUCKETS, IdeaProcessRecord, current
from instanced_stream.core.plan_graph import view
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.topics import read_topic, state_changelog
from instanced_stream.settings import Settings

__all__ = ["instance_standing", "read_ideas", "render"]


async def read_ideas(bootstrap: str, settings: Settings) -> list[IdeaProcessRecord]:
    """Every plan edition's Idea Process now, the newest first (an unreadable record, of
    another version, is left out)."""
    latest: dict[bytes, bytes | None] = {}
    async for rec in read_topic(bootstrap, settings.topics.ideas):
        if rec.key is not None:
            latest[rec.key] = rec.value
    shares = []
    for value in latest.values():
        if not value:
            continue
        try:
            shares.append(IdeaProcessRecord.model_validate_json(value))
        except ValidationError:
            continue
    return current(shares)


async def instance_standing(
    bootstrap: str, settings: Settings, instance: str
) -> dict[str, Any] | None:
    """Where one instance stands: its workflow's status, turn and plan (None: no state).
    Read from the state changelog, where the per-instance rows are (the Idea Process
    topic and the live page hold counts only)."""
    found: bytes | None = None
    key = instance.encode()
    async for rec in read_topic(bootstrap, state_changelog(settings)):
        if rec.key == key:
            found = rec.value
    if not found:
        return None
    st = InstanceState.model_validate_json(found)
    return {
        "instance": st.instance,
        "partition": st.partition,
        "status": st.status,
        "turn": st.turn,
        "ended": st.ended.model_dump() if st.ended else None,
        "plan": view(st.plan),
    }


def render(idea: IdeaProcessRecord) -> str:
    """The Idea Process as text: the plan, its instances, each step with what it reads and
    its counts."""
    lines = [
        f"plan {idea.edition} ({idea.mode}): {idea.goal or 'no goal'}",
        f"instances: {idea.instances} "
        + " ".join(f"{k}={v}" for k, v in sorted(idea.by_status.items())),
    ]
    for node in idea.nodes:
        counts = " ".join(f"{b}={getattr(node.counts, b)}" for b in BUCKETS)
        reads = f" (reads {', '.join(node.reads)})" if node.reads else ""
        lines.append(f"  {node.id} [{node.kind}]{reads}: {counts}")
    return "\n".join(lines)
