"""Prometheus metrics of a processor, and the live figures its page shows.

One registry per process, passed down (not the library's global one), so tests can build
as many pipelines as they like. Names are the ones the Grafana dashboard in deploy/ uses.
"""

from __future__ import annotations

import platform
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from instanced_stream.core.spec import ModelEndpoint
from instanced_stream.observe.agreement import AgreementMetrics
from instanced_stream.observe.partitions import PartitionMetrics

__all__ = ["Metrics", "SpendGauges", "WorkerMetrics"]

# Every series of the product starts with this: distinct from other services' metrics in a
# shared Prometheus (a bare `stream_` would collide with any other stream processor's).
_P = "instanced_stream_"
# Kinds that add up: sum by (kind) is every token billed, never a cached token counted
# twice (once as prompt, once as cached).
_TOKENS = (
    "Tokens by kind: input (prompt tokens not served from the provider's cache),"
    " cached_input, output; the kinds add up to the total"
)
_REASONING = "Of the output tokens, those a reasoning model spent thinking"
# A counter by status (rate() and increase() work on it), and a 0/1 gauge for "refusing
# now": the status code is a label, never a gauge's value.
_REFUSED = (
    "Refusals of the endpoint that pause consumption: the key or model (401/403/404) or"
    " the request's shape (400 naming a parameter or the schema), by status"
)
_SIZES = (1, 2, 5, 10, 25, 50, 100, 200, 500)
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


def _build() -> dict[str, str]:
    """What `instanced_stream_build_info` says: this product's version and the versions
    that decide its behaviour on the wire."""
    return {
        "version": version("instanced-stream") if _installed("instanced-stream") else "dev",
        "python": platform.python_version(),
        "aiokafka": version("aiokafka"),
        "openai": version("openai"),
    }


def _installed(name: str) -> bool:
    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def _usage(kinds: Mapping[str, int], reasoning: int) -> dict[str, int]:
    """The token kinds in the providers' usage terms (prompt includes cached)."""
    cached = kinds.get("cached_input", 0)
    return {
        "prompt_tokens": kinds.get("input", 0) + cached,
        "cached_tokens": cached,
        "completion_tokens": kinds.get("output", 0),
        "reasoning_tokens": reasoning,
    }


_COST = "Estimated LLM cost, cached prompt tokens priced"
_REQUESTS = "Model requests (re-asks and splits included)"
_CONTEXT = "Context messages refused at the latest change"


