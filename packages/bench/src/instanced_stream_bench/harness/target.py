"""Which model a harness run (demo, eval, bench) talks to: the bundled simulator, a real model
served locally by llama.cpp, or the user's own OpenAI-compatible endpoint.

    --llm simulator   the simulator (default): fast, fault injection, not a model
    --llm local       SmolLM2-135M served by llama.cpp on this machine (extra `local`)
    --llm URL         any endpoint (OpenAI, Azure, vLLM, Ollama, llama.cpp); the model is
                      STREAM_LLM_MODEL or the spec's model.name, the key as for `process`
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from instanced_stream.errors import StreamError
from prometheus_client.parser import text_string_to_metric_families

from instanced_stream_bench.testing.broker import free_port
from instanced_stream_bench.testing.sim.server import (
    MODEL_NAME,
    SimConfig,
    Simulator,
    running_simulator,
)

__all__ = ["SimProcess", "Target", "llm_target", "processor_live", "processor_usage"]

Kind = Literal["simulator", "local", "endpoint"]


@dataclass(frozen=True, slots=True)
class Target:
    kind: Kind
    url: str
    model: str
    sim: Simulator | None = None  # the simulator itself, when kind is "simulator"
    slots: int | None = None  # requests it serves at once, where known

    def describe(self) -> str:
        if self.kind == "simulator":
            return f"LLM simulator {self.url} (a simulator, not a model)"
        if self.kind == "local":
            return f"local model {self.model} (llama.cpp) at {self.url}"
        return f"model {self.model} at {self.url}"

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "model": self.model, "url": self.url}
        if self.sim is not None:
            # The orders the simulator wrote stateful plans in (instances per order).
            orders = {
                k.removeprefix("plan_order."): int(v)
                for k, v in self.sim.stats.items()
                if k.startswith("plan_order.")
            }
            if orders:
                out["plan_orders"] = orders
        return out


@contextmanager
def llm_target(
    choice: str, sim_config: SimConfig | None = None, model: str | None = None
) -> Iterator[Target]:
    """Starts what `choice` names (or takes the URL) for as long as the block runs."""
    if choice == "simulator":
        with running_simulator(sim_config) as (sim, url):
            yield Target("simulator", url, MODEL_NAME, sim)
    elif choice == "local":
        from instanced_stream_bench.testing.local_model import DEFAULT_PARALLEL, running_local_llm

        with running_local_llm() as (url, served):
            yield Target("local", url, served, slots=DEFAULT_PARALLEL)
    elif choice.startswith(("http://", "https://")):
        if not model:
            raise StreamError("--llm URL needs a model name: set STREAM_LLM_MODEL")
        yield Target("endpoint", choice.rstrip("/"), model)
    else:
        raise StreamError(f"--llm takes simulator, local or an http(s) URL, not {choice!r}")


class SimProcess:
    """`stream llm-sim` as its own OS process, so its work does not share our GIL."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = workdir / "simulator.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self._log.open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "instanced_stream", "llm-sim", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def ready(self, wait_s: float = 60) -> None:
        deadline = time.monotonic() + wait_s
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(f"{self.url}/v1/models") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the simulator did not start; see {self._log}")
                await asyncio.sleep(0.2)

    async def configure(self, config: dict[str, Any]) -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/sim/config", json=config) as resp,
        ):
            resp.raise_for_status()

    async def stats(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/sim/stats") as resp:
            data: dict[str, Any] = await resp.json()
        return {k: float(v) for k, v in _flat(data).items()}

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(10)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        elif isinstance(value, int | float):
            out[prefix + key] = float(value)
    return out


_USAGE = {
    "instanced_stream_llm_latency_seconds_count": "completions",
    "instanced_stream_llm_latency_seconds_sum": "latency_s",
    "instanced_stream_llm_retries_total": "failed",
    "instanced_stream_batch_size_sum": "instances",
}


_KINDS = {
    "input": ("prompt_tokens",),
    "cached_input": ("prompt_tokens", "cached_tokens"),
    "output": ("completion_tokens",),
}


async def processor_usage(ports: Iterable[int]) -> dict[str, float]:
    """What processors counted of their model use, summed over their /metrics pages, in
    the simulator's own terms (requests, tokens, instances): for endpoints that keep no
    count we can read."""
    got: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        for port in ports:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    key = _USAGE.get(sample.name)
                    if sample.name == "instanced_stream_tokens_total":
                        # input + cached_input is the providers' prompt_tokens
                        keys = _KINDS.get(sample.labels["kind"], ())
                    else:
                        keys = (key,) if key is not None else ()
                    for each in keys:
                        got[each] = got.get(each, 0.0) + sample.value
    got["requests"] = got.get("completions", 0.0) + got.get("failed", 0.0)
    return got


async def processor_live(port: int) -> dict[str, Any]:
    """A processor's live figures (its page's /api/live)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/api/live") as resp,
    ):
        data: dict[str, Any] = await resp.json()
    return data
