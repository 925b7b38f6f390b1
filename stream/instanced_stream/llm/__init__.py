"""The model side: the OpenAI-compatible client, its adaptive in-flight limiter, the one
factory that builds the client from settings and spec. (A real model served on this
machine, for tests and the demo, is the bench's: instanced_stream_bench.testing.local_model.)"""

from instanced_stream.llm.client import LLM, Completion, RetryPolicy
from instanced_stream.llm.factory import build_llm, endpoint, resolve_api_key
from instanced_stream.llm.limiter import Limiter
from instanced_stream.llm.options import Collaborators, Recovery, RequestOptions

__all__ = [
    "LLM",
    "Collaborators",
    "Completion",
    "Limiter",
    "Recovery",
    "RequestOptions",
    "RetryPolicy",
    "build_llm",
    "endpoint",
    "resolve_api_key",
]
