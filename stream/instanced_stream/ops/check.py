"""`stream check`: lints the agent spec and the settings without starting anything; with
`--endpoint` asks the model endpoint whether it knows the model and accepts the key, and
with `--kafka` connects to the brokers with the security settings.

Every problem is a StreamError (the CLI prints one line and exits 2); what was checked is
returned as lines for people, so a CI job or an init container can run it before a rollout.
"""

from __future__ import annotations

import asyncio

import openai

from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import StreamError
from instanced_stream.settings import Settings

__all__ = [
    "check",
    "check_endpoint",
    "check_kafka",
    "check_registry",
    "lint_settings",
    "preflight",
    "spec_lines",
]


def lint_settings(settings: Settings) -> list[str]:
    """Combinations each setting's own validation cannot see."""
    problems = []
    if settings.web_port and settings.web_port == settings.worker_web_port:
        problems.append(
            f"STREAM_WEB_PORT and STREAM_WORKER_WEB_PORT are both {settings.web_port}: a "
            "processor and a worker on one host would fight for it"
        )
    replicas, isr = settings.replication_factor, settings.min_insync_replicas
    if replicas is not None and isr is not None and isr > replicas:
        problems.append(
            f"STREAM_MIN_INSYNC_REPLICAS={isr} exceeds STREAM_REPLICATION_FACTOR={replicas}: "
            "every acks=all publish would fail"
        )
    sasl = settings.kafka_security_protocol.startswith("SASL")
    oauth = settings.kafka_sasl_mechanism == "OAUTHBEARER"
    if sasl and not oauth and not settings.kafka_sasl_username:
        # OAUTHBEARER's identity is its token (checked by client_options, in preflight)
        problems.append(f"SASL {settings.kafka_sasl_mechanism} needs STREAM_KAFKA_SASL_USERNAME")
    if settings.faust_web_port and settings.faust_web_port in (
        settings.web_port,
        settings.worker_web_port,
    ):
        problems.append(
            f"STREAM_FAUST_WEB_PORT is {settings.faust_web_port}, a port the processor or "
            "the activities worker holds on the same host"
        )
    return problems


def preflight(settings: Settings, spec: AgentSpec) -> None:
    """Every configuration mistake `stream process` refuses before it touches the network,
    in one place: `stream check` runs exactly this, so it never passes what a processor
    would refuse. Raises StreamError (or SpecError) at the first."""
    from instanced_stream.core.live_spec import LiveSpec
    from instanced_stream.core.tokenizer import Tokenizer
    from instanced_stream.kafka.security import client_options
    from instanced_stream.llm.factory import endpoint, resolve_api_key
    from instanced_stream.llm.limiter import Limiter
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize

    problems = lint_settings(settings)
    if problems:
        raise StreamError("; ".join(problems))
    endpoint(settings, spec)  # no endpoint at all
    resolve_api_key(settings, spec)  # a hosted endpoint without a key
    client_options(settings)  # Kafka certificate, key, password and token files; unused ones
    # a window too small for the instructions, tools and advisors alone
    WindowSize(LiveSpec(spec), Tokenizer(spec.model.name), Limiter(1))


async def check_endpoint(settings: Settings, spec: AgentSpec) -> list[str]:
    """Reachable, knows the model, accepts the key and a request of the stream's own
    shape (probed as `stream process` probes it, or the spec's `model.request`); else a
    StreamError saying which."""
    from instanced_stream.core.prompt import PromptBuilder
    from instanced_stream.llm.factory import build_llm
    from instanced_stream.llm.preflight import probe

    llm = build_llm(settings, spec)
    try:
        # The probe below treats an unreachable endpoint as an outage the stream waits
        # out; a check run before a rollout must say so instead.
        try:
            await llm.client.models.list()
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise StreamError(f"the model endpoint {llm.base_url} does not answer: {exc}") from exc
        except openai.APIStatusError:
            pass  # some servers have no model list; the probe below still tells
        probed = await probe(llm, PromptBuilder(spec), adapt=spec.model.request is None)
    finally:
        await llm.close()
    if not probed.answered:
        raise StreamError(
            f"the model endpoint {llm.base_url} did not answer the probe request; the "
            "request shape is unproven"
        )
    how = "set by model.request" if spec.model.request is not None else "probed"
    lines = [f"endpoint {llm.base_url}: answers, knows model {llm.model!r}, accepts the key"]
    lines += [f"refused: {t}" for t in probed.tried]
    lines.append(f"request shape ({how}): {probed.shape.label()}")
    return lines


