"""The batch tier: requests answered through the provider's Batch API at half price.

`BatchModel` is a `Model` like the online `LLM`: the solver asks it, validates what comes
back and re-asks, unchanged. Instead of sending each request, it writes it as one line
of a batch input file (`/v1/files`, purpose `batch`) and submits the file as a batch
(`/v1/batches`, endpoint `/v1/chat/completions`) every `batch.flush_s`, or sooner once
`batch.max_requests` lines wait. Submitted batches are polled every `batch.poll_s`; a
finished one's output file answers its lines, and its error file says which failed.

- A line that expired (the batch passed its completion window) or failed for the
  endpoint's sake (5xx, 429) is submitted again in the next batch, up to
  `batch.max_resubmits` times; a line refused for its content (400) is raised to the
  solver, which splits the request to isolate the item, as online.
- A batch that failed as a whole (its input file did not validate) is submitted again;
  one cancelled (by an operator, at the provider) is noticed, logged and counted, and its
  unanswered lines are submitted again.
- Durability: `on_submitted` hands every submitted line (its batch id, custom id and the
  keys of the instances it asks about) to the caller, who records it in its state. After
  a restart the caller registers those lines with `resume`; a request asking about the
  same keys is then answered by polling the batch already submitted, never sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
import orjson

from instanced_stream.core.model import Completion
from instanced_stream.core.spec import BatchTier
from instanced_stream.errors import LLMError
from instanced_stream.llm.client import LLM

__all__ = ["BatchModel", "Submitted", "completion_of", "read_results"]

log = logging.getLogger("instanced_stream.llm.batch_api")

ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
# Statuses of a batch still on its way (OpenAI's names).
_RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
# A submission or poll that failed for the endpoint's sake is tried again this much later.
_BACKOFF_S = 2.0
# Answers of a batch adopted after a restart that no request claimed: kept this long.
_UNCLAIMED_S = 600.0

# The caller's record of a submitted batch: its id and, per line, (custom id, keys).
Submitted = Callable[[str, list[tuple[str, tuple[str, ...]]]], None]


@dataclass(eq=False, slots=True)
class _Line:
    custom_id: str
    keys: tuple[str, ...]
    body: dict[str, Any] | None  # None: adopted after a restart, not asked again yet
    future: asyncio.Future[Completion] | None = None
    tries: int = 0
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False, slots=True)
class _Batch:
    id: str
    lines: dict[str, _Line]
    submitted_at: float  # wall clock: an adopted batch keeps its age across restarts
    answers: dict[str, Completion | LLMError] = field(default_factory=dict)
    done_at: float | None = None


def completion_of(body: dict[str, Any], latency_s: float) -> Completion:
    """A chat completion body (an output line's `response.body`) as the solver reads it."""
    choice = (body.get("choices") or [{}])[0]
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    thought = usage.get("completion_tokens_details") or {}
    return Completion(
        text=(choice.get("message") or {}).get("content") or "",
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        latency_s=latency_s,
        reasoning_tokens=int(thought.get("reasoning_tokens") or 0),
    )


def read_results(raw: bytes, latency_s: float) -> dict[str, Completion | LLMError]:
    """A batch's output or error file: per custom id, its answer or why it has none."""
    out: dict[str, Completion | LLMError] = {}
    for text in raw.splitlines():
        if not text.strip():
            continue
        row = orjson.loads(text)
        response, error = row.get("response") or {}, row.get("error")
        status = int(response.get("status_code") or 0)
        if error is None and status == 200:
            out[row["custom_id"]] = completion_of(response.get("body") or {}, latency_s)
            continue
        said = (error or (response.get("body") or {}).get("error") or {}).get("message")
        code = (error or (response.get("body") or {}).get("error") or {}).get("code")
        out[row["custom_id"]] = LLMError(
            f"batch line answered {status or code}: {said}",
            # A 400 depends on what the items say: the solver splits to find the item.
            retriable=status != 400,
            status=status or None,
            content=status == 400,
            code=code,
            said=said,
        )
    return out


class BatchModel:
    """`llm`: the online model, whose client, request shape and caps the lines use (and
    which answers re-asks when the spec's `batch.reask` is online)."""

    def __init__(self, llm: LLM, settings: BatchTier, on_submitted: Submitted) -> None:
        self.llm = llm
        self.model = llm.model
        self.settings = settings
        self.on_submitted = on_submitted
        self.client = llm.client
        self.pending: list[_Line] = []
        self.batches: dict[str, _Batch] = {}
        self.resumable: dict[tuple[str, ...], tuple[str, str]] = {}
        self._asked: set[str] = set()  # keys asked in a batch whose outcome is not staged
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.counts: dict[str, int] = {}

    # ------------------------------------------------------------------ asking

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion:
        body = self._body(messages, response_format, max_tokens)
        found = self.resumable.pop(keys, None) if keys else None
        if found is not None:
            self._count("resumed_lines")
            return await self._claim(found[0], found[1], keys, body)
        if self.settings.reask == "online" and keys and self._asked.intersection(keys):
            self._count("online_reasks")
            return await self.llm.complete(
                messages, response_format, items=items, max_tokens=max_tokens, since=since
            )
        self._asked.update(keys)
        line = _Line(f"req-{secrets.token_hex(8)}", keys, body)
        line.future = asyncio.get_running_loop().create_future()
        self.pending.append(line)
        if len(self.pending) >= self.settings.max_requests:
            self._wake.set()
        return await line.future

    def _body(
        self, messages: list[dict[str, str]], rf: dict[str, Any], max_tokens: int | None
    ) -> dict[str, Any]:
        # Built as the online client builds its requests, in the shape it uses now.
        request = self.llm.request
        return request.body(self.model, messages, rf, request.cap(max_tokens))

    def resume(self, keys: tuple[str, ...], batch_id: str, custom_id: str) -> None:
        """A line submitted before a restart: the request asking about `keys` polls it."""
        self.resumable[keys] = (batch_id, custom_id)

    def forget(self, keys: list[str]) -> None:
        """These instances' outcomes are staged: a later request about them is a new ask."""
        self._asked.difference_update(keys)

    async def _claim(
        self, batch_id: str, custom_id: str, keys: tuple[str, ...], body: dict[str, Any]
    ) -> Completion:
        batch = self.batches.get(batch_id)
        if batch is None:  # submitted before a restart: polled from now on
            batch = self.batches[batch_id] = _Batch(batch_id, {}, time.time())
            self._count("batches_adopted")
            self._wake.set()
        line = batch.lines.get(custom_id) or _Line(custom_id, keys, body)
        line.body = body  # rebuilt identically: what a resubmission sends
        line.future = asyncio.get_running_loop().create_future()
        batch.lines[custom_id] = line
        settled = batch.answers.pop(custom_id, None)
        if settled is not None:
            self._settle_line(line, settled)
        elif batch.done_at is not None:  # the batch never answered this line
            self._resubmit(line, "missing from the finished batch")
        return await line.future

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._flushing(), name="batch-flush"),
            asyncio.create_task(self._polling(), name="batch-poll"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.llm.close()

    async def _flushing(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.2)
            self._wake.clear()
            if not self.pending:
                continue
            due = time.monotonic() - self.pending[0].queued_at >= self.settings.flush_s
            if due or len(self.pending) >= self.settings.max_requests:
                lines = self.pending[: self.settings.max_requests]
                del self.pending[: len(lines)]
                await self._submit(lines)
                if self.pending:
                    self._wake.set()

    async def _submit(self, lines: list[_Line]) -> None:
        """One batch of `lines`, tried until the endpoint takes it (an outage waits)."""
        data = b"".join(
            orjson.dumps(
                {"custom_id": x.custom_id, "method": "POST", "url": ENDPOINT, "body": x.body}
            )
            + b"\n"
            for x in lines
        )
        while True:
            try:
                uploaded = await self.client.files.create(
                    file=("requests.jsonl", data, "application/jsonl"), purpose="batch"
                )
                created = await self.client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint=ENDPOINT,
                    completion_window=self.settings.completion_window,
                )
                break
            except openai.OpenAIError as exc:
                if isinstance(exc, openai.NotFoundError) and not self.counts.get("submit_failures"):
                    # An endpoint without a Batch API (llama.cpp's server has none): say so once.
                    log.error("the endpoint has no Batch API (%r): use model.tier online", exc)
                log.warning("batch of %d requests not submitted (%r); again soon", len(lines), exc)
                self._count("submit_failures")
                await asyncio.sleep(_BACKOFF_S)
        self.batches[created.id] = _Batch(created.id, {x.custom_id: x for x in lines}, time.time())
        self._count("batches_submitted")
        self._count("lines_submitted", len(lines))
        log.info("batch %s submitted: %d requests", created.id, len(lines))
        self.on_submitted(created.id, [(x.custom_id, x.keys) for x in lines])

    async def _polling(self) -> None:
        while True:
            for batch in [b for b in self.batches.values() if b.done_at is None]:
                try:
                    await self._poll(batch)
                except openai.OpenAIError as exc:
                    log.warning("batch %s not polled (%r); again next time", batch.id, exc)
            self._prune()
            await asyncio.sleep(self.settings.poll_s)

    async def _poll(self, batch: _Batch) -> None:
        found = await self.client.batches.retrieve(batch.id)
        self._count("polls")
        if found.status in _RUNNING:
            return
        answers: dict[str, Completion | LLMError] = {}
        for file_id in (found.output_file_id, found.error_file_id):
            if file_id:
                content = await self.client.files.content(file_id)
                answers |= read_results(content.content, time.time() - batch.submitted_at)
        batch.done_at = time.time()
        if found.status == "failed":
            reasons = [e.message for e in (found.errors.data if found.errors else []) or []]
            log.error("batch %s failed as a whole (%s); submitted again", batch.id, reasons)
            self._count("batches_failed")
        elif found.status == "cancelled":
            log.warning("batch %s was cancelled; its unanswered requests go out again", batch.id)
            self._count("batches_cancelled")
        elif found.status == "expired":
            self._count("batches_expired")
        for custom_id, line in list(batch.lines.items()):
            got = answers.pop(custom_id, None)
            if got is None:
                self._resubmit(line, f"batch {found.status} without answering it")
            else:
                self._settle_line(line, got)
        batch.answers = answers  # lines a restarted processor has not claimed yet

    def _settle_line(self, line: _Line, got: Completion | LLMError) -> None:
        if isinstance(got, LLMError) and got.retriable:
            self._resubmit(line, got.message)
            return
        if line.future is None or line.future.done():
            return
        if isinstance(got, LLMError):
            line.future.set_exception(got)
        else:
            self._count("lines_answered")
            line.future.set_result(got)

    def _resubmit(self, line: _Line, why: str) -> None:
        if line.future is None or line.future.done():
            return  # adopted and not claimed: the request that claims it asks again
        line.tries += 1
        if line.body is None or line.tries > self.settings.max_resubmits:
            line.future.set_exception(
                LLMError(
                    f"batch request failed {line.tries} times: {why}", retriable=True, server=True
                )
            )
            return
        log.info("batch request %s submitted again: %s", line.custom_id, why)
        self._count("lines_resubmitted")
        line.queued_at = time.monotonic() - self.settings.flush_s  # with the next flush
        self.pending.append(line)
        self._wake.set()

    def _prune(self) -> None:
        now = time.time()
        for batch_id, batch in list(self.batches.items()):
            open_lines = any(
                x.future is not None and not x.future.done() for x in batch.lines.values()
            )
            old = batch.done_at is not None and now - batch.done_at > _UNCLAIMED_S
            if batch.done_at is not None and not open_lines and (not batch.answers or old):
                del self.batches[batch_id]

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def in_flight(self) -> list[float]:
        """The age in seconds of every batch submitted and not finished."""
        now = time.time()
        return [now - b.submitted_at for b in self.batches.values() if b.done_at is None]