def _registry() -> CollectorRegistry:
    """Our own registry, plus the process_* (CPU, memory, open files) and python_info
    series every Prometheus target is expected to export."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def _waiting(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    return (
        Gauge(f"{_P}batch_api_in_flight", "Batch API batches submitted, not finished", registry=r),
        Gauge(
            f"{_P}batch_api_oldest_age_seconds",
            "Age of the oldest Batch API batch submitted and not finished",
            registry=r,
        ),
        Gauge(
            f"{_P}oldest_uncommitted_age_seconds",
            "How long the oldest input record consumed here has waited for its outcome",
            registry=r,
        ),
    )


class Metrics:
    def __init__(self, prices: ModelEndpoint | None = None, window: int = 0) -> None:
        self.registry = r = _registry()
        self.agreement = AgreementMetrics(r, window)
        self.items_in = Counter(f"{_P}items_in", "Input records taken", registry=r)
        self.calls_out = Counter(f"{_P}calls_out", "Calls published", ["tool"], registry=r)
        self.dead_letters = Counter(
            f"{_P}dead_letters", "Dead-letter records by code", ["code"], registry=r
        )
        self.batch_size = Histogram(
            f"{_P}batch_size", "Instances per batch", buckets=_SIZES, registry=r
        )
        self.window_close = Counter(
            f"{_P}window_close", "Why windows closed", ["reason"], registry=r
        )
        self.llm_latency = Histogram(
            f"{_P}llm_latency_seconds",
            "LLM request latency",
            buckets=_SECONDS,
            registry=r,
        )
        self.in_flight = Gauge(f"{_P}llm_in_flight", "Batches in flight", registry=r)
        self.tokens = Counter(f"{_P}tokens", _TOKENS, ["kind"], registry=r)
        self.reasoning_tokens = Counter(f"{_P}reasoning_tokens", _REASONING, registry=r)
        self.cost_per_item = Gauge(
            f"{_P}cost_per_item_usd", "Estimated LLM cost per answered item", registry=r
        )
        # A counter, so rate(instanced_stream_llm_cost_usd_total[5m]) is dollars per second; cached
        # prompt tokens are priced as the provider bills them.
        self.cost_usd = Counter(f"{_P}llm_cost_usd", _COST, registry=r)
        self.retries = Counter(f"{_P}llm_retries", "Retried LLM requests", registry=r)
        self.circuit_open = Gauge(
            f"{_P}circuit_open", "1 while the endpoint keeps failing", registry=r
        )
        self.refused = Counter(f"{_P}llm_refused", _REFUSED, ["status"], registry=r)
        self.refusing = Gauge(
            f"{_P}llm_refusing",
            "1 while the endpoint refuses the key, model or request shape, else 0",
            registry=r,
        )
        self.rebalances = Counter(
            f"{_P}rebalances",
            "Partition assignments this process received (each rebalance of its group)",
            registry=r,
        )
        Info(f"{_P}build", "The running build", registry=r).info(_build())
        self.request_shape = Gauge(
            f"{_P}llm_request_shape",
            "1 for the request shape in use (probed at start, or the spec's model.request)",
            ["tokens_param", "temperature", "response_format"],
            registry=r,
        )
        self.in_flight_limit = Gauge(
            f"{_P}llm_in_flight_limit",
            "Batches allowed in flight now (adaptive: grows while healthy, shrinks on 429s)",
            registry=r,
        )
        self.partitions = PartitionMetrics(r)
        self.llm_requests = Counter(f"{_P}llm_requests", _REQUESTS, registry=r)
        self.refused_calls = Counter(
            f"{_P}refused_calls",
            "Calls of the model's answers refused, by code",
            ["code"],
            registry=r,
        )
        self.events = Counter(
            f"{_P}events",
            "What else became of instances and workflows, by kind (no_action, latent_calls,"
            " reviewed, proposals, done, turns, results, consults, advisor_opinions, ...)",
            ["kind"],
            registry=r,
        )
        self.context_refused = Gauge(f"{_P}context_refused", _CONTEXT, registry=r)
        # The batch tier (docs/batch.md): lag grows while a batch runs, by design. These
        # say why; KEDA scales on the online tier's lag only (docs/kubernetes.md).
        self.batch_api_in_flight, self.batch_api_oldest, self.oldest_uncommitted = _waiting(r)
        self.batch_live: dict[str, float] = {}
        self.spend = _spend(r)  # budget.*: the spend ceiling (runtime/pipeline/windows/spend.py)
        self.prices = prices or ModelEndpoint()
        self.answered = 0
        self.cost = 0.0
        self.decisions: deque[dict[str, Any]] = deque(maxlen=50)
        self.started = time.time()
        self.latencies: deque[float] = deque(maxlen=200)
        self.sizes: deque[int] = deque(maxlen=200)
        self.batches = 0
        self.flying = 0
        self.limit = 0.0
        self._circuit = self._refused = False

    def batch_started(self) -> None:
        self.flying += 1
        self.in_flight.set(self.flying)

    def batch_ended(self) -> None:
        self.flying -= 1
        self.in_flight.set(self.flying)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_tokens(
        self, prompt: int, completion: int, cached: int, answered: int, reasoning: int = 0
    ) -> None:
        """`reasoning`: hidden tokens of `completion`, priced as output, counted apart."""
        self.tokens.labels("input").inc(max(prompt - cached, 0))
        self.tokens.labels("cached_input").inc(cached)
        self.tokens.labels("output").inc(completion)
        self.reasoning_tokens.inc(reasoning)
        self.answered += answered
        batch = self.prices.tier == "batch"  # Batch API lines: at the batch price
        cost = self.prices.cost_usd(prompt, completion, cached, batch=batch)
        self.cost += cost
        self.cost_usd.inc(cost)
        if self.answered:
            self.cost_per_item.set(self.cost / self.answered)

    def observe_latency(self, seconds: float) -> None:
        self.llm_latency.observe(seconds)
        self.latencies.append(seconds)

    def on_retry(self) -> None:
        self.retries.inc()

    def on_limit(self, limit: float) -> None:
        self.limit = limit
        self.in_flight_limit.set(int(limit))

    def set_waiting(self, batch_ages: list[float] | None, oldest_open_s: float | None) -> None:
        """Batches in flight (their ages; None: the online tier) and the age of the
        oldest input record still without its committed outcome."""
        self.oldest_uncommitted.set(oldest_open_s or 0.0)
        live = {"oldest_uncommitted_s": round(oldest_open_s or 0.0, 1)}
        if batch_ages is not None:
            self.batch_api_in_flight.set(len(batch_ages))
            self.batch_api_oldest.set(max(batch_ages, default=0.0))
            live["batches_in_flight"] = len(batch_ages)
            live["batch_oldest_age_s"] = round(max(batch_ages, default=0.0), 1)
        self.batch_live = live

    def on_circuit(self, is_open: bool) -> None:
        self.circuit_open.set(1 if is_open else 0)
        self._circuit = is_open

    def on_shape(self, labels: dict[str, str]) -> None:
        self.request_shape.clear()
        self.request_shape.labels(**labels).set(1)

    def on_refused(self, status: int | None) -> None:
        if status:
            self.refused.labels(str(status)).inc()
        self.refusing.set(1 if status else 0)
        self._refused = bool(status)

    @property
    def endpoint_ok(self) -> bool:
        """False while the endpoint refuses the key or model, or its circuit is open."""
        return not (self._circuit or self._refused)

    def count(self, events: Mapping[str, int]) -> None:
        """Counts named events: `calls.<tool>`, `dead_letter.<code>`, `refused.<code>`,
        `llm_requests`; any other name is a kind of `instanced_stream_events`."""
        for name, n in events.items():
            family, _, label = name.partition(".")
            if not n:
                continue
            if family == "calls":
                self.calls_out.labels(label).inc(n)
            elif family == "dead_letter":
                self.dead_letters.labels(label).inc(n)
            elif family == "refused":
                self.refused_calls.labels(label).inc(n)
            elif name == "llm_requests":
                self.llm_requests.inc(n)
            else:
                self.events.labels(name).inc(n)

    def counts(self) -> dict[str, int]:
        """Every count so far, flat, in the names `count` takes (the periodic log line)."""

        def by(counter: Counter, prefix: str, suffix: str = "") -> dict[str, int]:
            return {
                f"{prefix}{next(iter(s.labels.values()), '')}{suffix}": int(s.value)
                for m in counter.collect()
                for s in m.samples
                if s.name.endswith("_total")
            }

        return {
            "items_in": sum(by(self.items_in, "").values()),
            "llm_requests": sum(by(self.llm_requests, "").values()),
            **_usage(by(self.tokens, ""), sum(by(self.reasoning_tokens, "").values())),
            **by(self.window_close, "window_close."),
            **by(self.calls_out, "calls."),
            **by(self.dead_letters, "dead_letter."),
            **by(self.refused_calls, "refused."),
            **by(self.events, ""),
            "context_refused": int(
                next(s.value for m in self.context_refused.collect() for s in m.samples)
            ),
        }

    def observe_batch(self, size: int, reason: str) -> None:
        self.batch_size.observe(size)
        self.window_close.labels(reason).inc()
        self.sizes.append(size)
        self.batches += 1

    def live(self) -> dict[str, Any]:
        """What the live page shows, from the same counters Prometheus scrapes."""

        def total(counter: Counter) -> float:
            return sum(
                s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")
            )

        lat = sorted(self.latencies)
        items = total(self.items_in)
        elapsed = max(time.time() - self.started, 1e-9)
        return {
            "items_in": int(items),
            "items_per_s": round(items / elapsed, 2),
            "calls_out": int(total(self.calls_out)),
            "dead_letters": int(total(self.dead_letters)),
            "batches": self.batches,
            "mean_batch_size": round(sum(self.sizes) / len(self.sizes), 2) if self.sizes else 0,
            "llm_latency_p50_s": round(lat[len(lat) // 2], 3) if lat else 0,
            "llm_latency_p99_s": round(lat[int(len(lat) * 0.99)], 3) if lat else 0,
            "in_flight": self.flying,
            "in_flight_limit": int(self.limit),
            "cost_per_item_usd": round(self.cost / self.answered, 6) if self.answered else 0,
            "tier": self.prices.tier,
            "batches_in_flight": 0,
            "batch_oldest_age_s": 0,
            "oldest_uncommitted_s": 0,
            "lag": self.partitions.lag_total,
            **self.batch_live,
            "decisions": list(self.decisions)[::-1],
            "quality": self.agreement.live(),
            "budget": self.spend.live,
            "workflow_states": self.partitions.held,
        }


@dataclass(frozen=True, slots=True)
class SpendGauges:
    rate: Gauge
    ceiling: Gauge
    headroom: Gauge
    met_in: Gauge
    paced: Gauge
    paced_seconds: Counter
    live: dict[str, Any] = field(default_factory=dict)  # what the live page shows


def _spend(r: CollectorRegistry) -> SpendGauges:
    usd = "USD per hour, model tokens at the spec's prices"
    return SpendGauges(
        Gauge(f"{_P}spend_usd_per_hour", f"Spend rate over the last minutes ({usd})", registry=r),
        Gauge(
            f"{_P}budget_usd_per_hour", f"The spend ceiling as a rate ({usd}); 0: none", registry=r
        ),
        Gauge(f"{_P}budget_headroom_usd_per_hour", "The ceiling less the spend rate", registry=r),
        Gauge(
            f"{_P}budget_met_in_seconds",
            "When the ceiling will be met at the spend rate now (0: paced now; -1: not at it)",
            registry=r,
        ),
        Gauge(f"{_P}paced_by_budget", "1 while input is held to keep to the ceiling", registry=r),
        Counter(f"{_P}paced_by_budget_seconds", "Time input was held for budget", registry=r),
    )


class WorkerMetrics:
    """An activity worker's metrics: what its handlers did."""

    def __init__(self) -> None:
        self.registry = _registry()
        r = self.registry
        self.handled = Counter(f"{_P}activity_handled", "Calls handled", ["tool"], registry=r)
        self.failed = Counter(
            f"{_P}activity_failed", "Calls whose handler gave up", ["tool"], registry=r
        )
        self.duplicates = Counter(
            f"{_P}activity_duplicates", "Calls dropped as already handled", registry=r
        )
        self.results = Counter(
            f"{_P}activity_results", "Results of awaited calls published", registry=r
        )
        self.latency = Histogram(
            f"{_P}activity_seconds",
            "Handler run time",
            ["tool"],
            buckets=_SECONDS,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def live(self) -> dict[str, Any]:
        return {
            m.name: sum(s.value for s in m.samples if s.name.endswith("_total"))
            for m in self.registry.collect()
            if m.type == "counter"
        }
