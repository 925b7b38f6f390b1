"""The `stream` command. User mistakes end in one clear line and a non-zero exit code,
not a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError

from instanced_stream.errors import KafkaUnreachable, StreamError
from instanced_stream.ops.parser import SETTING_FLAGS, build_parser
from instanced_stream.ops.termination import TERMINATED_EXIT, Terminated, unwind_on_sigterm

if TYPE_CHECKING:
    from instanced_stream.core.spec import AgentSpec
    from instanced_stream.settings import Settings

__all__ = ["main"]


def _configured(settings: Settings) -> tuple[AgentSpec, str]:
    """The validated spec and the broker address, or a clear error."""
    from instanced_stream.core.spec import load_spec

    spec = load_spec(settings.spec)
    if not settings.bootstrap_servers:
        raise StreamError("no broker: set STREAM_BOOTSTRAP_SERVERS (or run `stream broker`)")
    _secure(settings)
    return spec, settings.bootstrap_servers


def _secure(settings: Settings) -> None:
    """Files the Kafka security settings under the configured broker address."""
    from instanced_stream.runtime.clients import register_producer
    from instanced_stream.runtime.security import client_options, register

    if settings.bootstrap_servers:
        register(settings.bootstrap_servers, client_options(settings))
        register_producer(settings.bootstrap_servers, settings.kafka_compression)


def _process(_: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.check import preflight
    from instanced_stream.runtime.service import run_processor

    spec, bootstrap = _configured(settings)
    preflight(settings, spec)  # what `stream check` refuses, refused here the same way
    return run_processor(settings, spec, bootstrap)


def _activities(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.activities.worker import load_activities, serve_forever, spec_of_handlers

    overrides = {"worker_concurrency": args.concurrency, "worker_web_port": args.port}
    chosen = {k: v for k, v in overrides.items() if v is not None}
    if chosen:
        settings = settings.model_copy(update=chosen)
    registry = load_activities(args.module)
    if not args.no_spec:
        spec, bootstrap = _configured(settings)
        return serve_forever(registry, settings, spec, bootstrap, args.group)
    if not args.group:
        raise StreamError("--no-spec needs --group: name your team's consumer group")
    if not settings.bootstrap_servers:
        raise StreamError("no broker: set STREAM_BOOTSTRAP_SERVERS")
    _secure(settings)
    spec = spec_of_handlers(registry)
    return serve_forever(registry, settings, spec, settings.bootstrap_servers, args.group)


def _broker(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.testing.broker import run_foreground

    return run_foreground(args.port, Path(args.data_dir) if args.data_dir else None)


def _llm_sim(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.testing.simulator import SimConfig, serve_forever

    config = SimConfig(
        latency_ms=args.latency_ms,
        per_output_token_ms=args.ms_per_token,
        jitter=args.jitter,
        max_concurrency=args.max_concurrency,
        tokens_per_minute=args.tpm,
        requests_per_minute=args.rpm,
        provider=args.provider,
    )
    return serve_forever(config, args.host, args.port)


def _llm_local(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.llm.local import DEFAULT_CTX, DEFAULT_PARALLEL, run_foreground

    return run_foreground(
        args.model,
        args.host,
        args.port,
        args.parallel or DEFAULT_PARALLEL,
        args.ctx or DEFAULT_CTX,
        args.threads,
        verbose=args.verbose,
    )


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.settings import EXAMPLES
    from instanced_stream.tools.demo import run_demo

    _secure(settings)  # a configured broker may need TLS or SASL

    if args.example == "seeds":
        from instanced_stream.tools.seeds import run_seeds

        return run_seeds(args.json, timeout=args.timeout, llm=args.llm)
    # A real model on this machine writes ~30 tokens/s: the seeds' short example suits it.
    example = args.example or ("moderation" if args.llm == "simulator" else "seed_moderation")
    if not (EXAMPLES / example).is_dir():
        # name what is there, so the message never offers the very name that was missing
        there = sorted(p.name for p in EXAMPLES.glob("*/") if any(p.glob("*.yaml")))
        if not there:
            raise StreamError(f"no examples are installed (looked in {EXAMPLES})")
        raise StreamError(f"no example named {example!r}; there are: {', '.join(there)}")
    return run_demo(
        args.items,
        args.json,
        timeout=args.timeout,
        latency_ms=args.latency_ms,
        example=example,
        llm=args.llm,
        chaos=args.chaos,
        settings=settings,
    )


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.tools.commands import bench

    return bench(args, settings)


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.tools.commands import evaluate

    return evaluate(args, settings)


def _schemas(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.asyncapi import render_asyncapi
    from instanced_stream.ops.schemas import write_schemas

    for path in write_schemas(Path(args.out)):
        print(path)
    Path(args.asyncapi).write_bytes(render_asyncapi())
    print(args.asyncapi)
    return 0


async def _page_quality(url: str) -> dict[str, Any] | None:
    """A processor page's shadow-sample figures, or None when it does not answer."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + "/api/live") as resp,
        ):
            live = await resp.json()
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
        return None
    quality = live.get("quality") if isinstance(live, dict) else None
    return quality if isinstance(quality, dict) else None


