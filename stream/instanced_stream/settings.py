"""Process settings: one frozen object, read once from the environment (prefix STREAM_).

The agent spec says *what* the agent does; these settings say *where* it runs.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from instanced_stream.faultpoints import parse

__all__ = [
    "DEFAULT_SPEC",
    "EXAMPLES",
    "OTHER_VARIABLES",
    "Settings",
    "Topics",
    "examples_dir",
    "setting_problem",
    "unknown_variables",
    "warn_unknown_variables",
]

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# STREAM_* variables that are not settings: read by the tools, examples and scripts.
OTHER_VARIABLES = frozenset(
    {
        "STREAM_KAFKA_CACHE",  # where the broker's jars are resolved (testing/jars.py)
        "STREAM_VENV",  # ./dev's virtual environment
        "STREAM_AGENT_DIR",  # docker-compose: the folder of the spec and handlers it mounts
        "STREAM_DECISIONS_FILE",  # the moderation example's activity writes decisions there
        "STREAM_CHAOS_RUNS",  # the fault campaign's runs and seed (tests)
        "STREAM_CHAOS_SEED",
    }
)


def examples_dir() -> Path:
    """The bundled examples: the package `instanced_stream.examples`, which a wheel ships
    inside the package and an editable install maps to the checkout's `examples/` (see
    setup.py); the checkout's folder when the package was never installed."""
    found = importlib.util.find_spec("instanced_stream.examples")
    if found is not None and found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "examples"


EXAMPLES = examples_dir()
DEFAULT_SPEC = EXAMPLES / "moderation" / "agent.yaml"


