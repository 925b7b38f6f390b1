"""The `stream` command line: every sub-command and its flags. Parsing only; what each
command does lives in stream/instanced_stream/cli/main.py and the modules it dispatches to.

Other distributions add commands of their own through the entry point group `PLUG_INS`:
each entry point is a function that takes `add` (a sub-command's parser, with the common
flags) and sets `handler` on the parsers it adds. The development distribution
(packages/bench) adds the demo, the benches, the broker and the model servers this way, so
the product's wheel holds none of them and a deployment without it still says where they
come from."""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points
from typing import Any, NoReturn

from instanced_stream import __version__

__all__ = ["DEVELOPMENT", "PLUG_INS", "SETTING_FLAGS", "build_parser", "window_sizes"]

# Global flags that are settings: they win over STREAM_* variables and the .env file.
SETTING_FLAGS = ("bootstrap_servers", "topic_prefix", "spec")
# The entry point group of commands from other distributions (the module docstring).
PLUG_INS = "instanced_stream.commands"
# The development distribution's commands: without it each still parses (any arguments)
# and its handler says where it comes from, instead of argparse's "invalid choice".
DEVELOPMENT = ("demo", "bench", "eval", "broker", "registry", "llm-sim", "llm-local")


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

    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show library logs too",
    )

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        # `stream X --help` opens with what X does: its one-line help, unless it has more
        said = kw.get("help")
        if said and "description" not in kw:
            kw["description"] = f"{said[0].upper()}{said[1:]}."
        return sub.add_parser(name, parents=[common], **kw)

    p.set_defaults(handler=None)  # the product's commands: cli/main.py maps them by name

    add(
        "process",
        help="run a processor: read the input topic, decide its items in batched LLM "
        "requests, publish the calls to the activity topics (one consumer group member)",
    )
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
    ck.add_argument(
        "--registry",
        action="store_true",
        help="also ask STREAM_SCHEMA_REGISTRY_URL: does it answer, what compatibility it enforces",
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
    pi = add(
        "process-idea",
        help="the plans' Idea Process: each plan's steps across its instances, with how many "
        "wait, run, are done, failed or were skipped",
    )
    pi.add_argument("--instance", metavar="ID", help="where one instance stands (its plan)")
    pi.add_argument("--json", action="store_true", help="as JSON")
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
    for point in entry_points(group=PLUG_INS):
        point.load()(add)
    for name in DEVELOPMENT:
        if name not in sub.choices:
            absent = add(name, help="(not installed: the development distribution's)")
            absent.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            absent.set_defaults(handler=None, absent=True)
    return p
