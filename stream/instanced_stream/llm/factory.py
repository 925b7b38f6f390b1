"""The model client built from the settings and the agent spec, in one place."""

from __future__ import annotations

import logging
import os

from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.strict_form import strict_form
from instanced_stream.errors import SpecError, StreamError
from instanced_stream.llm.client import LLM
from instanced_stream.llm.limiter import Limiter
from instanced_stream.llm.options import Collaborators, Listener, Recovery, RequestOptions
from instanced_stream.llm.pacer import Pacer
from instanced_stream.llm.preflight import Probed, canary, probe
from instanced_stream.llm.shape import RequestShape
from instanced_stream.llm.strict import violations
from instanced_stream.settings import Settings

__all__ = ["build_llm", "check_llm", "endpoint", "initial_shape", "resolve_api_key"]

log = logging.getLogger("instanced_stream.llm")


def resolve_api_key(settings: Settings, spec: AgentSpec) -> str:
    """STREAM_LLM_API_KEY, else the spec's key file, else the env var it names."""
    if settings.llm_api_key is not None:
        return settings.llm_api_key.get_secret_value()
    if spec.model.api_key_file is not None:
        return spec.model.api_key_file.read_text().strip()
    # The spec names OPENAI_API_KEY by default: read the way the openai client reads it.
    key = os.environ.get(spec.model.api_key_env)
    if key:
        return key
    hosted = (settings.llm_base_url or settings.openai_base_url or "").startswith("https://")
    if spec.model.base_url is None and not hosted:
        # The bundled simulator, or a plain-http server of one's own (llama.cpp, Ollama,
        # vLLM) that may want no key; if it does, the start-up check says so (check_llm).
        return "none"
    raise SpecError(
        f"no API key: set {spec.model.api_key_env}, STREAM_LLM_API_KEY or model.api_key_file"
    )


def initial_shape(spec: AgentSpec) -> RequestShape:
    """The spec's `model.request`, else where probing starts: the fullest shape the
    prompt can ask for. A schema outside strict mode's subset starts non-strict, and
    says why (once, at start)."""
    fmt = spec.model.request.response_format if spec.model.request else None
    if fmt is None:
        fmt = "json_object" if spec.model.structured_output == "json_object" else None
    if fmt is None:
        problems = violations(PromptBuilder(spec).response_format(1)["json_schema"]["schema"])
        # What the answer's schema leaves out of a tool's or an advisor's (its own
        # top-level keywords) must fit strict mode too, or the model could not say it.
        for name, schema in [
            *((f"tool {t.name}", t.parameters) for t in spec.tools),
            *((f"advisor {a.id}", a.schema_) for a in spec.advisors),
        ]:
            problems += [f"{name}: {p}" for p in violations(strict_form(schema))]
        if problems:
            log.warning(
                "the answer's schema cannot be strict (%s); asking for it non-strict, and "
                "every answer is still validated",
                "; ".join(problems[:5]),
            )
        fmt = "json_schema" if problems else "json_schema_strict"
    chosen = spec.model.request
    return RequestShape(
        tokens_param=chosen.tokens_param if chosen else "max_tokens",
        temperature=chosen.temperature == "send" if chosen else True,
        response_format=fmt,
    )


async def check_llm(settings: Settings, spec: AgentSpec) -> Probed:
    """Before consuming anything: one real request of the stream's shape. An endpoint
    that refuses the key (401/403), does not know the model (404) or refuses every shape
    stops the processor with one line, instead of a stream that waits for ever; the
    shape it accepted is returned. With `model.request` in the spec nothing is probed
    here: the stream uses that shape, and pauses with the endpoint's words if refused."""
    llm = build_llm(settings, spec)
    try:
        if spec.model.request is not None:
            log.info("request shape (set by model.request): %s", llm.shape.label())
            return Probed(llm.shape, [], answered=False)
        return await probe(llm, PromptBuilder(spec))
    finally:
        await llm.close()


def endpoint(settings: Settings, spec: AgentSpec) -> str:
    """The model endpoint's URL: STREAM_LLM_BASE_URL, else the spec's model.base_url,
    else OPENAI_BASE_URL (as the openai client reads it)."""
    url = settings.llm_base_url or spec.model.base_url or settings.openai_base_url
    if not url:
        raise StreamError(
            "no model endpoint: set model.base_url in the spec or STREAM_LLM_BASE_URL "
            "(`stream llm-sim` runs the bundled simulator)"
        )
    return url


def build_llm(
    settings: Settings,
    spec: AgentSpec,
    *,
    listener: Listener | None = None,
    limiter: Limiter | None = None,
    base_url: str | None = None,
    shape: RequestShape | None = None,
) -> LLM:
    """The client for `base_url` (default: `endpoint`), told of its answers and failures
    by `listener` (metrics) and paced by `limiter`."""
    llm = LLM(
        base_url=base_url or endpoint(settings, spec),
        api_key=resolve_api_key(settings, spec),
        model=settings.llm_model or spec.model.name,
        timeout_s=settings.llm_timeout_s or spec.model.timeout_s,
        request=RequestOptions(
            shape=shape or initial_shape(spec),
            temperature=spec.model.temperature,
            max_output_tokens=spec.model.max_output_tokens,
            reasoning_effort=spec.model.reasoning_effort,
            reasoning_headroom=spec.model.reasoning_headroom,
            api_version=settings.llm_api_version or spec.model.api_version,
            provider=settings.llm_provider,
        ),
        recovery=Recovery(adapt=spec.model.request is None),
        collaborators=Collaborators(
            listener=listener,
            limiter=limiter,
            pacer=Pacer() if settings.llm_pacing else None,
        ),
    )
    llm.canary = canary(llm, PromptBuilder(spec))
    return llm