async def check_kafka(settings: Settings, spec: AgentSpec) -> list[str]:
    """Connects to STREAM_BOOTSTRAP_SERVERS with the STREAM_KAFKA_* settings (TLS, SASL,
    OAUTHBEARER), as every client of the product will, and reads the cluster's topics:
    the credentials are proven, not only parsed. Unreachable or refused: KafkaUnreachable
    (exit code 3)."""
    from instanced_stream.kafka.clients import register_producer
    from instanced_stream.kafka.security import client_options, register
    from instanced_stream.kafka.topics import product_topics
    from instanced_stream.ops.console import topic_layout

    bootstrap = settings.bootstrap_servers
    if not bootstrap:
        raise StreamError("--kafka needs STREAM_BOOTSTRAP_SERVERS: the cluster to connect to")
    register(bootstrap, client_options(settings))
    register_producer(bootstrap, settings.kafka_compression)
    layout = await topic_layout(bootstrap)
    how: str = settings.kafka_security_protocol
    if how.startswith("SASL"):
        how += f" ({settings.kafka_sasl_mechanism})"
    missing = [t for t in product_topics(settings, spec) if t not in layout]
    topics = f"missing {len(missing)} (`stream topics --create`)" if missing else "all present"
    return [
        f"kafka {bootstrap}: connected over {how}, {len(layout)} topics visible; "
        f"the product's topics: {topics}"
    ]


def spec_lines(spec: AgentSpec) -> list[str]:
    """The spec's lint (ops/spec_lint.py): its warnings as lines; a refusal raises."""
    from instanced_stream.ops.spec_lint import lint_spec

    lint = lint_spec(spec)
    if lint.refused:
        raise StreamError("; ".join(lint.refused))
    return [f"warning: {w}" for w in lint.warnings]


def check_registry(settings: Settings) -> list[str]:
    """Asks STREAM_SCHEMA_REGISTRY_URL (with its credentials and CA) for its subjects and
    its global compatibility: the registry answers and what it will enforce is known
    before a processor registers its output schemas against it."""
    from instanced_stream.kafka.registry import RegistryError, client_conf, transport_error

    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
    except ImportError as exc:
        raise RegistryError(
            "--registry needs the registry extra: pip install 'instanced-stream[registry]'"
        ) from exc
    client = SchemaRegistryClient(client_conf(settings))
    url = settings.schema_registry_url
    try:
        subjects = client.get_subjects()
        level = client.get_compatibility()
    except SchemaRegistryError as exc:
        raise RegistryError(f"the schema registry at {url} refused: {exc}") from exc
    except Exception as exc:
        if not transport_error(exc):
            raise
        raise RegistryError(f"the schema registry at {url} does not answer: {exc}") from exc
    finally:
        client.close()
    outputs = "framed, registered at start" if settings.schema_registry_outputs else "JSON"
    return [
        f"registry {url}: answers, {len(subjects)} subjects, compatibility {level}; "
        f"outputs: {outputs} (STREAM_SCHEMA_REGISTRY_OUTPUTS)"
    ]


def _web_port(settings: Settings) -> list[str]:
    """A warning, not a refusal: the check may run beside a processor it is about to
    replace, but a processor started here now would stop at its first line."""
    from instanced_stream.observe.web import claim_port

    try:
        claim_port(settings.web_host, settings.web_port, "STREAM_WEB_PORT")
    except StreamError as exc:
        return [f"warning: {exc.message} (`stream process` on this host would refuse to start)"]
    return []


def check(
    settings: Settings, endpoint: bool = False, kafka: bool = False, registry: bool = False
) -> list[str]:
    """Lines saying what was checked; raises StreamError at the first problem."""
    from instanced_stream.kafka.security import ignored_settings
    from instanced_stream.llm.factory import endpoint as endpoint_of

    spec = load_spec(settings.spec)
    lines = [
        f"spec {settings.spec}: valid ({spec.name}: {len(spec.tools)} tools, "
        f"{len(spec.advisors)} advisors, {'a plan' if spec.plan else 'no plan'})"
    ]
    lines += spec_lines(spec)
    preflight(settings, spec)
    lines.append("settings: consistent, as `stream process` needs them")
    lines += [f"warning: {w}" for w in ignored_settings(settings)]
    lines += _web_port(settings)
    if endpoint:
        lines += asyncio.run(check_endpoint(settings, spec))
    else:
        lines.append(f"endpoint {endpoint_of(settings, spec)}: not contacted (add --endpoint)")
    if kafka:
        lines += asyncio.run(check_kafka(settings, spec))
    else:
        lines.append("kafka: not contacted (add --kafka)")
    if registry:
        lines += check_registry(settings)
    elif settings.schema_registry_url:
        lines.append(f"registry {settings.schema_registry_url}: not contacted (add --registry)")
    return lines
