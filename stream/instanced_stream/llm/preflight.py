"""At start, one real request of the exact shape the stream will send: a one-item batch
of the spec's own schema, not a one-token ping (a ping passes where the stream's first
batch would be refused). When the endpoint refuses a parameter it knows an alternative
for, the next shape is tried; what it accepted is what every request then uses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Completion
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec, RequestShapeSpec
from instanced_stream.errors import LLMError, StreamError
from instanced_stream.llm.client import LLM
from instanced_stream.llm.failures import REFUSED
from instanced_stream.llm.shape import RequestShape

__all__ = ["Probed", "canary", "probe"]

log = logging.getLogger("instanced_stream.llm")

# A harmless item: whatever the endpoint says about it is about the request's shape.
_SAMPLE = {"text": "Thanks, this was helpful."}


@dataclass(frozen=True, slots=True)
class Probed:
    shape: RequestShape
    tried: list[str]  # what was refused on the way, in the endpoint's words
    answered: bool  # False: the endpoint did not answer (an outage); shape unproven

    def pinned(self, spec: AgentSpec) -> AgentSpec:
        """`spec` with this shape as its `model.request` (what it says is what is sent).
        An unproven shape is not pinned: the stream switches it on a known refusal."""
        if not self.answered:
            return spec
        chosen = RequestShapeSpec(
            tokens_param=self.shape.tokens_param,
            temperature="send" if self.shape.temperature else "omit",
            response_format=self.shape.response_format,
        )
        effort = spec.model.reasoning_effort if self.shape.reasoning_effort else None
        model = spec.model.model_copy(update={"request": chosen, "reasoning_effort": effort})
        return spec.model_copy(update={"model": model})


def _sample() -> Instance:
    source = SourcePosition(topic="probe", partition=0, offset=0)
    return Instance(id="probe", payload=dict(_SAMPLE), source=source, size=1)


def canary(llm: LLM, prompt: PromptBuilder) -> Callable[[], Awaitable[Completion]]:
    """The probe's harmless request, for the client to ask whether the endpoint answers
    at all while one item's request keeps failing (`LLM.canary`)."""
    messages = prompt.messages([_sample()], prompt.first_ask)
    response_format, cap = prompt.response_format(1), prompt.output_cap(1)

    async def ask() -> Completion:
        return await llm.complete_once(messages, response_format, cap, {"x-stream-probe": "1"})

    return ask


async def probe(llm: LLM, prompt: PromptBuilder, *, adapt: bool = True) -> Probed:
    """Sends the one-item request with `llm.shape`, switching shapes on refusals it knows
    (`adapt=False`: the spec chose the shape, so a refusal is reported, not worked around).
    Raises StreamError when the endpoint refuses the key, the model or every shape;
    an endpoint that does not answer is left to the stream (an outage it waits out)."""
    instances = [_sample()]
    messages = prompt.messages(instances, prompt.first_ask)
    response_format = prompt.response_format(1)
    cap = prompt.output_cap(1)
    shape, tried = llm.shape, list[str]()
    for _ in range(8):  # more than every known alternative in a row
        llm.shape = shape
        try:
            # Marked, so a simulator can leave it out of its item counts.
            done = await llm.complete_once(messages, response_format, cap, {"x-stream-probe": "1"})
            # The endpoint's first measured pace: the first batch's deadline follows it.
            llm.deadline.observe(done.completion_tokens, done.latency_s, least=1)
        except LLMError as exc:
            if exc.status in REFUSED:
                raise StreamError(
                    f"the model endpoint {llm.base_url} refuses us ({exc.message}): check "
                    f"the API key, the model name ({llm.model!r}) and the URL"
                ) from exc
            if exc.timeout:
                llm.deadline.timed_out()  # the first batch gets longer
            if exc.status not in (400, 422):
                # Unreachable, slow, 429 or 5xx: nothing said about the shape.
                log.warning(
                    "the request shape was not probed (%s); using %s", exc.message, shape.label()
                )
                return Probed(shape, tried, answered=False)
            said = str(exc.data.get("said") or exc.message)
            tried.append(f"{shape.label()}: {said}")
            nxt = (
                shape.instead(exc.data.get("param"), exc.data.get("code"), said) if adapt else None
            )
            if nxt is None:
                raise StreamError(
                    f"the model endpoint {llm.base_url} refuses the request shape "
                    f"({shape.label()}): {exc.message}"
                    + ("" if adapt else " (set by model.request in the spec)")
                ) from exc
            log.info("endpoint refused %s (%s); trying %s", shape.label(), said, nxt.label())
            shape = nxt
            continue
        log.info("request shape: %s (probed with a one-item batch)", shape.label())
        return Probed(shape, tried, answered=True)
    raise StreamError(f"the model endpoint {llm.base_url} refused every request shape tried")
