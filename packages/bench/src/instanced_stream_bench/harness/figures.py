"""What a bench row says about the model: requests, tokens and dollars per item, and the
ceiling `window x in-flight / latency`, from the endpoint's counts before and after.

Batch API lines (the batch tier) are counted apart by the simulator (`batch_*` tokens,
`batch_lines_submitted`) and priced at the Batch API's price, so a row of the batch
tier shows what the provider would bill for it, online re-asks included at theirs.

Beside the spec's own bill, the same tokens are billed under every cache preset
(`instanced_stream.core.cache_rule.PRESETS`): the simulator counts what each rule's cache
would read and write for every request (`cache_read:<preset>`, `cache_written:<preset>`).
"""

from __future__ import annotations

from instanced_stream.core.cache_rule import PRESETS
from instanced_stream.core.spec import ModelEndpoint

from instanced_stream_bench.harness.report import Endpoint, Result

__all__ = ["llm_figures"]


def llm_figures(
    result: Result,
    before: dict[str, float],
    after: dict[str, float],
    ep: Endpoint,
    in_flight: int,
    prices: ModelEndpoint,
    slots: int | None,
) -> None:
    """`slots`: a real endpoint's (its measured latency makes the ceiling); None: the
    simulator, whose configured latency does."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    n = max(result.items, 1)
    answered = delta("completions")
    # A processor's start-up probe is not the stream's work; a batch line is a request.
    requests = delta("requests") - delta("probes") + delta("batch_lines_submitted")
    lines_answered = delta("batch_lines")
    result.requests_per_item = requests / n
    result.refused_per_item = max(0.0, requests - answered - _expired(before, after)) / n
    prompt = delta("prompt_tokens") + delta("batch_prompt_tokens")
    cached = delta("cached_tokens") + delta("batch_cached_tokens")
    result.prompt_per_item = prompt / n
    result.completion_per_item = (delta("completion_tokens") + delta("batch_completion_tokens")) / n
    cost = prices.cost_usd(
        int(delta("prompt_tokens")), int(delta("completion_tokens")), int(delta("cached_tokens"))
    ) + prices.cost_usd(
        int(delta("batch_prompt_tokens")),
        int(delta("batch_completion_tokens")),
        int(delta("batch_cached_tokens")),
        batch=True,
    )
    result.cost_per_item_usd = cost / n
    for name, preset in PRESETS.items():
        if f"cache_read:{name}" not in after:
            continue  # a real endpoint: its own cache, no preset's counts
        bill = 0.0
        for tier in ("", "batch_"):
            bill += prices.cost_usd(
                int(delta(f"{tier}prompt_tokens")),
                int(delta(f"{tier}completion_tokens")),
                int(delta(f"{tier}cache_read:{name}")),
                written=int(delta(f"{tier}cache_written:{name}")),
                batch=tier == "batch_",
                rule=preset.rule,
            )
        result.cost_by_rule[name] = bill / n
    # Who wrote the answer's tokens (the simulator's count): what each advisor costs.
    for key in after:
        if key.startswith("answer_tokens:") and delta(key) > 0:
            result.answer_parts[key.removeprefix("answer_tokens:")] = delta(key) / n
    if prompt:
        result.cached_share = cached / prompt
    if not answered:
        return
    result.mean_batch = delta("instances") / answered
    if lines_answered:
        return  # the batch tier: its pace is the Batch API's turnaround, not a ceiling
    if slots is not None or ep.instant:
        if slots is not None:
            # A real endpoint: its own measured latency, and as many requests at once as
            # it serves (llama.cpp: its slots) or the processors send.
            n_slots = min(slots, in_flight)
            result.ceiling_per_s = n_slots * result.mean_batch / (delta("latency_s") / answered)
        return
    # The ceiling with the endpoint's own latency for the answers it gave, and its
    # tokens-per-minute bound.
    per_request_ms = ep.latency_ms + ep.per_output_token_ms * (
        delta("completion_tokens") / answered
    )
    n_slots = min(ep.concurrency, in_flight)
    by_latency = n_slots * result.mean_batch / (per_request_ms / 1000)
    tokens = result.prompt_per_item + result.completion_per_item
    by_tpm = ep.tokens_per_minute / 60 / tokens if tokens else by_latency
    result.ceiling_per_s = min(by_latency, by_tpm)


def _expired(before: dict[str, float], after: dict[str, float]) -> float:
    """Batch lines that were submitted but not answered (expired or failed): asked again,
    not refused."""
    submitted = after.get("batch_lines_submitted", 0.0) - before.get("batch_lines_submitted", 0.0)
    answered = after.get("batch_lines", 0.0) - before.get("batch_lines", 0.0)
    return max(0.0, submitted - answered)
