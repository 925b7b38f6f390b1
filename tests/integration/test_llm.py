"""The openai client against the simulator over HTTP (loopback only, no broker)."""

from __future__ import annotations

import secrets
import time

import openai
import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.errors import LLMError
from instanced_stream.llm.client import LLM, RetryPolicy
from instanced_stream.llm.options import Collaborators, Recovery
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.server import Faults, Simulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _messages(n: int, nonce: str = "") -> tuple[list[dict[str, str]], dict[str, object]]:
    spec = load_spec(DEFAULT_SPEC)
    if nonce:  # instructions, and so a shared prefix, no other request had
        spec = spec.model_copy(update={"instructions": f"{spec.instructions} ({nonce})"})
    builder = PromptBuilder(spec)
    batch = [
        Instance(
            id=f"p{i}",
            payload={"comment": f"hello {i}"},
            source=SourcePosition(topic="t", partition=0, offset=i),
            size=20,
        )
        for i in range(n)
    ]
    return builder.messages(batch), builder.response_format(n)


def _llm(url: str, timeout_s: float = 10) -> LLM:
    return LLM(
        base_url=url,
        api_key="sk-test",
        model="stream-sim-1",
        timeout_s=timeout_s,
        recovery=Recovery(retry=RetryPolicy(base_s=0.05, cap_s=2)),
    )


async def test_models_and_usage_with_prefix_cache(simulator: tuple[Simulator, str]) -> None:
    sim, url = simulator
    sim.config = sim.config.model_copy(update={"faults": Faults()})
    client = openai.AsyncOpenAI(base_url=url, api_key="x")
    models = await client.models.list()
    assert [m.id for m in models.data] == ["stream-sim-1"]
    llm = _llm(url)
    # A prefix of this test's own: the session's simulator has served the example's prefix
    # to tests before this one, and caches by it.
    messages, fmt = _messages(4, nonce=secrets.token_hex(4))
    first = await llm.complete(messages, fmt)
    second = await llm.complete(messages, fmt)
    assert first.prompt_tokens > 0 and first.completion_tokens > 0
    assert first.cached_tokens == 0  # the first request stores the prefix
    # Same static prefix (over 1,024 tokens with the example's advisors): a hit, reported
    # as OpenAI does, from 1,024 tokens in 128-token steps.
    assert second.cached_tokens >= 1024 and second.cached_tokens % 128 == 0
    await llm.close()
    await client.close()


async def test_retry_after_is_honoured_and_5xx_retried(simulator: tuple[Simulator, str]) -> None:
    sim, url = simulator
    sim.config = sim.config.model_copy(
        update={"faults": Faults(next=["429", "500", "429"], retry_after_s=0.4)}
    )
    llm = _llm(url)
    started = time.monotonic()
    done = await llm.complete(*_messages(2))
    assert '"calls"' in done.text
    assert llm.retries == 3
    assert time.monotonic() - started >= 0.8  # two retry-after waits of 0.4 s
    await llm.close()


async def test_hang_times_out_and_is_retried(simulator: tuple[Simulator, str]) -> None:
    sim, url = simulator
    sim.config = sim.config.model_copy(update={"faults": Faults(next=["hang"], hang_s=30)})
    llm = _llm(url, timeout_s=0.5)
    done = await llm.complete(*_messages(2))
    assert llm.retries == 1 and '"calls"' in done.text
    await llm.close()


async def test_bad_request_is_not_retried(simulator: tuple[Simulator, str]) -> None:
    _, url = simulator
    llm = _llm(url)
    with pytest.raises(LLMError) as err:
        await llm.complete(
            [{"role": "user", "content": "no system message"}], {"type": "json_object"}
        )
    assert err.value.status == 400 and not err.value.retriable
    await llm.close()


class _Seen:
    """A listener that keeps what the client reported."""

    def __init__(self) -> None:
        self.refused: list[int | None] = []

    def observe_latency(self, seconds: float) -> None:
        pass

    def on_retry(self) -> None:
        pass

    def on_circuit(self, is_open: bool) -> None:
        pass

    def on_shape(self, labels: dict[str, str]) -> None:
        return None

    def on_refused(self, status: int | None) -> None:
        self.refused.append(status)


async def test_a_refused_key_mid_run_pauses_loudly_then_resumes(
    simulator: tuple[Simulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    sim, url = simulator
    sim.config = sim.config.model_copy(update={"faults": Faults(next=["401", "401", "401"])})
    seen = _Seen()
    llm = LLM(
        base_url=url,
        api_key="sk-test",
        model="stream-sim-1",
        timeout_s=10,
        recovery=Recovery(retry=RetryPolicy(base_s=0.05, cap_s=0.2)),
        collaborators=Collaborators(listener=seen),
    )
    with caplog.at_level("WARNING", logger="instanced_stream.llm"):
        done = await llm.complete(*_messages(2))
    await llm.close()
    assert '"calls"' in done.text and llm.retries == 3
    assert seen.refused == [401, None]  # once when it started, once when it ended
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "consumption is paused" in errors[0].getMessage()
