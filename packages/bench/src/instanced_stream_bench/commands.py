"""What `stream bench` and `stream eval` do with their parsed options: run, write the
report files, print the table. The CLI only parses and dispatches to these."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from instanced_stream.errors import StreamError
from instanced_stream.settings import Settings

from instanced_stream_bench.harness.report import Endpoint

if TYPE_CHECKING:
    from instanced_stream.core.spec import AgentSpec

__all__ = ["bench", "evaluate", "model_variants", "soak", "with_model"]


def bench(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream_bench.harness.bench import bench_spec, results_json, run_bench
    from instanced_stream_bench.harness.report import judge_of, markdown, plots
    from instanced_stream_bench.harness.spec_variants import with_advisors
    from instanced_stream_bench.testing.broker import kafka_bootstrap

    endpoint = Endpoint(
        latency_ms=args.latency_ms,
        per_output_token_ms=args.ms_per_token,
        concurrency=args.concurrency,
        tokens_per_minute=args.tpm,
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.timer:
        if args.churn or args.soak:
            raise StreamError("--timer runs alone: stream bench --timer --states N")
        if args.states < 1:
            raise StreamError(f"--states must be at least 1 (got {args.states})")
        from instanced_stream_bench.harness.timer import timer_command

        return timer_command(args.states, args.partitions or 24, Path(args.out))
    if (args.restarts or args.brokers > 1) and not args.churn:
        raise StreamError(
            "--restarts and --brokers belong to --churn: stream bench --churn --restarts N"
        )
    if args.brokers > 1 and not args.restarts:
        raise StreamError("--brokers runs the restart storm: add --restarts N (20 or more)")
    if args.churn and args.restarts:
        from instanced_stream_bench.harness.storm import storm_command

        return storm_command(args, settings)
    if args.churn:
        from instanced_stream_bench.harness.churn import churn_command

        return churn_command(args, settings)
    if args.soak:
        return soak(args, endpoint, settings)
    windows = tuple(args.windows)
    # who decides, for every row; the simulator without its classifier is refused here,
    # before anything starts
    judge = judge_of(args.endpoint or args.llm, settings.llm_model)
    # The bench's own default spec unless one was chosen (flag, STREAM_SPEC or .env).
    spec = bench_spec(settings.spec) if "spec" in settings.model_fields_set else None
    advised = with_advisors(settings.spec)  # the same spec with its advisors, beside it
    out = Path(args.out)
    with kafka_bootstrap(settings.bootstrap_servers) as bootstrap:
        results = asyncio.run(
            run_bench(
                bootstrap,
                items=args.items,
                partitions=args.partitions or 4,
                windows=windows,
                endpoint=endpoint,
                cap_s=args.cap_s,
                paced_s=args.paced_s,
                scaling=args.scaling,
                spec=spec,
                llm=args.endpoint or args.llm,
                model=settings.llm_model,
                variants=tuple(v for v in args.variants.split(",") if v),
                tier=args.tier,
                duplicates=args.duplicates,
                advised=advised,
            )
        )
    results = [replace(r, judge=judge) for r in results]
    command = "stream bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "stream bench"
    llm = args.endpoint or args.llm
    table = markdown(results, endpoint, command.strip(), None if llm == "simulator" else llm)
    (out / "bench.md").write_text(table)
    (out / "bench.json").write_bytes(results_json(results))
    for path in plots(results, out):
        print(f"plot: {path}", file=sys.stderr)
    print(table)
    return 0


def soak(args: argparse.Namespace, endpoint: Endpoint, settings: Settings) -> int:
    from instanced_stream_bench.harness.soak import markdown, plot, run_soak
    from instanced_stream_bench.testing.broker import kafka_bootstrap

    out = Path(args.out)
    with kafka_bootstrap(settings.bootstrap_servers) as bootstrap:
        result = asyncio.run(run_soak(bootstrap, args.soak, endpoint, args.rate))
    table = markdown(result, "stream bench " + " ".join(sys.argv[2:]))
    (out / "soak.md").write_text(table)
    print(f"plot: {plot(result, out / 'soak.png')}", file=sys.stderr)
    print(table)
    return 0


def evaluate(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.core.prompt import PromptBuilder
    from instanced_stream.core.spec import load_spec
    from instanced_stream.llm.client import LLM
    from instanced_stream.llm.factory import initial_shape, resolve_api_key
    from instanced_stream.llm.options import RequestOptions
    from instanced_stream.llm.preflight import probe

    from instanced_stream_bench.harness.eval import disagreements, load_items, markdown
    from instanced_stream_bench.harness.eval import evaluate as run_eval
    from instanced_stream_bench.harness.target import llm_target

    spec = load_spec(settings.spec)
    try:
        items = load_items(Path(args.file))
    except (OSError, ValueError) as exc:
        raise StreamError(str(exc)) from exc
    if args.limit:
        items = items[: args.limit]
    windows = list(args.windows)
    variants = model_variants(getattr(args, "variants", ""))
    choice = args.llm or settings.llm_base_url or spec.model.base_url or "simulator"
    if choice == "simulator" and not args.llm:
        print(
            "no model endpoint set: using the bundled LLM SIMULATOR (not a model)", file=sys.stderr
        )
    with llm_target(choice, model=settings.llm_model or spec.model.name) as target:
        key = resolve_api_key(settings, spec) if target.kind == "endpoint" else "none"

        sim = target.sim  # the simulator's counters: who wrote the answer's tokens

        async def run(spec: AgentSpec) -> list[Any]:
            llm = LLM(
                base_url=target.url,
                api_key=key,
                model=target.model,
                timeout_s=settings.llm_timeout_s or spec.model.timeout_s,
                request=RequestOptions(
                    shape=initial_shape(spec),
                    temperature=spec.model.temperature,
                    max_output_tokens=spec.model.max_output_tokens,
                    reasoning_effort=spec.model.reasoning_effort,
                    reasoning_headroom=spec.model.reasoning_headroom,
                ),
            )
            try:
                # The same request shape `stream process` would send.
                if spec.model.request is None:
                    llm.shape = (await probe(llm, PromptBuilder(spec))).shape
                return await run_eval(
                    spec,
                    llm,
                    items,
                    windows,
                    args.concurrency,
                    args.permutations,
                    show_progress=True,
                    counts=None if sim is None else (lambda: sim.stats),
                    window_one=not getattr(args, "no_reference", False),
                )
            finally:
                await llm.close()

        # The spec as it is, or each variant of its model settings, one after another on
        # the same endpoint (the answer's tokens by form and reasoning: docs/performance.md).
        runs = [
            (name, asyncio.run(run(with_model(spec, changes))))
            for name, changes in (variants or [("", {})])
        ]
    if args.json:
        rows = [
            {
                **({"variant": name} if name else {}),
                "window": r.window,
                "items": r.items,
                "requests_per_item": r.per_item(r.requests),
                "prompt_tokens_per_item": r.per_item(r.prompt_tokens),
                "completion_tokens_per_item": r.per_item(r.completion_tokens),
                "cached_tokens_per_item": r.per_item(r.cached_tokens),
                "cost_per_item_usd": r.per_item(r.cost_usd),
                "answer_tokens_per_item_by_part": {
                    part: r.per_item(tokens) for part, tokens in r.answer_parts.items()
                },
                "cost_per_item_usd_by_rule": {
                    name: r.per_item(usd) for name, usd in r.cost_by_rule.items()
                },
                "agreement": r.agreement,
                "accuracy": r.accuracy,
                "unanswered": r.unanswered,
                "reasks_per_item": r.per_item(r.reasks),
                "order_changed": r.order_changed,
                "latency_p50_s": r.latency(0.5),
                "latency_p99_s": r.latency(0.99),
            }
            for name, reports in runs
            for r in reports
        ]
        print(orjson.dumps(rows).decode())
    else:
        for name, reports in runs:
            if name:
                print(f"\n## {name}\n")
            print(markdown(reports, args.file, target.model, spec.model.price_output_per_million))
            print(disagreements(reports, items))
    return 0


def model_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    """`answer=protocol+reasoning=off,reasoning=brief` -> each variant's name and its
    model settings (`+` joins the settings of one variant)."""
    out: list[tuple[str, dict[str, str]]] = []
    for variant in filter(None, (v.strip() for v in text.split(","))):
        changes: dict[str, str] = {}
        for setting in variant.split("+"):
            key, eq, value = setting.partition("=")
            if not eq or not key or not value:
                raise StreamError(f"--variants: {setting!r} is not NAME=VALUE")
            changes[key.strip()] = value.strip()
        out.append((variant, changes))
    return out


def with_model(spec: AgentSpec, changes: dict[str, str]) -> AgentSpec:
    """`spec` with its model settings changed (validated as the spec file's would be)."""
    if not changes:
        return spec
    try:
        model = type(spec.model).model_validate({**spec.model.model_dump(), **changes})
    except ValueError as exc:
        raise StreamError(f"--variants {changes}: {exc}") from exc
    return spec.model_copy(update={"model": model})
