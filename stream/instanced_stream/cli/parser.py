"""The `stream` command line: every sub-command and its flags. Parsing only; what each
command does lives in stream/instanced_stream/cli/main.py and the modules it dispatches to."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from instanced_stream import __version__

__all__ = ["SETTING_FLAGS", "build_parser", "window_sizes"]

# Global flags that are settings: they win over STREAM_* variables and the .env file.
SETTING_FLAGS = ("bootstrap_servers", "topic_prefix", "spec")


class _OneLineParser(argparse.ArgumentParser):
    """A usage mistake ends in one line, like every other mistake (argparse's own error
    prints the whole usage first); sub-commands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def window_sizes(text: str) -> tuple[int, ...]:
    """`--windows 1,10,25`: positive whole numbers, comma-separated."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of window sizes, e.g. 1,10,25"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"window sizes are 1 or more, got {text!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="stream",
        description="Batched, multi-instance LLM decisions on a Kafka stream. Settings come "
        "from STREAM_* environment variables or a .env file (see docs/settings.md).",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # Flags win over the environment, which wins over a .env file.
    p.add_argument("--bootstrap-servers", help="Kafka address (STREAM_BOOTSTRAP_SERVERS)")
    p.add_argument("--topic-prefix", help="prefix of every topic (STREAM_TOPIC_PREFIX)")
    p.add_argument("--spec", help="agent spec file (STREAM_SPEC)")
    sub = p.add_subparsers(dest="command", required=True)
    common = _OneLineParser(add_help=False)
    # The setting flags work after the command too (`stream check --spec F`); SUPPRESS
    # keeps a flag given before the command when it is not repeated after it.
    for flag, text in (
        ("--bootstrap-servers", "Kafka address (STREAM_BOOTSTRAP_SERVERS)"),
        ("--topic-prefix", "prefix of every topic (STREAM_TOPIC_PREFIX)"),
        ("--spec", "agent spec file (STREAM_SPEC)"),
    ):
        common.add_argument(flag, default=argparse.SUPPRESS, help=text)
    common.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default=None,
        help="this command's log level (default: STREAM_LOG_LEVEL; quiet commands WARNING)",
    )

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

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
    add("process", help="run a processor (consumer group member)")
    a = add("activities", help="run an activity worker for a handler module")
    a.add_argument("module", help="a module name or .py file defining an Activities registry")
    a.add_argument(
        "--group",
        default=None,
        help="consumer group (default <prefix>activities.<spec name>); one per team and tool",
    )
    a.add_argument(
        "--concurrency", type=int, default=None, help="handlers at once (STREAM_WORKER_CONCURRENCY)"
    )
    a.add_argument(
        "--port", type=int, default=None, help="probes and metrics (STREAM_WORKER_WEB_PORT, 6067)"
    )
    a.add_argument(
        "--no-spec",
        action="store_true",
        help="without the processor's agent spec: consume activity.<handler name> topics; "
        "handlers get a tool with only its name (needs --group)",
    )
    ck = add("check", help="lint the spec and settings; start nothing")
    ck.add_argument(
        "--endpoint",
        action="store_true",
        help="also ask the model endpoint: does it know the model, does it accept the key",
    )
    ck.add_argument(
        "--kafka",
        action="store_true",
        help="also connect to STREAM_BOOTSTRAP_SERVERS with the STREAM_KAFKA_* settings",
    )
    b = add("broker", help="run a local Apache Kafka broker in the foreground")
    b.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    b.add_argument("--data-dir", default=None, help="keep data here (default: temporary)")
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
        "--states", type=int, default=100_000, help="--churn: states pre-written (100000)"
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
        "--llm",
        default=None,
        help="simulator, local (a real small model via llama.cpp) or an endpoint URL "
        "(default: the configured endpoint, else the simulator)",
    )
    c = add("schemas", help="write the JSON Schemas of every message contract")
    c.add_argument("--out", default="schemas", help="folder (default: schemas)")
    c.add_argument(
        "--asyncapi",
        default="asyncapi.yaml",
        help="the AsyncAPI document of the topics (default: asyncapi.yaml)",
    )
    c.add_argument(
        "--register",
        action="store_true",
        help="instead: register the spec's output topics' JSON Schemas as subjects "
        "<topic>-value at STREAM_SCHEMA_REGISTRY_URL",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="with --register: register a schema that is not backward compatible",
    )
    v = add("advice", help="recent decisions with their advisors' votes")
    v.add_argument("--last", type=int, default=20, help="how many (default 20)")
    v.add_argument("--divergent", action="store_true", help="only divergent or held calls")
    pr = add("produce", help="publish a JSONL file, one item per line")
    pr.add_argument("file", help="JSONL file: one JSON object per line")
    pr.add_argument(
        "--key-field", default="_instance", help="field holding the record key (default _instance)"
    )
    pr.add_argument("--rate", type=float, default=None, help="records per second (default: all)")
    pr.add_argument("--topic", default=None, help="topic or short name (default: the input)")
    tl = add("tail", help="print a topic's last records, oldest first")
    tl.add_argument("topic", help="topic or short name: items, deadletter, done, activity.<tool>")
    tl.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    tl.add_argument("--last", type=int, default=20, help="how many (default 20)")
    tl.add_argument("--json", action="store_true", help="one JSON object per record")
    tp = add("topics", help="the product's topics, sizes and the processors' lag")
    tp.add_argument("--create", action="store_true", help="create the missing topics first")
    tp.add_argument("--partitions", type=int, default=None, help="partitions of created topics")
    ap = add("approve", help="approve (or reject) lazy-plan proposals")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--instance", action="append", help="an instance id (repeatable)")
    who.add_argument("--batch", help="every proposal of this batch id")
    who.add_argument(
        "--list", action="store_true", help="only show the proposals pending now, as JSON lines"
    )
    ap.add_argument("--reject", metavar="REASON", help="reject instead, with this reason")
    au = add("audit", help="check that every input item has an outcome")
    au.add_argument("--json", action="store_true", help="the whole report as JSON")
    au.add_argument(
        "--processor",
        action="append",
        default=None,
        metavar="URL",
        help="a processor's page (http://host:port) whose shadow sample to report (quality: "
        "agreement by window, window now); repeatable; default: this host's STREAM_WEB_PORT",
    )
    au.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only input records from here: an ISO time, a duration (30m, 2h, 1d) or an "
        "offset (applied to every input partition); outcomes are read from the same time",
    )
    rd = add(
        "redrive",
        help="send the items behind dead letters back to the input topic, once the cause is fixed",
        description="Sends the input record behind each item dead letter (or the bytes the "
        "dead letter carries, where retention removed the input) back to the input topic, "
        "with headers naming the dead letter and the first attempt; `stream audit` accounts "
        "the item once, by its final outcome. A dead letter is re-driven once; a re-driven "
        "item that fails again is not re-driven again. See docs/troubleshooting.md for "
        "which codes are worth it.",
    )
    rd.add_argument(
        "--code",
        action="append",
        default=None,
        metavar="C",
        help="dead letters of this code (repeatable); default: the codes whose cause can "
        "pass (unanswered, llm_error, llm_timeout, internal_error)",
    )
    rd.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only dead letters from here: an ISO time, a duration (30m, 2h, 1d) or an "
        "offset on the dead-letter topic",
    )
    rd.add_argument(
        "--max-redrives",
        type=int,
        default=1,
        metavar="N",
        help="re-drives of one input in all (default 1: an item that fails again after its "
        "re-drive stays a dead letter; raise it to try once more after another fix)",
    )
    rd.add_argument("--dry-run", action="store_true", help="show what would be sent; send nothing")
    rd.add_argument("--json", action="store_true", help="one JSON line per dead letter")
    return p
