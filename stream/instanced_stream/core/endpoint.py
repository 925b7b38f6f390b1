"""The model endpoint's options beside its name and prices: a request shape chosen by
hand, the model that gives doubtful items a second opinion, and how the batch tier uses
the provider's Batch API. Part of the agent spec (core/spec.py re-exports them)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

__all__ = ["BatchTier", "RequestShapeSpec", "SecondModel"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RequestShapeSpec(_Strict):
    """The request's shape, chosen by hand: no probing at start. Unset fields take the
    shape an OpenAI-compatible server accepts most often."""

    tokens_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens",
        description="The output cap's name: max_completion_tokens for OpenAI's reasoning "
        "models (GPT-5 family, o-series), max_tokens for most other servers",
    )
    temperature: Literal["send", "omit"] = Field(
        "send", description="omit: the endpoint's default (reasoning models take no other)"
    )
    response_format: Literal["json_schema_strict", "json_schema", "json_object", "text"] = Field(
        "json_schema_strict",
        description="How the answer's JSON is asked for, from the most enforced to the "
        "schema written into the prompt (text)",
    )


class SecondModel(_Strict):
    """The model that gives doubtful items a second opinion (`quality.escalate_on`)."""

    name: str = Field(validation_alias=AliasChoices("name", "model"), description="its model")
    base_url: str | None = Field(None, description="unset: the stream's own endpoint")


class BatchTier(_Strict):
    """How `model.tier: batch` uses the provider's Batch API."""

    flush_s: float = Field(
        60.0, gt=0, description="A batch is submitted this long after its first request"
    )
    max_requests: int = Field(
        1000, ge=1, le=50_000, description="... or once it holds this many (OpenAI: 50,000)"
    )
    poll_s: float = Field(30.0, gt=0, description="How often submitted batches are looked at")
    completion_window: Literal["24h"] = Field(
        "24h", description="The Batch API's completion window (the only one OpenAI offers)"
    )
    reask: Literal["batch", "online"] = Field(
        "batch",
        description="Where a re-ask goes (instances a batch answer left open): the next "
        "batch (half price, another wait) or an online request (full price, at once)",
    )
    max_resubmits: int = Field(
        3,
        ge=0,
        description="Times a request whose line expired or failed, or whose batch failed "
        "or was cancelled, is submitted again before its instances are dead-lettered",
    )