class Topics:
    """Every topic name the product reads or writes, derived from one prefix."""

    def __init__(self, prefix: str, input_topic: str) -> None:
        self.prefix = prefix
        self.input = prefix + input_topic
        self.dead_letter = prefix + "stream.deadletter"
        self.no_action = prefix + "stream.noaction"
        self.state_updates = prefix + "stream.stateupdates"
        self.ideas = prefix + "stream.ideas"  # the plans' Idea Process (compacted)
        self.context = prefix + "stream.context"
        self.advice = prefix + "stream.advice"
        self.results = prefix + "stream.results"
        self.review = prefix + "stream.review"
        self.done = prefix + "stream.done"
        self.proposals = prefix + "stream.proposals"
        self.approvals = prefix + "stream.approvals"

    def activity(self, tool: str) -> str:
        return f"{self.prefix}activity.{tool}"

    def outcome_topics(self, tools: list[str]) -> list[str]:
        """Topics on which an input item can end: what the auditor reads."""
        return [self.activity(t) for t in tools] + [
            self.review,
            self.no_action,
            self.state_updates,
            self.dead_letter,
        ]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="STREAM_", env_file=".env", extra="ignore", frozen=True
    )

    bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap address; unset: the project starts a local broker"
    )
    spec: Path = Field(DEFAULT_SPEC, description="Agent spec file (YAML or JSON)")
    topic_prefix: str = Field("", description="Prefix for every topic and the consumer group")
    input_topic: str = Field("items", description="Topic producers publish items to")
    partitions: int = Field(4, ge=1, description="Partitions for topics the product creates")
    app_id: str = Field("instanced-stream", description="Consumer group of the processors")
    max_record_bytes: int = Field(
        256_000, ge=64, description="Larger input records are dead-lettered (too_large)"
    )
    data_dir: Path = Field(Path(".stream-data"), description="Local state of the processor")
    llm_base_url: str | None = Field(None, description="Overrides the spec's model.base_url")
    openai_base_url: str | None = Field(
        None,
        validation_alias="OPENAI_BASE_URL",
        description="OPENAI_BASE_URL, read as the openai client reads it: the endpoint when "
        "neither STREAM_LLM_BASE_URL nor the spec's model.base_url is set",
    )
    llm_model: str | None = Field(None, description="Overrides the spec's model.name")
    llm_api_version: str | None = Field(
        None, description="Overrides the spec's model.api_version (Azure OpenAI)"
    )
    llm_provider: str | None = Field(
        None,
        description="gen_ai.provider.name of the LLM spans (OpenTelemetry); unset: the "
        "conventions' name for a known host (api.openai.com: openai, *.openai.azure.com: "
        "azure.ai.openai, ...), else openai_compatible",
    )
    llm_pacing: bool = Field(
        True,
        description="Keep requests and tokens per minute under what the endpoint's "
        "x-ratelimit-* headers say (endpoints without them are not paced)",
    )
    llm_api_key: SecretStr | None = Field(
        None, description="API key; else the env var or file the spec names"
    )
    llm_timeout_s: float | None = Field(
        None, gt=0, description="Overrides the spec's model.timeout_s"
    )
    max_attempts: int = Field(
        3, ge=1, description="Asks per group of instances before it is split or dead-lettered"
    )
    session_timeout_s: float = Field(
        15.0, ge=6, description="A processor silent this long leaves the group (crash take-over)"
    )
    pending_timeout_s: float = Field(
        300.0, gt=0, description="An awaited call unanswered this long is recorded as failed"
    )
    max_output_bytes: int = Field(
        1_000_000,
        gt=1024,
        description="An output record larger than this is dead-lettered instead of sent "
        "(keep it below the broker's message.max.bytes, 1048588 by default)",
    )
    publish_timeout_ms: int = Field(
        30_000,
        ge=1000,
        description="A commit's records unacknowledged this long fail the commit: the "
        "partition's unit is reopened and redoes its uncommitted work once the cluster "
        "answers (an outage is waited out, nothing is dead-lettered for it)",
    )
    state_retention_s: float = Field(
        86_400.0,
        gt=0,
        description="A finished workflow's state is kept this long (a late result or a "
        "redelivered input still finds it), then deleted from the table and its changelog",
    )
    drain_s: float = Field(
        25.0,
        ge=0,
        description="On SIGTERM, batches in flight get this long to finish and be committed "
        "before the worker stops (keep it below the pod's terminationGracePeriodSeconds); "
        "on a revocation, at most this and half the session timeout, so an answer in flight is "
        "committed before its partition moves instead of asked again by its next owner",
    )
    commit_interval: float = Field(
        0.05,
        gt=0,
        le=60,
        description="Seconds a partition waits, once work on it finished, before it commits "
        "(one transaction, or one offset commit): what finishes meanwhile shares it; longer "
        "means fewer commits and outcomes visible later",
    )
    delivery: Literal["exactly_once", "at_least_once"] = Field(
        "exactly_once",
        description="exactly_once: one Kafka transaction per input partition carries the "
        "outputs and the offsets (read_committed consumers see each outcome once); "
        "at_least_once: duplicates possible after a crash, deduplicated by call_id",
    )
    answer_journal: bool = Field(
        True,
        description="Journal each validated answer (the answers journal topic) until its "
        "outcome commits, so a redo after a crash, a fencing or a rebalance takes it from "
        "there instead of asking the model again; false: a redo asks again",
    )
    log_level: str = Field(
        "INFO", description="Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL, any case"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one JSON object per line, with batch and instance ids"
    )
    web_host: str = Field("0.0.0.0", description="Address of the metrics/health/live page")
    web_port: int = Field(
        6066, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz and the page"
    )
    # Its own default, so a processor and a worker on one host both keep their probes.
    worker_web_port: int = Field(
        6067, ge=0, le=65535, description="Port of the activities worker's probes and metrics"
    )
    faust_web_port: int = Field(
        6068,
        ge=0,
        le=65535,
        description="Web port of a faust app built by faust_app() (faust's own default is "
        "6066, the processor's)",
    )
    worker_concurrency: int = Field(
        8, ge=1, description="Activity handlers an activities worker runs at once"
    )
    worker_fetch_timeout_s: float = Field(
        300.0,
        ge=1,
        description="An activities worker whose fetched calls take longer than this to handle "
        "leaves its group (max.poll.interval.ms): its partitions go to another member, its "
        "commit is refused and those calls are delivered again; raise it for slow handlers",
    )
    replication_factor: int | None = Field(
        None, ge=1, description="Replicas of every topic the product creates; unset: broker default"
    )
    min_insync_replicas: int | None = Field(
        None, ge=1, description="min.insync.replicas of created topics; unset: broker default"
    )

    # Kafka security: passed to every Kafka client the product creates (stream/security.py).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients talk to the brokers"
    )
    kafka_ssl_cafile: Path | None = Field(None, description="CA certificates (PEM) to trust")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate (PEM), mTLS")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client private key (PEM), mTLS")
    kafka_ssl_key_password: SecretStr | None = Field(None, description="Password of the key")
    kafka_ssl_check_hostname: bool = Field(True, description="Check the broker's host name")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] = Field(
        "PLAIN", description="SASL mechanism (SASL_* protocols)"
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user name")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password")
    kafka_sasl_password_file: Path | None = Field(
        None, description="File holding the SASL password (a mounted secret)"
    )
    kafka_sasl_oauth_token: SecretStr | None = Field(
        None,
        description="OAUTHBEARER: the access token itself, when no token file is mounted "
        "(read once: a token that expires needs the file)",
    )
    kafka_sasl_oauth_token_file: Path | None = Field(
        None,
        description="OAUTHBEARER: file holding the access token, read again for every "
        "authentication (a projected service-account token, a sidecar's refreshed token)",
    )
    # Kafka client conventions (stream/instanced_stream/kafka/clients.py).
    kafka_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "lz4", description="Compression of every record the product produces"
    )
    group_instance_id: str | None = Field(
        None,
        description="Static group membership (KIP-345) of the processor: a stable name per "
        "member, e.g. a StatefulSet's pod name; a restart within the session timeout then "
        "gets its partitions back without a rebalance",
    )

    # Schema Registry (kafka/registry.py): Confluent wire format in and, if asked, out.
    schema_registry_url: str | None = Field(
        None,
        description="A Confluent-compatible Schema Registry: input records in its wire format "
        "(Avro, JSON Schema) are decoded by their schema id; unset, such a record is a dead "
        "letter (unknown_schema)",
    )
    schema_registry_username: str | None = Field(None, description="Registry user (basic auth)")
    schema_registry_password: SecretStr | None = Field(
        None, description="Registry password (basic auth)"
    )
    schema_registry_cafile: Path | None = Field(
        None, description="CA certificates (PEM) that sign the registry's certificate"
    )
    schema_registry_outputs: bool = Field(
        False,
        description="Write output records (activity, no-action, dead letter, ...) in the wire "
        "format, their JSON Schema registered as subject <topic>-value",
    )
    schema_registry_force: bool = Field(
        False,
        description="Start although an output schema is not backward compatible with the "
        "one registered (the new version is registered anyway; consumers may break)",
    )

    crash_at: str | None = Field(
        None,
        description="Tests only: [raise:]POINT:N kills (or raises in) the processor at the "
        "N-th pass of a crash point (faultpoints.py); unset in production",
    )

    @field_validator("log_level")
    @classmethod
    def _level_known(cls, value: str) -> str:
        if value.upper() not in _LEVELS:
            raise ValueError(f"a log level is one of {', '.join(_LEVELS)}")
        return value.upper()

    @field_validator("crash_at")
    @classmethod
    def _crash_point_known(cls, value: str | None) -> str | None:
        if value:
            parse(value)  # a misspelt point would silently never fire
        return value or None

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix, self.input_topic)


