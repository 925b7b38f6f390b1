"""`stream eval`: what a window size costs in decisions, before you choose it.

Runs a JSONL file of items through the product's own request building, solving and
validation (no Kafka) at several window sizes against any OpenAI-compatible endpoint,
and reports per size: agreement with the per-item decisions (window 1), accuracy
against labels where lines carry them, tokens, requests and cost per item, and request
latency.

A *decision* is what an instance's calls decide, free text left out
(`instanced_stream.core.decision`, which the processor's live shadow sample uses too).

A *label* is the line's `_label`: `{tool: {argument: value}}`, e.g.
`{"moderateComment": {"decision": "reject"}}`. An answer is right when, for every tool
in the label, it called that tool with those argument values; other calls do not
matter. Fields starting with `_` (other than `_instance`) never reach the model.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.core.cache_rule import PRESETS
from instanced_stream.core.decision import Decision, decision_of
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.prompt import Instance, PromptBuilder
from instanced_stream.core.solve import Outcome, Solver
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.tokenizer import estimate_tokens
from instanced_stream.core.validate import Validator
from instanced_stream.observe.progress import Progress

__all__ = [
    "EvalItem",
    "SizeReport",
    "decision_of",
    "disagreements",
    "evaluate",
    "load_items",
    "markdown",
]


@dataclass(frozen=True, slots=True)
class EvalItem:
    id: str
    payload: dict[str, Any]
    label: dict[str, dict[str, Any]] | None


@dataclass(slots=True)
class SizeReport:
    window: int
    items: int
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    unanswered: int = 0
    cost_usd: float = 0.0
    # The same tokens billed under each cache preset (core/cache_rule.py), USD in all.
    cost_by_rule: dict[str, float] = field(default_factory=dict)
    # Answer tokens by who wrote them (each advisor, the calls), where the endpoint
    # counts them (the simulator's `answer_tokens:*`): what each advisor costs.
    answer_parts: dict[str, float] = field(default_factory=dict)
    agreement: float | None = None
    accuracy: float | None = None
    reasks: int = 0  # requests beyond each window's first (skipped or refused instances)
    # --permutations: the share of items whose decision changed with the items' order
    order_changed: float | None = None
    latencies: list[float] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)

    def per_item(self, value: float) -> float:
        return value / self.items if self.items else 0.0

    def latency(self, q: float) -> float:
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(len(lat) * q))] if lat else 0.0


def load_items(path: Path) -> list[EvalItem]:
    """Reads the JSONL file; a line that is not a JSON object is an error naming it."""
    items = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        label = row.get("_label")
        payload = {k: v for k, v in row.items() if not k.startswith("_")}
        ident = str(row.get("_instance", row.get("id", f"line-{number}")))
        items.append(EvalItem(ident, payload, label if isinstance(label, dict) else None))
    return items


def _right(decision: Decision, label: dict[str, dict[str, Any]]) -> bool:
    for tool, args in label.items():
        if not args and not any(t == tool for t, _, _ in decision):
            return False
        for key, value in args.items():
            if (tool, key, orjson.dumps(value).decode()) not in decision:
                return False
    return True


async def _run_size(
    spec: AgentSpec,
    llm: Model,
    items: list[EvalItem],
    window: int,
    concurrency: int,
    progress: Progress | None = None,
) -> SizeReport:
    builder = PromptBuilder(spec)
    solver = Solver(llm, builder, Validator(spec), max_attempts=3)
    report = SizeReport(window, len(items))
    gate = asyncio.Semaphore(concurrency)
    instances = [
        Instance(
            it.id,
            dict(it.payload),
            SourcePosition(topic="eval", partition=0, offset=k),
            len(orjson.dumps(it.payload)),
        )
        for k, it in enumerate(items)
    ]

    async def one(chunk: list[Instance]) -> Outcome:
        async with gate:
            outcome = await solver.solve(chunk)
        if progress is not None:
            progress.advance(len(chunk))
        return outcome

    chunks = [instances[k : k + window] for k in range(0, len(instances), window)]
    for outcome in await asyncio.gather(*(one(c) for c in chunks)):
        report.requests += outcome.requests
        report.reasks += max(0, outcome.requests - 1)
        report.prompt_tokens += outcome.prompt_tokens
        report.completion_tokens += outcome.completion_tokens
        report.cached_tokens += outcome.cached_tokens
        report.unanswered += len(outcome.unanswered)
        report.latencies += outcome.latencies
        for answer in outcome.answers:
            report.decisions[answer.instance.id] = decision_of(answer.calls, spec)
    report.cost_usd = spec.model.cost_usd(
        report.prompt_tokens, report.completion_tokens, report.cached_tokens
    )
    # Every request shares the system message: each rule's cache serves what it would of
    # it (the first request writes it, the rest read it), whatever the endpoint reported.
    prefix = estimate_tokens(builder.system) + 3  # its framing, as the prompt counts it
    for name, preset in PRESETS.items():
        use = preset.rule.over(prefix, report.requests)
        report.cost_by_rule[name] = spec.model.cost_usd(
            report.prompt_tokens,
            report.completion_tokens,
            use.read,
            written=use.written,
            rule=preset.rule,
        )
    labelled = [it for it in items if it.label]
    if labelled:
        right = sum(
            1
            for it in labelled
            if it.id in report.decisions and _right(report.decisions[it.id], it.label or {})
        )
        report.accuracy = right / len(labelled)
    return report


async def evaluate(
    spec: AgentSpec,
    llm: Model,
    items: list[EvalItem],
    windows: list[int],
    concurrency: int = 4,
    permutations: int = 0,
    show_progress: bool = False,
    counts: Callable[[], Mapping[str, float]] | None = None,
    window_one: bool = True,
) -> list[SizeReport]:
    """One report per window size; window 1 runs first, as the reference (unless not
    `window_one`: on a slow local model its request per item is most of the run's time;
    agreement is then against the first size asked).
    `permutations`: each window above 1 is asked that many more times with the items
    shuffled (fixed seeds), and reports how often an item's decision changed with the
    order (BatchPrompt's order effect). With `show_progress`, each size's items answered
    so far go to stderr (a real model takes minutes per size). `counts`: the endpoint's
    counters (the simulator's stats), read around each size for its answer's parts."""
    sizes = [1, *[w for w in dict.fromkeys(windows) if w != 1]] if window_one else list(windows)
    reports = []
    for window in sizes:
        before = dict(counts()) if counts else {}
        if not show_progress:
            reports.append(await _run_size(spec, llm, items, window, concurrency))
        else:
            with Progress(f"eval window {window}", total=len(items)) as progress:
                reports.append(await _run_size(spec, llm, items, window, concurrency, progress))
        after = dict(counts()) if counts else {}
        reports[-1].answer_parts = {
            key.removeprefix("answer_tokens:"): value - before.get(key, 0.0)
            for key, value in after.items()
            if key.startswith("answer_tokens:") and value > before.get(key, 0.0)
        }
    reference = reports[0].decisions
    for report in reports:
        shared = [i for i in reference if i in report.decisions]
        same = sum(1 for i in shared if report.decisions[i] == reference[i])
        report.agreement = same / len(reference) if reference else None
    for report in reports[1:] if permutations else []:
        runs = [report.decisions]
        for seed in range(permutations):
            order = list(items)
            random.Random(seed).shuffle(order)
            runs.append((await _run_size(spec, llm, order, report.window, concurrency)).decisions)
        changed = sum(1 for it in items if len({str(r.get(it.id)) for r in runs}) > 1)
        report.order_changed = changed / len(items) if items else None
    return reports


def markdown(reports: list[SizeReport], source: str, model: str, price: float = 0.0) -> str:
    """`price`: USD per million output tokens, for what each part of the answer costs."""

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f}%"

    ordered = any(r.order_changed is not None for r in reports)

    lines = [
        f"{reports[0].items if reports else 0} items from `{source}`, model `{model}`",
        "",
        "| window | requests/item | prompt tok/item | cached | completion tok/item "
        "| cost/item USD | agreement with window 1 | accuracy | re-asks/item | unanswered "
        "| p50 s | p99 s |" + (" decision changed by order |" if ordered else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if ordered else ""),
    ]
    for r in reports:
        lines.append(
            f"| {r.window} | {r.per_item(r.requests):.3f} | {r.per_item(r.prompt_tokens):.1f} "
            f"| {pct(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else None)} "
            f"| {r.per_item(r.completion_tokens):.1f} | {r.per_item(r.cost_usd):.7f} "
            f"| {pct(r.agreement)} | {pct(r.accuracy)} | {r.per_item(r.reasks):.3f} "
            f"| {r.unanswered} | {r.latency(0.5):.2f} | {r.latency(0.99):.2f} |"
            + (f" {pct(r.order_changed)} |" if ordered else "")
        )
    return "\n".join(lines + _rule_lines(reports) + _part_lines(reports, price)) + "\n"


def _part_lines(reports: list[SizeReport], price: float) -> list[str]:
    """Answer tokens per item by who wrote them, and what they cost at the output price."""
    parts = list(dict.fromkeys(k for r in reports for k in r.answer_parts))
    if not parts:
        return []
    lines = [
        "",
        "Answer tokens per item by who wrote them (the endpoint's count), and USD per item "
        "at the output price:",
        "",
        "| window | " + " | ".join(parts) + " |",
        "|---:|" + "---:|" * len(parts),
    ]
    for r in reports:
        cells = []
        for part in parts:
            tokens = r.per_item(r.answer_parts.get(part, 0.0))
            cells.append(f"{tokens:.1f} ({tokens * price / 1e6:.2e})")
        lines.append(f"| {r.window} | " + " | ".join(cells) + " |")
    return lines


def _rule_lines(reports: list[SizeReport]) -> list[str]:
    """USD per item under every cache preset, and its share of window 1's."""
    rules = list(dict.fromkeys(k for r in reports for k in r.cost_by_rule))
    if not rules or not reports:
        return []
    base = reports[0]
    lines = [
        "",
        "USD per item under each provider's cache rule (the same tokens; presets in "
        "core/cache_rule.py, read 2026-12-01), and against window 1:",
        "",
        "| window | " + " | ".join(rules) + " |",
        "|---:|" + "---:|" * len(rules),
    ]
    for r in reports:
        cells = []
        for rule in rules:
            usd, ref = (
                r.per_item(r.cost_by_rule.get(rule, 0.0)),
                base.per_item(base.cost_by_rule.get(rule, 0.0)),
            )
            share = (
                f"1/{ref / usd:.1f}"
                if usd and ref and usd < ref
                else (f"{usd / ref:.1f}x" if usd and ref else "–")
            )
            cells.append(f"{usd:.2e} ({share})")
        lines.append(f"| {r.window} | " + " | ".join(cells) + " |")
    return lines


def disagreements(reports: list[SizeReport], items: list[EvalItem], most: int = 3) -> str:
    """Examples of items decided differently at a larger window than at window 1."""

    def shown(decision: Decision | None) -> str:
        if decision is None:
            return "(unanswered)"
        return ", ".join(sorted(f"{t}.{k}={v}" if k else t for t, k, v in decision)) or "-"

    base = reports[0].decisions if reports else {}
    lines: list[str] = []
    for report in reports[1:]:
        differ = [i for i in items if report.decisions.get(i.id) != base.get(i.id)][:most]
        lines += [
            f"- window {report.window}, `{i.id}` {orjson.dumps(i.payload).decode()[:70]}: "
            f"window 1 {shown(base.get(i.id))}, window {report.window} "
            f"{shown(report.decisions.get(i.id))}"
            for i in differ
        ]
    return ("Decided differently than at window 1:\n" + "\n".join(lines) + "\n") if lines else ""
