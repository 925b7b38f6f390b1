"""The `stream` command. User mistakes end in one clear line and a non-zero exit code,
not a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError

from stream.errors import KafkaUnreachable, StreamError

if TYPE_CHECKING:
    from stream.core.spec import AgentSpec
    from stream.settings import Settings

__all__ = ["main"]


def _configured() -> tuple[Settings, AgentSpec, str]:
    """Settings, the validated spec, and the broker address, or a clear error."""
    from stream.core.spec import load_spec
    from stream.settings import Settings

    settings = Settings()
    spec = load_spec(settings.spec)
    if not settings.bootstrap_servers:
        raise StreamError("no broker: set STREAM_BOOTSTRAP_SERVERS (or run `stream broker`)")
    _secure(settings)
    return settings, spec, settings.bootstrap_servers


def _secure(settings: Settings) -> None:
    """Files the Kafka security settings under the configured broker address."""
    from stream.runtime.security import client_options, register

    if settings.bootstrap_servers:
        register(settings.bootstrap_servers, client_options(settings))


def _process(_: argparse.Namespace) -> int:
    from stream.runtime.app import run_processor

    settings, spec, bootstrap = _configured()
    return run_processor(settings, spec, bootstrap)


def _activities(args: argparse.Namespace) -> int:
    from stream.activities.worker import load_activities

    settings, spec, bootstrap = _configured()
    registry = load_activities(args.module)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(registry.run(settings, spec, bootstrap, serve=True))
    return 0


def _broker(args: argparse.Namespace) -> int:
    from stream.testing.broker import run_foreground

    return run_foreground(args.port, Path(args.data_dir) if args.data_dir else None)


def _llm_sim(args: argparse.Namespace) -> int:
    from stream.testing.simulator import SimConfig, serve_forever

    config = SimConfig(
        latency_ms=args.latency_ms,
        per_output_token_ms=args.ms_per_token,
        jitter=args.jitter,
        max_concurrency=args.max_concurrency,
        tokens_per_minute=args.tpm,
    )
    return serve_forever(config, args.host, args.port)


def _llm_local(args: argparse.Namespace) -> int:
    from stream.llm.local import DEFAULT_CTX, DEFAULT_PARALLEL, run_foreground

    return run_foreground(
        args.model,
        args.host,
        args.port,
        args.parallel or DEFAULT_PARALLEL,
        args.ctx or DEFAULT_CTX,
        args.threads,
        verbose=args.verbose,
    )


def _demo(args: argparse.Namespace) -> int:
    from stream.settings import EXAMPLES, Settings
    from stream.tools.demo import run_demo

    _secure(Settings())  # a configured broker may need TLS or SASL

    # A real model on this machine writes ~30 tokens/s: the seeds' short example suits it.
    example = args.example or ("moderation" if args.llm == "simulator" else "seed_moderation")
    if not (EXAMPLES / example).is_dir():
        raise StreamError(f"no example named {example!r} (try moderation or tickets)")
    return run_demo(
        args.items,
        args.json,
        timeout=args.timeout,
        latency_ms=args.latency_ms,
        example=example,
        llm=args.llm,
        chaos=args.chaos,
    )


def _bench(args: argparse.Namespace) -> int:
    from stream.tools.commands import bench

    return bench(args)


def _eval(args: argparse.Namespace) -> int:
    from stream.tools.commands import evaluate

    return evaluate(args)


def _schemas(args: argparse.Namespace) -> int:
    from stream.ops.schemas import write_schemas

    for path in write_schemas(Path(args.out)):
        print(path)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from stream.core.prompt import PromptBuilder
    from stream.ops.audit import audit
    from stream.ops.workflow_audit import audit_workflows
    from stream.runtime.topics import activity_topics

    settings, spec, bootstrap = _configured()
    report = asyncio.run(audit(bootstrap, settings.topics, activity_topics(settings, spec)))
    flows = None
    if PromptBuilder(spec).stateful:  # workflows: done, dead-lettered, or pending and why
        flows = asyncio.run(audit_workflows(bootstrap, settings))
    if args.json:
        out = report.model_dump() | ({"workflows": flows.model_dump()} if flows else {})
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(report.summary())
        for topic, partition, offset in report.missing[:20]:
            print(f"missing: {topic}/{partition}/{offset}")
        if flows is not None:
            print("workflows:", orjson.dumps(flows.summary()).decode())
            for p in flows.pending[:20]:
                print(f"pending: {p.instance} {p.status} for {p.age_s}s: {p.reason}")
    return 0 if not report.missing and not report.unexpected else 1


def _advice(args: argparse.Namespace) -> int:
    from stream.core.advice import render
    from stream.runtime.topics import read_json

    settings, _, bootstrap = _configured()
    records = asyncio.run(read_json(bootstrap, settings.topics.advice))
    if args.divergent:
        records = [r for r in records if r.get("divergent") or r.get("reviewed")]
    records = records[-args.last :]
    if not records:
        print("no advice records yet", file=sys.stderr)
        return 0
    print(render(records, colour=sys.stdout.isatty()))
    return 0


def _approve(args: argparse.Namespace) -> int:
    from stream.ops.approvals import approve

    settings, _, bootstrap = _configured()
    done = approve(settings, bootstrap, args.instance, args.batch, args.reject)
    print(f"{'rejected' if args.reject is not None else 'approved'}: {', '.join(done)}")
    return 0


def _produce(args: argparse.Namespace) -> int:
    from stream.ops.console import produce, resolve_topic

    settings, _, bootstrap = _configured()
    topic = resolve_topic(settings, args.topic) if args.topic else settings.topics.input
    report = asyncio.run(
        produce(bootstrap, topic, Path(args.file), key_field=args.key_field, rate=args.rate)
    )
    return 1 if report.invalid else 0


def _tail(args: argparse.Namespace) -> int:
    from stream.ops.console import resolve_topic, tail

    settings, _, bootstrap = _configured()
    topic = resolve_topic(settings, args.topic)
    with contextlib.suppress(KeyboardInterrupt):
        shown = asyncio.run(tail(bootstrap, topic, args.follow, args.last, args.json))
        if not shown and not args.follow:
            print(f"no records on {topic}", file=sys.stderr)
    return 0


def _topics(args: argparse.Namespace) -> int:
    from stream.ops.console import render_topics, topics

    settings, spec, bootstrap = _configured()
    rows = asyncio.run(topics(bootstrap, settings, spec, args.create, args.partitions))
    print(render_topics(rows))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stream",
        description="Batched, multi-instance LLM decisions on a Kafka stream. Settings come "
        "from STREAM_* environment variables or a .env file (see README).",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    # Flags win over the environment, which wins over a .env file.
    p.add_argument("--bootstrap-servers", help="Kafka address (STREAM_BOOTSTRAP_SERVERS)")
    p.add_argument("--topic-prefix", help="prefix of every topic (STREAM_TOPIC_PREFIX)")
    p.add_argument("--spec", help="agent spec file (STREAM_SPEC)")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run everything on embedded defaults and report")
    d.add_argument("--items", type=int, default=300, help="items to publish (default 300)")
    d.add_argument("--json", action="store_true", help="print one JSON object as last line")
    d.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for outcomes (default 180; 900 with a real model)",
    )
    d.add_argument("--latency-ms", type=float, default=50, help="simulated LLM latency")
    d.add_argument(
        "--llm",
        default="simulator",
        help="simulator (default), local (a real small model via llama.cpp), or an endpoint URL",
    )
    d.add_argument(
        "--example",
        default=None,
        help="which example under examples/: moderation (default; seed_moderation with a "
        "real model), tickets (stateful), seed_moderation (one decision per comment)",
    )
    d.add_argument(
        "--chaos",
        type=int,
        default=0,
        metavar="N",
        help="SIGKILL the processor N times at random moments (restarting it each time), "
        "then show the audit",
    )
    d.set_defaults(fn=_demo)
    sub.add_parser("process", help="run a processor (consumer group member)").set_defaults(
        fn=_process
    )
    a = sub.add_parser("activities", help="run an activity worker for a handler module")
    a.add_argument("module", help="a module name or .py file defining an Activities registry")
    a.set_defaults(fn=_activities)
    b = sub.add_parser("broker", help="run a local Apache Kafka broker in the foreground")
    b.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    b.add_argument("--data-dir", default=None, help="keep data here (default: temporary)")
    b.set_defaults(fn=_broker)
    s = sub.add_parser("llm-sim", help="run the OpenAI-compatible LLM simulator")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--latency-ms", type=float, default=0.0, help="fixed latency per request")
    s.add_argument("--ms-per-token", type=float, default=0.0, help="latency per output token")
    s.add_argument("--jitter", type=float, default=0.0, help="latency varies by this share")
    s.add_argument("--max-concurrency", type=int, default=0, help="429 beyond (0: no limit)")
    s.add_argument("--tpm", type=int, default=0, help="tokens per minute, 429 beyond (0: none)")
    s.set_defaults(fn=_llm_sim)
    lo = sub.add_parser("llm-local", help="serve a real local model (llama.cpp, extra `local`)")
    lo.add_argument("--host", default="127.0.0.1")
    lo.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one)")
    lo.add_argument("--model", default="smollm2", help="smollm2 (bundled) or a .gguf file")
    lo.add_argument("--parallel", type=int, default=None, help="requests at once (default 2)")
    lo.add_argument("--ctx", type=int, default=None, help="tokens, split among slots (16384)")
    lo.add_argument("--threads", type=int, default=None, help="CPU threads (default: cores)")
    lo.set_defaults(fn=_llm_local)
    bn = sub.add_parser("bench", help="measure windows against the per-item baseline, one run")
    bn.add_argument("--items", type=int, default=20_000, help="items (default 20000)")
    bn.add_argument("--partitions", type=int, default=4, help="input partitions (default 4)")
    bn.add_argument("--windows", default="10,25,50,100", help="window sizes (default 10,25,50,100)")
    bn.add_argument("--latency-ms", type=float, default=500, help="endpoint fixed latency")
    bn.add_argument("--ms-per-token", type=float, default=2, help="endpoint ms per output token")
    bn.add_argument("--concurrency", type=int, default=8, help="endpoint's concurrent requests")
    bn.add_argument("--tpm", type=int, default=2_000_000, help="endpoint's tokens per minute")
    bn.add_argument("--cap-s", type=float, default=60, help="seconds per run at most")
    bn.add_argument("--scaling", action="store_true", help="also 1-2 processes x 1/4/16 partitions")
    bn.add_argument("--out", default="bench-results", help="folder for bench.md, .json, .png")
    bn.add_argument(
        "--soak", type=float, default=0, metavar="SECONDS", help="instead: a steady-load soak run"
    )
    bn.add_argument("--rate", type=float, default=None, help="soak: items/s (default: half)")
    bn.add_argument(
        "--llm",
        default="simulator",
        help="simulator (default, shaped by the flags above), local (a real small model via "
        "llama.cpp) or an endpoint URL",
    )
    bn.add_argument("--endpoint", default=None, metavar="URL", help="same as --llm URL")
    bn.set_defaults(fn=_bench)
    ev = sub.add_parser("eval", help="decisions, tokens and cost per window size, no Kafka")
    ev.add_argument("file", help="JSONL file: one item per line, optional _label")
    ev.add_argument("--windows", default="1,10,25,50", help="window sizes (default 1,10,25,50)")
    ev.add_argument("--concurrency", type=int, default=4, help="requests at once (default 4)")
    ev.add_argument("--limit", type=int, default=0, help="only the first N items")
    ev.add_argument("--json", action="store_true", help="one JSON array instead of the table")
    ev.add_argument(
        "--llm",
        default=None,
        help="simulator, local (a real small model via llama.cpp) or an endpoint URL "
        "(default: the configured endpoint, else the simulator)",
    )
    ev.set_defaults(fn=_eval)
    c = sub.add_parser("schemas", help="write the JSON Schemas of every message contract")
    c.add_argument("--out", default="schemas", help="folder (default: schemas)")
    c.set_defaults(fn=_schemas)
    v = sub.add_parser("advice", help="recent decisions with their advisors' votes")
    v.add_argument("--last", type=int, default=20, help="how many (default 20)")
    v.add_argument("--divergent", action="store_true", help="only divergent or held calls")
    v.set_defaults(fn=_advice)
    pr = sub.add_parser("produce", help="publish a JSONL file, one item per line")
    pr.add_argument("file", help="JSONL file: one JSON object per line")
    pr.add_argument(
        "--key-field", default="_instance", help="field holding the record key (default _instance)"
    )
    pr.add_argument("--rate", type=float, default=None, help="records per second (default: all)")
    pr.add_argument("--topic", default=None, help="topic or short name (default: the input)")
    pr.set_defaults(fn=_produce)
    tl = sub.add_parser("tail", help="print a topic's last records, oldest first")
    tl.add_argument("topic", help="topic or short name: items, deadletter, done, activity.<tool>")
    tl.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    tl.add_argument("--last", type=int, default=20, help="how many (default 20)")
    tl.add_argument("--json", action="store_true", help="one JSON object per record")
    tl.set_defaults(fn=_tail)
    tp = sub.add_parser("topics", help="the product's topics, sizes and the processors' lag")
    tp.add_argument("--create", action="store_true", help="create the missing topics first")
    tp.add_argument("--partitions", type=int, default=None, help="partitions of created topics")
    tp.set_defaults(fn=_topics)
    ap = sub.add_parser("approve", help="approve (or reject) lazy-plan proposals")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--instance", action="append", help="an instance id (repeatable)")
    who.add_argument("--batch", help="every proposal of this batch id")
    ap.add_argument("--reject", metavar="REASON", help="reject instead, with this reason")
    ap.set_defaults(fn=_approve)
    au = sub.add_parser("audit", help="check that every input item has an outcome")
    au.add_argument("--json", action="store_true", help="the whole report as JSON")
    au.set_defaults(fn=_audit)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for flag, var in (
        ("bootstrap_servers", "STREAM_BOOTSTRAP_SERVERS"),
        ("topic_prefix", "STREAM_TOPIC_PREFIX"),
        ("spec", "STREAM_SPEC"),
    ):
        if getattr(args, flag) is not None:
            os.environ[var] = getattr(args, flag)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet = ("demo", "produce", "tail", "topics", "audit", "bench", "eval")
    if args.command in quiet and not args.verbose:
        # The demo prints its own summary; the client libraries' start-up chatter (a new
        # topic's leader election, group coordinator discovery) is retried noise there.
        logging.getLogger().setLevel(logging.WARNING)
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        return int(args.fn(args))
    except KafkaUnreachable as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 3
    except StreamError as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 2
    except KafkaConnectionError:
        where = os.environ.get("STREAM_BOOTSTRAP_SERVERS", "the configured address")
        print(f"stream: error: cannot reach Kafka at {where}", file=sys.stderr)
        return 3
    except ValidationError as exc:
        print(
            f"stream: error: bad setting: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
