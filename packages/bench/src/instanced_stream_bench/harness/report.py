"""What `stream bench` measures (a `Result` per run, against an `Endpoint`, the simulated
account), rendered as one markdown table with the ratios, and PNG plots."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instanced_stream.errors import StreamError

__all__ = [
    "Endpoint",
    "Result",
    "delivery_lines",
    "judge_of",
    "markdown",
    "median_run",
    "plots",
    "rule_lines",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The simulated account. Defaults: a fast hosted small model."""

    latency_ms: float = 500.0
    per_output_token_ms: float = 2.0
    concurrency: int = 8
    tokens_per_minute: int = 2_000_000
    instant: bool = False

    def config(self) -> dict[str, Any]:
        if self.instant:
            # Nothing to wait for and nothing expensive to compute: what is left to
            # measure is the processor (the classifier would be the bottleneck).
            return {
                "latency_ms": 0.0,
                "per_output_token_ms": 0.0,
                "max_concurrency": 0,
                "tokens_per_minute": 0,
                "classifier": False,
            }
        return {
            "latency_ms": self.latency_ms,
            "per_output_token_ms": self.per_output_token_ms,
            "max_concurrency": self.concurrency,
            "tokens_per_minute": self.tokens_per_minute,
            "classifier": True,
        }


@dataclass(slots=True)
class Result:
    name: str
    window: int | None
    processes: int
    partitions: int
    items: int
    seconds: float
    items_per_s: float
    requests_per_item: float | None = None
    refused_per_item: float | None = None
    prompt_per_item: float | None = None
    completion_per_item: float | None = None
    cached_share: float | None = None  # of prompt tokens, as the endpoint reported
    cost_per_item_usd: float | None = None  # the spec's prices, cached tokens at theirs
    # The same tokens billed under each cache preset (core/cache_rule.py), USD per item.
    cost_by_rule: dict[str, float] = field(default_factory=dict)
    # Answer tokens per item by who wrote them: each advisor, and the calls.
    answer_parts: dict[str, float] = field(default_factory=dict)
    mean_batch: float | None = None
    ceiling_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    rss_start_mb: float | None = None
    rss_end_mb: float | None = None
    cpu_ms_per_item: float | None = None  # the processors' own CPU time per item
    capped: bool = False
    delivery: str = "exactly_once"
    tier: str = "online"  # the batch tier: Batch API lines at its price (docs/batch.md)
    # Who decided: "simulator: classifier" (the bench's trained classifier and
    # rules) or "model: <name>". The simulator's word rules alone answer ~3x shorter, so
    # the bench refuses them rather than print figures that depend on an install.
    judge: str | None = None
    notes: list[str] = field(default_factory=list)


def judge_of(llm: str, model: str | None = None) -> str:
    """Who decides in a bench, for every row of bench.json. The simulator without its
    classifier (alt-profanity-check, the `testing` extra) is refused: its word rules alone
    answer about 3x shorter (answer tokens per item), figures that would change with the
    install, not with the product."""
    if llm != "simulator":
        return f"model: {model or llm}"
    if importlib.util.find_spec("profanity_check") is None:
        raise StreamError(
            "stream bench judges with the simulator's classifier (alt-profanity-check, in "
            "the `testing` extra), which is not installed; its word rules alone give "
            "figures about 3x apart: pip install ./packages/bench (instanced-stream-bench)"
        )
    return "simulator: classifier"


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _usd(value: float | None) -> str:
    return "–" if value is None else f"{value:.2e}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "–"
    return f"{value / base:.1f}x"


def _fraction(value: float | None, base: float | None) -> str:
    """A cost against the baseline's, as the share it is (1/4.2: a quarter and less)."""
    if not value or not base:
        return "–"
    return f"1/{base / value:.1f}" if value < base else f"{value / base:.1f}x"


