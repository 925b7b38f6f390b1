"""The `stream` command. User mistakes end in one clear line and a non-zero exit code,
not a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from instanced_stream.cli.activities import activities
from instanced_stream.cli.parser import build_parser
from instanced_stream.cli.runner import Command, configured, run
from instanced_stream.errors import StreamError
from instanced_stream.termination import stop_if_asked

if TYPE_CHECKING:
    from instanced_stream.settings import Settings

__all__ = ["main"]


def _process(_: argparse.Namespace, settings: Settings) -> int:
    # imported inside: loading the runtime is a good part of the start
    from instanced_stream.ops.check import preflight
    from instanced_stream.runtime.service import run_processor

    # Still in the deferred mode of the start (`termination`): a SIGTERM from here until
    # the service's own handlers take over (probe, topics, context) is a clean stop at
    # the next safe point; nothing was consumed or committed.
    stop_if_asked()
    spec, bootstrap = configured(settings)
    preflight(settings, spec)  # what `stream check` refuses, refused here the same way
    stop_if_asked()
    return run_processor(settings, spec, bootstrap)


def _schemas(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.asyncapi import render_asyncapi
    from instanced_stream.ops.schemas import write_schemas

    if args.register:
        return _register(settings, force=args.force)
    for path in write_schemas(Path(args.out)):
        print(path)
    Path(args.asyncapi).write_bytes(render_asyncapi())
    print(args.asyncapi)
    return 0


def _register(settings: Settings, *, force: bool) -> int:
    """`stream schemas --register`: what `stream process` registers at start with
    STREAM_SCHEMA_REGISTRY_OUTPUTS, done ahead (by a deploy job, say)."""
    from instanced_stream.core.spec import load_spec
    from instanced_stream.core.subjects import subject_of
    from instanced_stream.core.wire import schema_id
    from instanced_stream.kafka.schemas import output_frames

    spec = load_spec(settings.spec)
    on = settings.model_copy(update={"schema_registry_outputs": True})
    frames = output_frames(on, spec, force=force or settings.schema_registry_force)
    for topic, frame in frames.items():
        print(f"{subject_of(topic)}\tid {schema_id(frame + b'{}')}")
    return 0


async def _page_quality(url: str, part: str = "quality") -> dict[str, Any] | None:
    """A part of a processor page's live figures (the shadow sample's, the budget's), or
    None when it does not answer."""
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
    found = live.get(part) if isinstance(live, dict) else None
    return found if isinstance(found, dict) else None


def _audit(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.kafka.topics import activity_topics
    from instanced_stream.observe.agreement import quality_line
    from instanced_stream.ops.audit import audit, parse_since
    from instanced_stream.ops.console import require_topics
    from instanced_stream.ops.workflow_audit import audit_workflows

    spec, bootstrap = configured(settings)
    since = parse_since(args.since) if args.since else None
    t = settings.topics
    looked_for = [t.input, *activity_topics(settings, spec), t.review, t.no_action, t.dead_letter]
    # a prefix that matches nothing would read as "nothing missing" and pass; the input
    # must be there, an outcome topic nothing was written to may not be (the review topic)
    asyncio.run(require_topics(bootstrap, t.prefix, looked_for, needed=[t.input]))
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


def _redrive(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.audit import parse_since
    from instanced_stream.ops.console import require_topics
    from instanced_stream.ops.redrive import WORTH, redrive

    _, bootstrap = configured(settings)
    t = settings.topics
    asyncio.run(require_topics(bootstrap, t.prefix, [t.input, t.dead_letter]))
    since = parse_since(args.since) if args.since else None
    codes = tuple(args.code or WORTH)
    planned, others = asyncio.run(
        redrive(bootstrap, settings.topics, codes, since, args.dry_run, args.max_redrives)
    )
    for item in planned:
        line = item.line()
        if args.json:
            print(orjson.dumps(line).decode())
        else:
            what = "would re-drive" if args.dry_run and item.skipped is None else "re-driven"
            said = f"skipped ({item.skipped})" if item.skipped else what
            print(f"{line['dead_letter']} {item.code} {line['source']}: {said}")
    sent = sum(item.skipped is None for item in planned)
    verb = "would send" if args.dry_run else "sent"
    print(f"redrive: {verb} {sent}, skipped {len(planned) - sent} (codes {', '.join(codes)})")
    if others:
        print(f"redrive: left out {sum(others.values())} dead letters: {_left_out(others)}")
    return 0


def _left_out(others: dict[str, int]) -> str:
    """Why each kind of dead letter was not considered, and how to include it."""
    parts = []
    calls = others.pop("call", 0)
    if others:
        counted = ", ".join(f"{code} {n}" for code, n in others.items())
        parts.append(
            f"{counted} (codes that fail the same way until something changes; after fixing "
            "the cause, name them with --code)"
        )
    if calls:
        parts.append(
            f"{calls} of calls, not items (a call the model got wrong, its item asked "
            "again; a handler that gave up, its item decided): re-driving an item would "
            "decide it again"
        )
    return "; ".join(parts)


def _advice(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.core.advice import render
    from instanced_stream.kafka.topics import read_json

    _, bootstrap = configured(settings)
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

    _, bootstrap = configured(settings)
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

    _, bootstrap = configured(settings)
    topic = resolve_topic(settings, args.topic) if args.topic else settings.topics.input
    report = asyncio.run(
        produce(bootstrap, topic, Path(args.file), key_field=args.key_field, rate=args.rate)
    )
    return 1 if report.invalid else 0


def _tail(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.console import require_topics, resolve_topic
    from instanced_stream.ops.tail import tail

    _, bootstrap = configured(settings)
    topic = resolve_topic(settings, args.topic)
    asyncio.run(require_topics(bootstrap, settings.topic_prefix, [topic]))
    with contextlib.suppress(KeyboardInterrupt):
        shown = asyncio.run(tail(bootstrap, topic, args.follow, args.last, args.json))
        if not shown and not args.follow:
            print(f"no records on {topic}", file=sys.stderr)
    return 0


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.console import absent_topics, budget_line, render_topics, topics

    spec, bootstrap = configured(settings)
    rows = asyncio.run(topics(bootstrap, settings, spec, args.create, args.partitions))
    print(render_topics(rows))
    missing = [r.name for r in rows if r.partitions == 0]
    # No input topic: no processor ran with this prefix (a typo, another cluster). Other
    # topics may be missing by design (no plan, no changelog); the table says which.
    if settings.topics.input in missing:
        raise StreamError(absent_topics(settings.topic_prefix, [r.name for r in rows], missing))
    if spec.budget.usd_per_s is not None:  # this host's processor's share of the ceiling
        page = f"http://127.0.0.1:{settings.web_port}"
        print(budget_line(asyncio.run(_page_quality(page, "budget")), page))
    return 0


def _check(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.check import check

    for line in check(settings, endpoint=args.endpoint, kafka=args.kafka, registry=args.registry):
        print(line)
    return 0


def _process_idea(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream.ops.idea_process import instance_standing, read_ideas, render

    _, bootstrap = configured(settings)
    if args.instance:
        standing = asyncio.run(instance_standing(bootstrap, settings, args.instance))
        if standing is None:
            print(f"no state of instance {args.instance!r} on the changelog", file=sys.stderr)
            return 1
        print(orjson.dumps(standing, option=orjson.OPT_INDENT_2).decode())
        return 0
    ideas = asyncio.run(read_ideas(bootstrap, settings))
    if args.json:
        print(
            orjson.dumps(
                [i.model_dump(mode="json") for i in ideas], option=orjson.OPT_INDENT_2
            ).decode()
        )
    else:
        print(
            "\n".join(render(i) for i in ideas)
            or "no Idea Process recorded (a spec with a plan writes one)"
        )
    return 0


_COMMANDS: dict[str, Command] = {
    "process": _process,
    "activities": activities,
    "check": _check,
    "schemas": _schemas,
    "advice": _advice,
    "produce": _produce,
    "tail": _tail,
    "topics": _topics,
    "approve": _approve,
    "audit": _audit,
    "redrive": _redrive,
    "process-idea": _process_idea,
}


def _absent(args: argparse.Namespace, settings: Settings) -> int:
    raise StreamError(
        f"`stream {args.command}` comes with the development distribution "
        "(instanced-stream-bench), which is not installed here: from a checkout, "
        "`pip install ./packages/bench` (./dev installs it)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # a command of a distribution not installed here: whatever its flags, say so
    known, _ = parser.parse_known_args(argv)
    if getattr(known, "absent", False):
        return run(known, {known.command: _absent})
    args = parser.parse_args(argv)
    return run(args, {**_COMMANDS, **({args.command: args.handler} if args.handler else {})})
