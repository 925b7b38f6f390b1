"""The SIMULATOR's Files and Batches endpoints, shaped as OpenAI documents them.

`POST /v1/files` (multipart, purpose `batch`) keeps an uploaded JSONL file; `GET
/v1/files/{id}/content` returns a file's bytes. `POST /v1/batches` (input_file_id,
endpoint `/v1/chat/completions`, completion_window `24h`) validates the file, then
answers it after `SimConfig.batch_delay_s`: every line through the simulator's own chat
completion, off-line (no latency, no per-minute limits, tokens counted apart as
`batch_*`, billed at the Batch API's price). Answers go to an output file, failures to
an error file, one JSON line each with the request's `custom_id`. `GET /v1/batches/{id}`
says where a batch stands; `POST /v1/batches/{id}/cancel` cancels it.

Faults: `batch_expire_rate` of the lines are left unanswered (the batch ends `expired`,
those lines in the error file as `batch_expired`), `batch_error_rate` fail with a 500,
and the next `batch_fail_next` batches fail as a whole. Every step is counted in the
simulator's stats (`batches_created`, `batch_lines`, `batch_polls`, ...), so a test can
tell a batch polled from a batch submitted again.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
from aiohttp import ClientSession, web

from instanced_stream_bench.testing.sim.account import SimConfig

__all__ = ["BatchEndpoints", "Chat"]

_ENDPOINT = "/v1/chat/completions"
_EXPIRED = "This request could not be executed before the completion window expired."


def _not_found(what: str) -> web.Response:
    return web.json_response(
        {"error": {"message": f"No such {what} (simulated)", "type": "invalid_request_error"}},
        status=404,
    )


def _line(custom_id: str, status: int | None, body: Any, error: Any = None) -> bytes:
    response = None if status is None else {"status_code": status, "body": body}
    if response is not None:
        response["request_id"] = f"simreq-{secrets.token_hex(6)}"
    row = {"id": f"batch_req_{secrets.token_hex(8)}", "custom_id": custom_id}
    return orjson.dumps({**row, "response": response, "error": error}) + b"\n"


class Chat(Protocol):
    """What the endpoints need of the simulator that serves them (`server.Simulator`): its
    chat completion, its configuration (a batch failing as a whole counts
    `batch_fail_next` down in it), its stats and its random draws."""

    config: SimConfig
    rng: random.Random
    stats: Counter[str]

    async def respond(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str],
        query: Mapping[str, str],
        *,
        batch: bool = False,
    ) -> web.Response:
        """One chat completion; `batch`: a Batch API line, answered off-line."""


class BatchEndpoints:
    def __init__(self, sim: Chat) -> None:
        self.sim = sim
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files/{id}", self.file)
        app.router.add_get("/v1/files/{id}/content", self.content)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches/{id}", self.retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self.cancel)

    def _count(self, what: str, n: int = 1) -> None:
        self.sim.stats[what] += n

    def _keep(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = f"file-{secrets.token_hex(12)}"
        self.contents[file_id] = data
        self.files[file_id] = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        return self.files[file_id]

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, web.FileField) or purpose not in ("batch", "batch_output"):
            return web.json_response(
                {"error": {"message": "a file and purpose 'batch' are required (simulated)"}},
                status=400,
            )
        self._count("files_uploaded")
        return web.json_response(self._keep(upload.file.read(), upload.filename, str(purpose)))

    async def file(self, request: web.Request) -> web.Response:
        found = self.files.get(request.match_info["id"])
        return web.json_response(found) if found else _not_found("file")

    async def content(self, request: web.Request) -> web.Response:
        data = self.contents.get(request.match_info["id"])
        if data is None:
            return _not_found("file")
        self._count("files_downloaded")
        return web.Response(body=data, content_type="application/jsonl")

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        input_id = str(body.get("input_file_id"))
        if body.get("endpoint") != _ENDPOINT or body.get("completion_window") != "24h":
            return web.json_response(
                {"error": {"message": "endpoint must be /v1/chat/completions, window 24h"}},
                status=400,
            )
        if input_id not in self.files:
            return _not_found("file")
        now = int(time.time())
        batch_id = f"batch_{secrets.token_hex(12)}"
        batch: dict[str, Any] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": _ENDPOINT,
            "errors": None,
            "input_file_id": input_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "expires_at": now + 24 * 3600,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        self.batches[batch_id] = batch
        self._count("batches_created")
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("authorization", "api-key")
        }
        self._tasks[batch_id] = asyncio.create_task(self._run(batch, headers))
        return web.json_response(batch)

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _not_found("batch")
        self._count("batch_polls")
        return web.json_response(batch)

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _not_found("batch")
        if batch["status"] in ("validating", "in_progress"):
            batch["status"] = "cancelling"
            batch["cancelling_at"] = int(time.time())
            self._count("batches_cancelled")
            task = self._tasks.pop(batch["id"], None)
            if task is not None:
                task.cancel()
            batch["status"], batch["cancelled_at"] = "cancelled", int(time.time())
        return web.json_response(batch)

    def _fail(self, batch: dict[str, Any], message: str, line: int | None = None) -> None:
        error = {"code": "invalid_request", "message": message, "param": None, "line": line}
        batch.update(status="failed", failed_at=int(time.time()))
        batch["errors"] = {"object": "list", "data": [error]}
        self._count("batches_failed")

    def _rows(self, batch: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The input file's requests, or None when it does not validate (batch failed)."""
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for k, text in enumerate(self.contents[batch["input_file_id"]].splitlines(), 1):
            if not text.strip():
                continue
            row = orjson.loads(text)
            custom_id = row.get("custom_id")
            if not isinstance(custom_id, str) or custom_id in seen:
                self._fail(batch, "every line needs a unique custom_id", k)
                return None
            if row.get("method") != "POST" or row.get("url") != _ENDPOINT:
                self._fail(batch, f"lines must POST to {_ENDPOINT}", k)
                return None
            seen.add(custom_id)
            rows.append(row)
        return rows

    async def _answer(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        """A line's answer: the simulator's own, or the upstream model's (a real one)."""
        upstream = self.sim.config.batch_upstream
        if upstream is None:
            answer = await self.sim.respond(body, headers, {}, batch=True)
            assert isinstance(answer.body, bytes)
            return answer.status, orjson.loads(answer.body)
        async with (
            ClientSession() as session,
            session.post(f"{upstream.rstrip('/')}/chat/completions", json=body) as resp,
        ):
            found = await resp.json(content_type=None)
        usage = found.get("usage") or {} if isinstance(found, dict) else {}
        for kind in ("prompt_tokens", "completion_tokens"):
            self._count(f"batch_{kind}", int(usage.get(kind) or 0))
        return resp.status, found

    async def _run(self, batch: dict[str, Any], headers: dict[str, str]) -> None:
        cfg = self.sim.config
        if cfg.batch_fail_next > 0:
            self.sim.config = cfg.model_copy(update={"batch_fail_next": cfg.batch_fail_next - 1})
            self._fail(batch, "the batch failed as a whole (simulated)")
            return
        rows = self._rows(batch)
        if rows is None:
            return
        self._count("batch_lines_submitted", len(rows))
        batch.update(status="in_progress", in_progress_at=int(time.time()))
        batch["request_counts"]["total"] = len(rows)
        await asyncio.sleep(cfg.batch_delay_s)
        batch.update(status="finalizing", finalizing_at=int(time.time()))
        out, errors = b"", b""
        expired = 0
        for row in rows:
            draw = self.sim.rng.random()
            if draw < cfg.batch_expire_rate:
                expired += 1
                errors += _line(
                    row["custom_id"], None, None, {"code": "batch_expired", "message": _EXPIRED}
                )
                continue
            if draw < cfg.batch_expire_rate + cfg.batch_error_rate:
                fault = {"error": {"message": "server error (simulated)", "type": "server_error"}}
                errors += _line(row["custom_id"], 500, fault)
                batch["request_counts"]["failed"] += 1
                continue
            self._count("batch_lines")
            status, body = await self._answer(row["body"], headers)
            line = _line(row["custom_id"], status, body)
            if status == 200:
                out += line
                batch["request_counts"]["completed"] += 1
            else:
                errors += line
                batch["request_counts"]["failed"] += 1
        if out:
            batch["output_file_id"] = self._keep(out, "output.jsonl", "batch_output")["id"]
        if errors:
            batch["error_file_id"] = self._keep(errors, "errors.jsonl", "batch_output")["id"]
        now = int(time.time())
        if expired:
            batch.update(status="expired", expired_at=now)
            self._count("batches_expired")
        else:
            batch.update(status="completed", completed_at=now)
        self._count("batches_completed")
