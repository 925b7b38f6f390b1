"""Prometheus metrics of a processor, and the live figures its page shows.

One registry per process, passed down (not the library's global one), so tests can build
as many pipelines as they like. Names are the ones the Grafana dashboard in deploy/ uses.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from instanced_stream.core.spec import ModelEndpoint
from instanced_stream.ops.agreement import AgreementMetrics

__all__ = ["Metrics", "WorkerMetrics"]

_SIZES = (1, 2, 5, 10, 25, 50, 100, 200, 500)
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


def _registry() -> CollectorRegistry:
    """Our own registry, plus the process_* (CPU, memory, open files) and python_info
    series every Prometheus target is expected to export."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class Metrics:
    def __init__(self, prices: ModelEndpoint | None = None, window: int = 0) -> None:
        self.registry = _registry()
        r = self.registry
        self.agreement = AgreementMetrics(r, window)
        self.items_in = Counter("stream_items_in", "Input records taken", registry=r)
        self.calls_out = Counter("stream_calls_out", "Calls published", ["tool"], registry=r)
        self.dead_letters = Counter(
            "stream_dead_letters", "Dead-letter records by code", ["code"], registry=r
        )
        self.batch_size = Histogram(
            "stream_batch_size", "Instances per batch", buckets=_SIZES, registry=r
        )
        self.window_close = Counter(
            "stream_window_close", "Why windows closed", ["reason"], registry=r
        )
        self.llm_latency = Histogram(
            "stream_llm_latency_seconds", "LLM request latency", buckets=_SECONDS, registry=r
        )
        self.in_flight = Gauge("stream_llm_in_flight", "Batches in flight", registry=r)
        self.tokens = Counter("stream_tokens", "Tokens by kind", ["kind"], registry=r)
        self.cost_per_item = Gauge(
            "stream_cost_per_item_usd", "Estimated LLM cost per answered item", registry=r
        )
        # A counter, so rate(stream_llm_cost_usd_total[5m]) is dollars per second; cached
        # prompt tokens are priced as the provider bills them.
        self.cost_usd = Counter(
            "stream_llm_cost_usd", "Estimated LLM cost, cached prompt tokens priced", registry=r
        )
        self.retries = Counter("stream_llm_retries", "Retried LLM requests", registry=r)
        self.circuit_open = Gauge(
            "stream_circuit_open", "1 while the endpoint keeps failing", registry=r
        )
        self.refused = Gauge(
            "stream_llm_refused",
            "HTTP status while the endpoint refuses the key or model (401/403/404) or the"
            " request's shape (400 naming a parameter or the schema), else 0; consumption is"
            " paused meanwhile",
            registry=r,
        )
        self.request_shape = Gauge(
            "stream_llm_request_shape",
            "1 for the request shape in use (probed at start, or the spec's model.request)",
            ["tokens_param", "temperature", "response_format"],
            registry=r,
        )
        self.in_flight_limit = Gauge(
            "stream_llm_in_flight_limit",
            "Batches allowed in flight now (adaptive: grows while healthy, shrinks on 429s)",
            registry=r,
        )
        self.lag = Gauge(
            "stream_consumer_lag", "Records not yet consumed", ["partition"], registry=r
        )
        self.llm_requests = Counter(
            "stream_llm_requests", "Model requests (re-asks and splits included)", registry=r
        )
        self.refused_calls = Counter(
            "stream_refused_calls",
            "Calls of the model's answers refused, by code",
            ["code"],
            registry=r,
        )
        self.events = Counter(
            "stream_events",
            "What else became of instances and workflows, by kind (no_action, latent_calls,"
            " reviewed, proposals, done, turns, results, consults, advisor_opinions, ...)",
            ["kind"],
            registry=r,
        )
        self.context_refused = Gauge(
            "stream_context_refused", "Context messages refused at the latest change", registry=r
        )
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
        self._lagging: set[int] = set()

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
        """`reasoning`: of `completion`, a reasoning model's hidden tokens; billed as
        output, so priced with it, and counted apart to show what thinking costs."""
        self.tokens.labels("prompt").inc(prompt)
        self.tokens.labels("completion").inc(completion)
        self.tokens.labels("cached").inc(cached)
        self.tokens.labels("reasoning").inc(reasoning)
        self.answered += answered
        cost = self.prices.cost_usd(prompt, completion, cached)
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

    def set_lag(self, lags: Mapping[int, int]) -> None:
        """Lag of the partitions owned now; a revoked partition's series is removed, so
        no stale figure stays behind for the new owner's to double."""
        for gone in self._lagging - lags.keys():
            self.lag.remove(str(gone))
        for partition, lag in lags.items():
            self.lag.labels(str(partition)).set(lag)
        self._lagging = set(lags)

    def on_circuit(self, is_open: bool) -> None:
        self.circuit_open.set(1 if is_open else 0)
        self._circuit = is_open

    def on_shape(self, labels: dict[str, str]) -> None:
        self.request_shape.clear()
        self.request_shape.labels(**labels).set(1)

    def on_refused(self, status: int | None) -> None:
        self.refused.set(status or 0)
        self._refused = bool(status)

    @property
    def endpoint_ok(self) -> bool:
        """False while the endpoint refuses the key or model, or its circuit is open."""
        return not (self._circuit or self._refused)

    def count(self, events: Mapping[str, int]) -> None:
        """Counts named events: `calls.<tool>`, `dead_letter.<code>`, `refused.<code>`,
        `llm_requests`; any other name is a kind of `stream_events`."""
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
            **by(self.tokens, "", "_tokens"),
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
            "decisions": list(self.decisions)[::-1],
            "quality": self.agreement.live(),
        }


class WorkerMetrics:
    """An activity worker's metrics: what its handlers did."""

    def __init__(self) -> None:
        self.registry = _registry()
        r = self.registry
        self.handled = Counter("stream_activity_handled", "Calls handled", ["tool"], registry=r)
        self.failed = Counter(
            "stream_activity_failed", "Calls whose handler gave up", ["tool"], registry=r
        )
        self.duplicates = Counter(
            "stream_activity_duplicates", "Calls dropped as already handled", registry=r
        )
        self.results = Counter(
            "stream_activity_results", "Results of awaited calls published", registry=r
        )
        self.latency = Histogram(
            "stream_activity_seconds", "Handler run time", ["tool"], buckets=_SECONDS, registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def live(self) -> dict[str, Any]:
        return {
            m.name: sum(s.value for s in m.samples if s.name.endswith("_total"))
            for m in self.registry.collect()
            if m.type == "counter"
        }