def _audit(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.agreement import quality_line
    from instanced_stream.ops.audit import audit, parse_since
    from instanced_stream.ops.workflow_audit import audit_workflows
    from instanced_stream.runtime.topics import activity_topics

    spec, bootstrap = _configured(settings)
    since = parse_since(args.since) if args.since else None
    report = asyncio.run(
        audit(bootstrap, settings.topics, activity_topics(settings, spec), since=since)
    )
    flows = None
    if spec.plan is not None:  # workflows: done, dead-lettered, or pending and why
        flows = asyncio.run(audit_workflows(bootstrap, settings))
    pages = args.processor or [f"http://127.0.0.1:{settings.web_port}"]
    quality = {url: asyncio.run(_page_quality(url)) for url in pages}
    if args.json:
        out = report.model_dump() | ({"workflows": flows.model_dump()} if flows else {})
        out |= {"quality": quality}
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(report.summary())
        for topic, partition, offset in report.missing[:20]:
            print(f"missing: {topic}/{partition}/{offset}")
        if flows is not None:
            print("workflows:", orjson.dumps(flows.summary()).decode())
            for p in flows.pending[:20]:
                print(f"pending: {p.instance} {p.status} for {p.age_s}s: {p.reason}")
        for url, got in quality.items():
            print(quality_line(got) if got else f"quality: no processor page answered at {url}")
    return 0 if not report.missing and not report.unexpected else 1


def _advice(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.core.advice import render
    from instanced_stream.runtime.topics import read_json

    _, bootstrap = _configured(settings)
    records = asyncio.run(read_json(bootstrap, settings.topics.advice))
    if args.divergent:
        records = [r for r in records if r.get("divergent") or r.get("reviewed")]
    records = records[-args.last :]
    if not records:
        print("no advice records yet", file=sys.stderr)
        return 0
    print(render(records, colour=sys.stdout.isatty()))
    return 0


def _approve(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.approvals import approve, pending_now

    _, bootstrap = _configured(settings)
    if args.list:
        for p in asyncio.run(pending_now(settings, bootstrap)):
            shown = {k: p.get(k) for k in ("instance", "proposal_id", "turn", "calls")}
            print(orjson.dumps(shown).decode())
        return 0
    done = approve(settings, bootstrap, args.instance, args.batch, args.reject)
    print(f"{'rejected' if args.reject is not None else 'approved'}: {', '.join(done)}")
    return 0


def _produce(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.console import produce, resolve_topic

    _, bootstrap = _configured(settings)
    topic = resolve_topic(settings, args.topic) if args.topic else settings.topics.input
    report = asyncio.run(
        produce(bootstrap, topic, Path(args.file), key_field=args.key_field, rate=args.rate)
    )
    return 1 if report.invalid else 0


def _tail(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.console import resolve_topic, tail

    _, bootstrap = _configured(settings)
    topic = resolve_topic(settings, args.topic)
    with contextlib.suppress(KeyboardInterrupt):
        shown = asyncio.run(tail(bootstrap, topic, args.follow, args.last, args.json))
        if not shown and not args.follow:
            print(f"no records on {topic}", file=sys.stderr)
    return 0


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.console import render_topics, topics

    spec, bootstrap = _configured(settings)
    rows = asyncio.run(topics(bootstrap, settings, spec, args.create, args.partitions))
    print(render_topics(rows))
    return 0


def _check(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.check import check

    for line in check(settings, endpoint=args.endpoint):
        print(line)
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "demo": _demo,
    "process": _process,
    "activities": _activities,
    "check": _check,
    "broker": _broker,
    "llm-sim": _llm_sim,
    "llm-local": _llm_local,
    "bench": _bench,
    "eval": _eval,
    "schemas": _schemas,
    "advice": _advice,
    "produce": _produce,
    "tail": _tail,
    "topics": _topics,
    "approve": _approve,
    "audit": _audit,
}

# They print their own summaries; library start-up chatter (a new topic's leader
# election, group coordinator discovery) is retried noise there.
_QUIET = ("demo", "produce", "tail", "topics", "audit", "bench", "eval", "check")


def _settings(args: argparse.Namespace) -> Settings:
    """The one Settings object of this run: flags win over STREAM_* variables, which win
    over a .env file. Every command gets it explicitly; nothing writes os.environ."""
    from instanced_stream.settings import Settings

    flags = {name: getattr(args, name) for name in SETTING_FLAGS}
    if args.log_level:
        flags["log_level"] = args.log_level
    return Settings(**{k: v for k, v in flags.items() if v is not None})


def _logging(args: argparse.Namespace, settings: Settings) -> None:
    quiet = args.command in _QUIET and not args.verbose
    level = args.log_level or ("WARNING" if quiet else settings.log_level)
    if settings.log_format == "json":
        from instanced_stream.ops.logs import json_handler

        logging.basicConfig(level=level, handlers=[json_handler()])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if quiet and not args.log_level:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = None
    unwind_on_sigterm()
    try:
        settings = _settings(args)
        _logging(args, settings)
        from instanced_stream.settings import warn_unknown_variables

        warn_unknown_variables(os.environ)
        return int(_COMMANDS[args.command](args, settings))
    except KafkaUnreachable as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 3
    except StreamError as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 2
    except KafkaConnectionError:
        where = settings.bootstrap_servers if settings else None
        print(f"stream: error: cannot reach Kafka at {where or 'the address'}", file=sys.stderr)
        return 3
    except ValidationError as exc:
        from instanced_stream.settings import setting_problem

        print(f"stream: error: {setting_problem(exc)}", file=sys.stderr)
        return 2
    except Terminated:
        return TERMINATED_EXIT
    except KeyboardInterrupt:
        return 130
