"""The batch tier's model against the simulator's Files and Batches endpoints (in this
process, over HTTP with the openai client): one batch for many requests, billed at half
price; expired lines, failed and cancelled batches handled; a restarted model polls the
batch already submitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import BatchTier, ModelEndpoint, load_spec
from instanced_stream.llm.batch_api import BatchModel
from instanced_stream.llm.client import LLM
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.server import MODEL_NAME, SimConfig, Simulator

from tests.fakes import make_batch

FAST = BatchTier(flush_s=0.05, poll_s=0.05, max_requests=50, max_resubmits=10)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Simulator, TestClient[Any, Any]]]:
    sim = Simulator(SimConfig(batch_delay_s=0.1, classifier=False))
    client: TestClient[Any, Any] = TestClient(TestServer(sim.app()))
    await client.start_server()
    try:
        yield sim, client
    finally:
        await client.close()


class _Submitted(list[Any]):
    """What the model reports as submitted, and an event set on the first report."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def __call__(self, batch: str, lines: list[Any]) -> None:
        self.append((batch, lines))
        self.event.set()


def _model(client: TestClient[Any, Any], tier: BatchTier = FAST) -> tuple[BatchModel, _Submitted]:
    llm = LLM(base_url=str(client.make_url("/v1")), api_key="k", model=MODEL_NAME, timeout_s=10)
    submitted = _Submitted()
    model = BatchModel(llm, tier, submitted)
    model.start()
    return model, submitted


def _ask(model: BatchModel, k: int) -> Any:
    builder = PromptBuilder(load_spec(DEFAULT_SPEC))
    batch = make_batch([f"A kind remark {k}.", f"Another useful note {k}."])
    keys = tuple(i.key for i in batch)
    return model.complete(builder.messages(batch), builder.response_format(2), items=2, keys=keys)


def _calls(text: str) -> int:
    return len(orjson.dumps(orjson.loads(text)))


async def test_requests_go_out_as_one_batch_billed_at_half_price(
    served: tuple[Simulator, TestClient[Any, Any]],
) -> None:
    sim, client = served
    model, submitted = _model(client)
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(_ask(model, k) for k in range(3))), 20)
    finally:
        await model.close()
    assert all(_calls(a.text) > 2 for a in answers)
    assert sim.stats["batches_created"] == 1 and sim.stats["batch_lines_submitted"] == 3
    assert len(submitted) == 1 and len(submitted[0][1]) == 3
    # Billed as batch tokens, none as online ones.
    assert sim.stats["batch_prompt_tokens"] > 0 and sim.stats["prompt_tokens"] == 0
    prices = ModelEndpoint(price_input_per_million=1.0, price_output_per_million=4.0)
    assert prices.cost_usd(1000, 100, batch=True) == pytest.approx(prices.cost_usd(1000, 100) / 2)


async def test_expired_lines_and_a_failed_batch_are_submitted_again(
    served: tuple[Simulator, TestClient[Any, Any]],
) -> None:
    sim, client = served
    sim.config = sim.config.model_copy(update={"batch_expire_rate": 0.4, "batch_fail_next": 1})
    model, _ = _model(client)
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(_ask(model, k) for k in range(6))), 30)
    finally:
        await model.close()
    assert len(answers) == 6 and all(a.text for a in answers)
    assert sim.stats["batches_failed"] == 1
    assert sim.stats["batches_expired"] >= 1
    assert model.counts["lines_resubmitted"] >= 6 + 1  # the failed batch's, and expired ones


async def test_a_cancelled_batch_is_noticed_and_its_requests_go_out_again(
    served: tuple[Simulator, TestClient[Any, Any]],
) -> None:
    sim, client = served
    sim.config = sim.config.model_copy(update={"batch_delay_s": 30.0})
    model, submitted = _model(client)
    try:
        asked = asyncio.gather(*(_ask(model, k) for k in range(2)))
        await asyncio.wait_for(submitted.event.wait(), 10)
        sim.config = sim.config.model_copy(update={"batch_delay_s": 0.1})
        resp = await client.post(f"/v1/batches/{submitted[0][0]}/cancel")
        assert (await resp.json())["status"] == "cancelled"
        answers = await asyncio.wait_for(asked, 20)
    finally:
        await model.close()
    assert len(answers) == 2
    assert model.counts["batches_cancelled"] == 1
    assert sim.stats["batches_created"] == 2


async def test_a_restarted_model_polls_the_batch_already_submitted(
    served: tuple[Simulator, TestClient[Any, Any]],
) -> None:
    sim, client = served
    sim.config = sim.config.model_copy(update={"batch_delay_s": 0.5})
    first, submitted = _model(client)
    asked = asyncio.ensure_future(_ask(first, 1))
    await asyncio.wait_for(submitted.event.wait(), 10)
    await first.close()  # gone before the answer, as a killed processor is
    asked.cancel()
    batch_id, [(custom_id, keys)] = submitted[0]
    second, resubmitted = _model(client)
    second.resume(keys, batch_id, custom_id)
    try:
        answer = await asyncio.wait_for(_ask(second, 1), 20)
    finally:
        await second.close()
    assert _calls(answer.text) > 2
    assert sim.stats["batches_created"] == 1 and not resubmitted
    assert second.counts["resumed_lines"] == 1 and second.counts["batches_adopted"] == 1
