"""A real model behind llama.cpp's own OpenAI-compatible server (xllamacpp), through the
openai client: strict structured output, and the prompt cache's report."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from instanced_stream.core.prompt import token_for
from instanced_stream_bench.testing.local_model import running_local_llm
from jsonschema import Draft202012Validator

pytestmark = [pytest.mark.integration, pytest.mark.local_model, pytest.mark.timeout(120)]

_TOKENS = [token_for(k) for k in range(3)]
_COMMENTS = [
    "Great write-up, thanks for sharing the benchmark numbers.",
    "You are an idiot and everyone here hates you.",
    "BUY CHEAP WATCHES NOW at my shop, best prices!!!",
]
# Small on purpose: a 135M model on two cores writes ~30 tokens/s at this length.
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["calls"],
    "properties": {
        "calls": {
            "type": "array",
            "minItems": 1,
            "maxItems": len(_TOKENS),
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["_instance", "decision"],
                "properties": {
                    "_instance": {"type": "string", "enum": _TOKENS},
                    "decision": {"type": "string", "enum": ["approve", "reject"]},
                },
            },
        }
    },
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str]]:
    with running_local_llm(parallel=1, ctx=2048) as url_and_name:
        yield url_and_name


def _ask(client: openai.OpenAI, model: str) -> Any:
    body = [{"_instance": t, "comment": c} for t, c in zip(_TOKENS, _COMMENTS, strict=True)]
    return client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "system",
                "content": "You moderate comments. For every instance, named by its "
                'token in "_instance", decide approve or reject. Answer with JSON.',
            },
            {"role": "user", "content": json.dumps(body, ensure_ascii=False)},
        ],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "decisions", "strict": True, "schema": _SCHEMA},
        },
        temperature=0,
        max_tokens=200,
    )


def test_the_server_lists_its_model(served: tuple[str, str]) -> None:
    url, name = served
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    with urllib.request.urlopen(f"{url}/models", timeout=10) as resp:
        listed = json.load(resp)
    assert [m["id"] for m in listed["data"]] == [name]


def test_a_strict_schema_answer_parses_and_a_repeat_hits_the_prompt_cache(
    served: tuple[str, str],
) -> None:
    url, name = served
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    first = _ask(client, name)
    assert first.choices[0].finish_reason == "stop"
    answer = json.loads(first.choices[0].message.content or "")
    assert not list(Draft202012Validator(_SCHEMA).iter_errors(answer))
    assert {call["_instance"] for call in answer["calls"]} <= set(_TOKENS)
    assert first.usage is not None and first.usage.prompt_tokens > 0

    second = _ask(client, name)
    details = second.usage.prompt_tokens_details if second.usage else None
    assert details is not None and (details.cached_tokens or 0) > 0


def test_the_server_is_gone_when_its_context_ends() -> None:
    with (
        running_local_llm(parallel=1, ctx=1024) as (url, _),
        urllib.request.urlopen(f"{url}/models", timeout=10) as resp,
    ):
        assert resp.status == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/models", timeout=5)


async def test_the_start_up_probe_keeps_the_full_shape_llama_cpp_takes(
    served: tuple[str, str],
) -> None:
    """llama.cpp takes max_tokens, a temperature and a strict schema (as a grammar): the
    probe, a one-item batch of the shipped example's own schema, keeps that shape."""
    from instanced_stream.core.prompt import PromptBuilder
    from instanced_stream.core.spec import load_spec
    from instanced_stream.llm.client import LLM
    from instanced_stream.llm.preflight import probe
    from instanced_stream.llm.shape import RequestShape
    from instanced_stream.settings import DEFAULT_SPEC

    url, name = served
    llm = LLM(base_url=url, api_key="none", model=name, timeout_s=100)
    try:
        probed = await probe(llm, PromptBuilder(load_spec(DEFAULT_SPEC)))
    finally:
        await llm.close()
    assert probed.answered and not probed.tried
    assert probed.shape == RequestShape()