def _pct(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "–"
    return f"{100 * value / base:.0f}%"


def median_run(results: list[Result]) -> Result:
    """The run of median throughput (the lower middle of an even count), its note naming
    every run's figure, so the table shows a typical run rather than a lucky one."""
    ranked = sorted(results, key=lambda r: r.items_per_s)
    kept = ranked[(len(ranked) - 1) // 2]
    if len(results) > 1:
        rates = ", ".join(f"{r.items_per_s:,.0f}" for r in results)
        kept.notes.append(f"median of {len(results)} runs in alternating order ({rates} items/s)")
    return kept


def delivery_lines(by_name: dict[str, Result]) -> list[str]:
    """Exactly once against at least once, LLM-bound and at the machine's limit."""
    pairs = [
        ("window 50", "window 50, at least once", 95),
        ("instant simulator, window 50", "instant simulator, window 50, at least once", 80),
    ]
    lines = []
    for eo_name, alo_name, target in pairs:
        eo, alo = by_name.get(eo_name), by_name.get(alo_name)
        if eo and alo and alo.items_per_s:
            share = 100 * eo.items_per_s / alo.items_per_s
            verdict = "met" if share >= target else "missed"
            lines.append(
                f"- {eo_name}: exactly once {share:.0f}% of at least once's items/s "
                f"(target at least {target}%: {verdict})"
            )
    return ["", "Delivery modes:", *lines] if lines else []


def _baseline_of(r: Result, results: list[Result]) -> Result | None:
    """The per-item baseline a row is compared with: its own if the run has one (a row
    "window 50, reasoning brief, prefix over 1,024" against "baseline (window 1),
    reasoning brief, prefix over 1,024"), else its spec variant's (a row named "...,
    advisors" against "baseline (window 1), advisors")."""
    if r.window == 1 and r.name.startswith("baseline (window 1)"):
        return r  # a baseline is its own
    head, sep, rest = r.name.partition(", ")
    if head.startswith("window ") and sep:
        own = next((b for b in results if b.name == f"baseline (window 1), {rest}"), None)
        if own is not None:
            return own
    variant = next((v for v in _VARIANTS if r.name.endswith(v)), "")
    name = "baseline (window 1)" + variant
    return next((b for b in results if b.name == name), None)


# Spec variants a bench runs besides the example as it is (harness/bench.py).
_VARIANTS = (", advisors", ", prefix over 1,024")


def rule_lines(results: list[Result]) -> list[str]:
    """USD per item and the share of the baseline's, under every cache preset: one run's
    tokens, billed by each provider's rule."""
    rules = list(dict.fromkeys(k for r in results for k in r.cost_by_rule))
    if not rules:
        return []
    lines = [
        "",
        "USD per item under each provider's cache rule (the same tokens; presets in "
        "core/cache_rule.py, read 2026-12-01), and against the baseline of the same spec:",
        "",
        "| run | " + " | ".join(rules) + " |",
        "|---|" + "---:|" * len(rules),
    ]
    for r in results:
        if not r.cost_by_rule:
            continue
        base = _baseline_of(r, results)
        cells = []
        for rule in rules:
            usd = r.cost_by_rule.get(rule)
            ref = base.cost_by_rule.get(rule) if base else None
            share = _fraction(usd, ref) if base is not r else "1.0x"
            cells.append(f"{_usd(usd)} ({share})")
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return lines


def markdown(
    results: list[Result], endpoint: Endpoint, command: str, real: str | None = None
) -> str:
    """The table; `real` describes a real endpoint (then `endpoint` shaped nothing)."""
    by_name = {r.name: r for r in results}
    base = by_name.get("baseline (window 1)")
    passthrough = by_name.get("aiokafka passthrough")
    about = (
        f"Real endpoint: {real}; its ceiling is `slots x mean batch / its measured latency`."
        if real
        else f"Simulated endpoint: {endpoint.latency_ms:.0f} ms + "
        f"{endpoint.per_output_token_ms:g} ms per output token, at most "
        f"{endpoint.concurrency} requests at once and {endpoint.tokens_per_minute:,} tokens "
        "per minute (429 with retry-after beyond either)."
    )
    judges = sorted({r.judge for r in results if r.judge})
    lines = [
        f"Command: `{command}`",
        "",
        about + (f" Judge: {', '.join(judges)}." if judges else ""),
        "",
        "| run | items | items/s | vs baseline | vs LLM ceiling | vs passthrough "
        "| requests/item | refused/item | prompt tok/item | cached | completion tok/item "
        "| USD/item | cost vs baseline | mean batch | p50 ms | p99 ms | RSS start→end MB "
        "| processor CPU ms/item |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rss = (
            f"{_f(r.rss_start_mb, 0)}→{_f(r.rss_end_mb, 0)}" if r.rss_start_mb is not None else "–"
        )
        name = r.name + (" (time cap)" if r.capped else "")
        own = _baseline_of(r, results)  # a variant's cost against its own baseline's
        lines.append(
            f"| {name} | {r.items:,} | {_f(r.items_per_s)} "
            f"| {_ratio(r.items_per_s, base.items_per_s if base else None)} "
            f"| {_pct(r.items_per_s, r.ceiling_per_s)} "
            f"| {_pct(r.items_per_s, passthrough.items_per_s if passthrough else None)} "
            f"| {_f(r.requests_per_item, 4)} | {_f(r.refused_per_item, 4)} "
            f"| {_f(r.prompt_per_item)} | {_pct(r.cached_share, 1.0)} "
            f"| {_f(r.completion_per_item)} | {_usd(r.cost_per_item_usd)} "
            f"| {_fraction(r.cost_per_item_usd, own.cost_per_item_usd if own else None)} "
            f"| {_f(r.mean_batch)} "
            f"| {_f(r.p50_ms, 0)} | {_f(r.p99_ms, 0)} | {rss} | {_f(r.cpu_ms_per_item, 3)} |"
        )
    if base is not None:
        lines += ["", "Against the per-item baseline:"]
        for r in results:
            own = _baseline_of(r, results) or base
            if r.window and r.window > 1 and r.requests_per_item and r.prompt_per_item:
                lines.append(
                    f"- {r.name}: requests per item 1/"
                    f"{(own.requests_per_item or 0) / r.requests_per_item:.0f}, prompt tokens "
                    f"per item 1/{(own.prompt_per_item or 0) / r.prompt_per_item:.1f}, USD per "
                    f"item {_fraction(r.cost_per_item_usd, own.cost_per_item_usd)}, "
                    f"throughput {_ratio(r.items_per_s, own.items_per_s)}"
                )
    lines += rule_lines(results)
    written = [
        f"- {r.name}: "
        + ", ".join(f"{part} {tokens:.1f}" for part, tokens in r.answer_parts.items())
        for r in results
        if len(r.answer_parts) > 1  # advisors spoke: what each wrote
    ]
    if written:
        lines += ["", "Answer tokens per item by who wrote them (each advisor, the calls):"]
        lines += written
    lines += delivery_lines(by_name)
    scaling = [r for r in results if r.name.startswith("scaling")]
    if scaling:
        lines += ["", "Scaling (window 25, 4 in flight per process):"]
        for parts in sorted({r.partitions for r in scaling}):
            one = next((r for r in scaling if r.partitions == parts and r.processes == 1), None)
            two = next((r for r in scaling if r.partitions == parts and r.processes == 2), None)
            if one and two:
                lines.append(
                    f"- {parts} partition(s): 1 process {_f(one.items_per_s)} items/s, "
                    f"2 processes {_f(two.items_per_s)} items/s: "
                    f"{_ratio(two.items_per_s, one.items_per_s)}"
                )
    notes = [f"- {r.name}: {n}" for r in results for n in r.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def plots(results: list[Result], folder: Path) -> list[Path]:
    """Throughput and cost per item by run, as PNG files in `folder`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    runs = [r for r in results if not r.name.startswith("scaling")]
    names = [r.name.replace(" simulator,", "\nsimulator,").replace(" (", "\n(") for r in runs]
    out = []

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(names, [r.items_per_s for r in runs], color="#3b6ea5", label="measured")
    ceilings = [(k, r.ceiling_per_s) for k, r in enumerate(runs) if r.ceiling_per_s]
    if ceilings:
        ax.scatter(
            [k for k, _ in ceilings],
            [c for _, c in ceilings],
            marker="_",
            s=900,
            color="#c0392b",
            label="LLM ceiling (window x in-flight / latency, TPM)",
        )
    ax.set_yscale("log")
    ax.set_ylabel("items per second (log)")
    ax.set_title("Throughput")
    ax.legend(loc="upper right", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    path = folder / "bench-throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(path)

    llm = [r for r in runs if r.requests_per_item is not None and r.window]
    if llm:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        xs = list(range(len(llm)))
        width = 0.4
        ax.bar(
            [x - width / 2 for x in xs],
            [r.prompt_per_item or 0 for r in llm],
            width,
            label="prompt tokens / item",
            color="#3b6ea5",
        )
        ax.bar(
            [x + width / 2 for x in xs],
            [r.completion_per_item or 0 for r in llm],
            width,
            label="completion tokens / item",
            color="#e1a43b",
        )
        ax.set_xticks(xs, [r.name.replace(" (", "\n(") for r in llm], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("tokens per item (log)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r.requests_per_item or 0 for r in llm], "o-", color="#c0392b")
        ax2.set_yscale("log")
        ax2.set_ylabel("LLM requests per item (log, red)")
        ax.set_title("Cost per item")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        path = folder / "bench-cost.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
