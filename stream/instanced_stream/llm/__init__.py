"""The model side: the OpenAI-compatible client, its adaptive in-flight limiter, the one
factory that builds the client from settings and spec, and a launcher for a real model
served locally (llama.cpp, optional extra `local`)."""

from instanced_stream.llm.client import LLM, Completion, RetryPolicy
from instanced_stream.llm.factory import build_llm, endpoint, resolve_api_key
from instanced_stream.llm.limiter import Limiter

__all__ = [
    "LLM",
    "Completion",
    "Limiter",
    "RetryPolicy",
    "build_llm",
    "endpoint",
    "resolve_api_key",
]
