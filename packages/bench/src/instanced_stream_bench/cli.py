"""The development commands of `stream`: the demo, the benches and the evaluation, the local
broker and schema registry, and the two model servers (the simulator and a real small
model). The product's parser finds `register` through its entry point group
(`instanced_stream.cli.parser.PLUG_INS`, declared in packages/bench/pyproject.toml), so a
deployment's wheel holds none of this."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from instanced_stream.cli.parser import window_sizes
from instanced_stream.cli.runner import secure
from instanced_stream.errors import StreamError

if TYPE_CHECKING:
    from instanced_stream.settings import Settings

__all__ = ["register"]


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Adds the development commands to `stream`'s parser, each with its handler."""
    d = add("demo", help="run everything on embedded defaults and report")
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
        "real model), tickets (stateful), seed_moderation (one decision per comment), "
        "seeds (the seeds' own moderation, advisor and manager examples)",
    )
    d.add_argument(
        "--chaos",
        type=int,
        default=0,
        metavar="N",
        help="SIGKILL the processor N times at random moments (restarting it each time), "
        "then show the audit",
    )
    b = add("broker", help="run a local Apache Kafka broker in the foreground")
    b.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    b.add_argument("--data-dir", default=None, help="keep data here (default: temporary)")
    rg = add(
        "registry",
        help="run a local Confluent-compatible schema registry in the foreground, "
        "schemas in memory",
    )
    rg.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    s = add("llm-sim", help="run the OpenAI-compatible LLM simulator")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--latency-ms", type=float, default=0.0, help="fixed latency per request")
    s.add_argument("--ms-per-token", type=float, default=0.0, help="latency per output token")
    s.add_argument("--jitter", type=float, default=0.0, help="latency varies by this share")
    s.add_argument("--max-concurrency", type=int, default=0, help="429 beyond (0: no limit)")
    s.add_argument("--tpm", type=int, default=0, help="tokens per minute, 429 beyond (0: none)")
    s.add_argument("--rpm", type=int, default=0, help="requests per minute, 429 beyond (0: none)")
    s.add_argument(
        "--provider",
        choices=["generic", "openai", "azure"],
        default="generic",
        help="follow this provider's documented request rules, errors and rate-limit headers",
    )
    lo = add("llm-local", help="serve a real local model (llama.cpp, extra `local`)")
    lo.add_argument("--host", default="127.0.0.1")
    lo.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one)")
    lo.add_argument("--model", default="smollm2", help="smollm2 (bundled) or a .gguf file")
    lo.add_argument("--parallel", type=int, default=None, help="requests at once (default 2)")
    lo.add_argument("--ctx", type=int, default=None, help="tokens, split among slots (16384)")
    lo.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: cores but one, >= 1)"
    )
    bn = add("bench", help="measure windows against the per-item baseline, one run")
    bn.add_argument("--items", type=int, default=20_000, help="items (default 20000)")
    bn.add_argument(
        "--partitions", type=int, default=None, help="input partitions (default 4; --churn 24)"
    )
    bn.add_argument(
        "--windows",
        type=window_sizes,
        default=(10, 25, 50, 100),
        help="window sizes (default 10,25,50,100)",
    )
    bn.add_argument("--latency-ms", type=float, default=500, help="endpoint fixed latency")
    bn.add_argument("--ms-per-token", type=float, default=2, help="endpoint ms per output token")
    bn.add_argument("--concurrency", type=int, default=8, help="endpoint's concurrent requests")
    bn.add_argument("--tpm", type=int, default=2_000_000, help="endpoint's tokens per minute")
    bn.add_argument("--cap-s", type=float, default=60, help="seconds per run at most")
    bn.add_argument(
        "--paced-s", type=float, default=10, help="latency phase per run (0: none; default 10)"
    )
    bn.add_argument("--scaling", action="store_true", help="also 1-2 processes x 1/4/16 partitions")
    bn.add_argument("--out", default="bench-results", help="folder for bench.md, .json, .png")
    bn.add_argument(
        "--tier",
        choices=("online", "batch"),
        default="online",
        help="batch: the baseline, each window online and in the batch tier (docs/batch.md)",
    )
    bn.add_argument(
        "--variants",
        default="",
        help="model settings also run at the largest window, comma-separated, e.g. "
        "reasoning=off,reasoning=brief,answer=protocol,answer=keyed; quality.NAME=VALUE "
        "sets the spec's quality section (quality.shadow_rate=0.02: shadowing's cost)",
    )
    bn.add_argument(
        "--duplicates",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="instead: at the largest window, the items plain, with SHARE (e.g. 0.3) copies of "
        "earlier items, and the same with dedupe on (what answering duplicates once saves)",
    )
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
    bn.add_argument(
        "--churn",
        action="store_true",
        help="instead: scale processors 1 -> 3 -> 1 twice on a changelog of --states "
        "workflow states (rebalances at size; DIR/churn.json)",
    )
    bn.add_argument(
        "--states",
        type=int,
        default=100_000,
        help="--churn: states pre-written; --timer: finished states indexed (100000)",
    )
    bn.add_argument(
        "--timer",
        action="store_true",
        help="instead: the expiry timer's index at --states finished states on --partitions "
        "(default 24), beside the index it replaced; no broker (DIR/timer.json)",
    )
    bn.add_argument(
        "--restarts",
        type=int,
        default=0,
        metavar="N",
        help="--churn: instead, a restart storm: three processors, N SIGKILLs and restarts "
        "while tickets flow (progress while running; DIR/churn.json)",
    )
    bn.add_argument(
        "--brokers",
        type=int,
        default=1,
        choices=(1, 3),
        help="--churn --restarts: 3 runs the storm on a local three-broker cluster and also "
        "kills the group's coordinator broker twice",
    )
    bn.add_argument(
        "--membership",
        default="static",
        choices=("static", "dynamic"),
        help="--churn --restarts: the processors' group membership: static (default; a "
        "stable name per member, as a StatefulSet's pods, STREAM_GROUP_INSTANCE_ID) or "
        "dynamic (a new member each start)",
    )
    bn.add_argument(
        "--init-transactions",
        action="store_true",
        help="--churn: only what a move costs in init_transactions at --partitions",
    )
    ev = add("eval", help="decisions, tokens and cost per window size, no Kafka")
    ev.add_argument("file", help="JSONL file: one item per line, optional _label")
    ev.add_argument(
        "--windows",
        type=window_sizes,
        default=(1, 10, 25, 50),
        help="window sizes (default 1,10,25,50)",
    )
    ev.add_argument("--concurrency", type=int, default=4, help="requests at once (default 4)")
    ev.add_argument("--limit", type=int, default=0, help="only the first N items")
    ev.add_argument("--json", action="store_true", help="one JSON array instead of the table")
    ev.add_argument(
        "--permutations",
        type=int,
        default=0,
        metavar="K",
        help="ask each window above 1 K more times with the items shuffled and report how "
        "often a decision changes with the order (default 0: not measured)",
    )
    ev.add_argument(
        "--no-reference",
        action="store_true",
        help="only the --windows asked, without window 1 (agreement is then against the "
        "first of them): for a slow local model, whose window 1 is a request per item",
    )
    ev.add_argument(
        "--variants",
        default="",
        help="model settings each run instead of the spec as it is, comma-separated; + joins "
        "the settings of one variant, e.g. answer=protocol+reasoning=off,reasoning=brief",
    )
    ev.add_argument(
        "--llm",
        default=None,
        help="simulator, local (a real small model via llama.cpp) or an endpoint URL "
        "(default: the configured endpoint, else the simulator)",
    )
    d.set_defaults(handler=_demo)
    b.set_defaults(handler=_broker)
    rg.set_defaults(handler=_registry)
    s.set_defaults(handler=_llm_sim)
    lo.set_defaults(handler=_llm_local)
    bn.set_defaults(handler=_bench)
    ev.set_defaults(handler=_eval)


def _broker(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream_bench.testing.broker import run_foreground

    return run_foreground(args.port, Path(args.data_dir) if args.data_dir else None)


def _registry(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream_bench.testing.schema_registry import run_foreground

    return run_foreground(args.port)


def _llm_sim(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream_bench.testing.sim.server import SimConfig, serve_forever

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
    from instanced_stream_bench.testing.local_model import (
        DEFAULT_CTX,
        DEFAULT_PARALLEL,
        run_foreground,
    )

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

    from instanced_stream_bench.harness.demo import run_demo

    secure(settings)  # a configured broker may need TLS or SASL

    if args.example == "seeds":
        from instanced_stream_bench.harness.seeds import run_seeds

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
    from instanced_stream_bench.commands import bench

    return bench(args, settings)


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from instanced_stream_bench.commands import evaluate

    return evaluate(args, settings)
