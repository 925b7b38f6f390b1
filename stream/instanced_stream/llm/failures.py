"""What an endpoint's failure means: the openai client's exceptions as `LLMError`s that say
whether retrying can help (a timeout, a 429, a 5xx, a key an operator will fix), whether a
400 refuses the request's shape (configuration, never an item's fault) or depends on what
the items say (split to isolate the item), and how long the endpoint asked to wait."""

from __future__ import annotations

import openai

from instanced_stream.errors import LLMError

__all__ = ["REFUSED", "classify"]


# A wrong key (401), a key without access (403), an unknown model or URL (404): retrying
# cannot fix these, an operator must. The stream pauses until then, and says so.
REFUSED = (401, 403, 404)


# 400s that name what the request asked for, not what an item says (OpenAI's codes).
_SHAPE_CODES = frozenset(
    {
        "unsupported_parameter",
        "unsupported_value",
        "unknown_parameter",
        "invalid_schema",
        "invalid_json_schema",
        "invalid_response_format",
    }
)
# 400s that depend on the items: the request's text, or its size. A 400 that names no
# parameter and none of these codes is taken as the items' too: splitting finds out.
_CONTENT_CODES = frozenset(
    {"context_length_exceeded", "content_filter", "content_policy_violation", "invalid_prompt"}
)
_CONTENT_PARAMS = frozenset({"messages", "prompt", "input"})


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """OpenAI and Azure send `retry-after-ms` beside `retry-after` (seconds): the finer wins."""
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue  # an HTTP date: rare enough to leave to the back-off
    return None


def _provider_message(exc: openai.APIStatusError) -> str:
    """The endpoint's own words (`error.message`), not the client's wrapper around them."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return exc.message


def _bad_request(exc: openai.APIStatusError) -> LLMError:
    code, param = exc.code, exc.param
    said = _provider_message(exc)
    where = f" (param {param!r}, code {code!r})" if param or code else ""
    message = f"LLM endpoint answered {exc.status_code}: {said}{where}"
    content = exc.status_code == 413 or code in _CONTENT_CODES
    # `messages` is named by item-dependent refusals too (a context overflow, which also
    # has its code): only other parameters, or the response format, are the shape's.
    named = param is not None and param not in _CONTENT_PARAMS
    if not content and (code in _SHAPE_CODES or named or "response_format" in said):
        # Retriable: the stream waits for an operator, as it does for a wrong key.
        return LLMError(
            message,
            retriable=True,
            status=exc.status_code,
            shape=True,
            param=param,
            code=code,
            said=said,
        )
    # A content filter, a context overflow, or a 400 that names nothing: splitting the
    # request finds the item, and only that item is dead-lettered (with these words).
    return LLMError(
        message,
        retriable=False,
        status=exc.status_code,
        content=True,
        param=param,
        code=code,
        said=said,
    )


def classify(exc: Exception) -> LLMError:
    """What the openai client raised, as the LLMError the client and the solver act on."""
    if isinstance(exc, openai.APITimeoutError):
        return LLMError("LLM request timed out", retriable=True, timeout=True)
    if isinstance(exc, openai.APIConnectionError):
        return LLMError(f"LLM endpoint unreachable: {exc}", retriable=True)
    if isinstance(exc, openai.APIStatusError) and exc.status_code in (400, 413, 422):
        return _bad_request(exc)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        # 401/403/404 mean a wrong key, model or URL: an operator fixes those, and the
        # items must still be there when they do.
        retriable = status in (*REFUSED, 408, 409, 429) or status >= 500
        return LLMError(
            f"LLM endpoint answered {status}: {_provider_message(exc)}",
            retriable=retriable,
            status=status,
            retry_after=_retry_after(exc),
        )
    # Unknown failures pause the stream rather than dead-letter the backlog: waiting is
    # safe, and an operator sees the warnings.
    return LLMError(f"LLM call failed: {exc!r}", retriable=True)
