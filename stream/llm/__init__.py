"""The model side: the OpenAI-compatible client, its adaptive in-flight limiter, and a
launcher for a real model served locally (llama.cpp, optional extra `local`)."""

from stream.llm.client import LLM, Completion, RetryPolicy
from stream.llm.limiter import Limiter

__all__ = ["LLM", "Completion", "Limiter", "RetryPolicy"]
