"""The live agreement figures: what the shadow sample found, per window bucket, and the
window the controller keeps. Counts, so dashboards compute Wilson bounds themselves;
the live page and `stream demo` get them computed."""

from __future__ import annotations

from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from instanced_stream.core.controller import Change
from instanced_stream.core.quality import wilson

__all__ = ["AgreementMetrics", "quality_line"]

_KINDS = ("prompt", "completion", "cached")


class AgreementMetrics:
    def __init__(self, registry: CollectorRegistry, window: int, z: float = 1.96) -> None:
        r = registry
        self.compared = Counter(
            "instanced_stream_agreement_compared",
            "Shadow comparisons (a batched decision against the same item asked alone), by "
            "the batched answer's window bucket",
            ["window_bucket"],
            registry=r,
        )
        self.agreed = Counter(
            "instanced_stream_agreement_agreed",
            "Shadow comparisons whose decisions agreed, by window bucket",
            ["window_bucket"],
            registry=r,
        )
        self.shadow = Counter(
            "instanced_stream_shadow",
            "Shadow sample: asked (requests alone, never published), unanswered, dropped "
            "(the shadow queue was full)",
            ["outcome"],
            registry=r,
        )
        self.shadow_cost = Counter(
            "instanced_stream_shadow_cost_usd",
            "What the shadow requests cost (in stream_llm_cost too)",
            registry=r,
        )
        self.escalations = Counter(
            "instanced_stream_escalations",
            "Doubtful items given a second opinion before publishing (quality.escalate_on)",
            registry=r,
        )
        self.escalation_cost = Counter(
            "instanced_stream_escalation_cost_usd", "What the second opinions cost", registry=r
        )
        self.window_now = Gauge(
            "instanced_stream_window_now", "Instances per request the window takes now", registry=r
        )
        self.window_now.set(window)
        self.window = window
        self.z = z
        self.counts: dict[str, list[int]] = {}  # bucket -> [agreed, compared]
        self.asked = 0
        self.second_opinions = 0
        self.tokens = [0, 0, 0]  # prompt, completion, cached of shadow requests
        self.cost = 0.0
        self.changes: deque[dict[str, Any]] = deque(maxlen=20)

    def compared_at(self, bucket: str, agreed: bool) -> None:
        self.compared.labels(bucket).inc()
        self.agreed.labels(bucket).inc(int(agreed))
        row = self.counts.setdefault(bucket, [0, 0])
        row[0] += int(agreed)
        row[1] += 1

    def asked_alone(self, prompt: int, completion: int, cached: int, cost: float) -> None:
        self.shadow.labels("asked").inc()
        self.asked += 1
        for k, n in enumerate((prompt, completion, cached)):
            self.tokens[k] += n
        self.cost += cost
        self.shadow_cost.inc(cost)

    def escalated(self, cost: float) -> None:
        self.escalations.inc()
        self.escalation_cost.inc(cost)
        self.second_opinions += 1

    def changed(self, change: Change) -> None:
        self.window = change.new
        self.window_now.set(change.new)
        self.changes.append(change.as_dict())

    def live(self) -> dict[str, Any]:
        """The `quality` figures of the live page and the demo."""
        agreed = sum(a for a, _ in self.counts.values())
        compared = sum(n for _, n in self.counts.values())
        buckets = {}
        for bucket, (ok, n) in sorted(self.counts.items(), key=lambda kv: int(kv[0].split("-")[0])):
            lower, upper = wilson(ok, n, self.z)
            buckets[bucket] = {
                "agreed": ok,
                "compared": n,
                "agreement": round(ok / n, 4),
                "lower": round(lower, 4),
                "upper": round(upper, 4),
            }
        return {
            "shadowed": self.asked,
            "compared": compared,
            "agreement": round(agreed / compared, 4) if compared else None,
            "window_now": self.window,
            "buckets": buckets,
            "shadow_tokens": dict(
                zip(("prompt", "completion", "cached"), self.tokens, strict=True)
            ),
            "shadow_cost_usd": round(self.cost, 8),
            "escalations": self.second_opinions,
            "changes": list(self.changes),
        }


def quality_line(quality: dict[str, Any]) -> str:
    """`stream audit`'s line about a processor's shadow sample (its `live()["quality"]`)."""
    buckets = quality.get("buckets") or {}
    per = ", ".join(
        f"{b}: {r['agreed']}/{r['compared']} [{r['lower']:.2f}, {r['upper']:.2f}]"
        for b, r in buckets.items()
    )
    agreement = quality.get("agreement")
    shown = "–" if agreement is None else f"{100 * agreement:.1f}%"
    return (
        f"quality: {quality.get('shadowed', 0)} items shadowed, agreement {shown}"
        f"{f' by window ({per})' if per else ''}, window now {quality.get('window_now')}"
    )
