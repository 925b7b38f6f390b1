"""The model client built from the settings and the agent spec, in one place."""

from __future__ import annotations

import os

from stream.core.spec import AgentSpec
from stream.errors import LLMError, SpecError, StreamError
from stream.llm.client import LLM, Listener
from stream.llm.limiter import Limiter
from stream.settings import Settings

__all__ = ["build_llm", "check_llm", "endpoint", "resolve_api_key"]


def resolve_api_key(settings: Settings, spec: AgentSpec) -> str:
    """STREAM_LLM_API_KEY, else the spec's key file, else the env var it names."""
    if settings.llm_api_key is not None:
        return settings.llm_api_key.get_secret_value()
    if spec.model.api_key_file is not None:
        return spec.model.api_key_file.read_text().strip()
    key = os.environ.get(spec.model.api_key_env)
    if key:
        return key
    hosted = (settings.llm_base_url or "").startswith("https://")
    if spec.model.base_url is None and not hosted:
        # The bundled simulator, or a plain-http server of one's own (llama.cpp, Ollama,
        # vLLM) that may want no key; if it does, the start-up check says so (check_llm).
        return "none"
    raise SpecError(
        f"no API key: set {spec.model.api_key_env}, STREAM_LLM_API_KEY or model.api_key_file"
    )


async def check_llm(settings: Settings, spec: AgentSpec) -> None:
    """Before consuming anything: an endpoint that refuses the key (401/403) or does not
    know the model (404) stops the processor with one line, instead of a stream that
    waits for ever. Unreachable is left to the stream (an outage it waits out)."""
    llm = build_llm(settings, spec)
    try:
        await llm.check()
    except LLMError as exc:
        raise StreamError(
            f"the model endpoint {llm.base_url} refuses us ({exc.message}): check the API "
            f"key, the model name ({llm.model!r}) and the URL"
        ) from exc
    finally:
        await llm.close()


def endpoint(settings: Settings, spec: AgentSpec) -> str:
    """The model endpoint's URL: STREAM_LLM_BASE_URL, else the spec's model.base_url."""
    url = settings.llm_base_url or spec.model.base_url
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
) -> LLM:
    """The client for `base_url` (default: `endpoint`), told of its answers and failures
    by `listener` (metrics) and paced by `limiter`."""
    return LLM(
        base_url=base_url or endpoint(settings, spec),
        api_key=resolve_api_key(settings, spec),
        model=settings.llm_model or spec.model.name,
        timeout_s=settings.llm_timeout_s or spec.model.timeout_s,
        temperature=spec.model.temperature,
        max_output_tokens=spec.model.max_output_tokens,
        listener=listener,
        limiter=limiter,
    )