def _variable(field: str) -> str:
    """The environment variable a setting is read from."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    return alias if isinstance(alias, str) else f"STREAM_{field.upper()}"


def setting_problem(exc: ValidationError) -> str:
    """A refused setting in one line, named as the user wrote it: `STREAM_PARTITIONS='many':
    Input should be a valid integer ...`, never pydantic's location tuple."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    name = field if field.isupper() else _variable(field)
    shown = first.get("input")
    given = f"={shown!r}" if isinstance(shown, str | int | float) else ""
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"bad setting {name}{given}: {first['msg']}{more}"


def unknown_variables(names: Iterable[str]) -> list[str]:
    """Warnings for STREAM_* names that are no setting (a typo is otherwise silently
    ignored, and the default quietly used), naming the closest known one."""
    known = {_variable(field) for field in Settings.model_fields} | OTHER_VARIABLES
    warnings = []
    for name in sorted(set(names)):
        if not name.upper().startswith("STREAM_") or name.upper() in known:
            continue
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def warn_unknown_variables(environ: Iterable[str], env_file: Path = Path(".env")) -> None:
    """Logs unknown_variables() for the environment and the .env file pydantic reads."""
    names = list(environ)
    if env_file.is_file():
        from dotenv import dotenv_values

        names += list(dotenv_values(env_file))
    for warning in unknown_variables(names):
        logging.getLogger("stream.settings").warning("%s", warning)
