"""The processor's HTTP side: Prometheus metrics, health and readiness probes, and a live
page for people (throughput, batch sizes, LLM latency, dead letters, latest decisions
with their advisors' votes, divergence highlighted).

A small aiohttp server of our own on STREAM_WEB_PORT, not faust's web stack: the page and
probes must answer even while the group rebalances or a store restores.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from instanced_stream.errors import StreamError

__all__ = ["WebServer", "claim_port"]


def claim_port(host: str, port: int, setting: str) -> None:
    """Refuses to start on a busy port: a second process on one host would otherwise run
    without probes and metrics, which nobody notices until an incident."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # aiohttp binds with SO_REUSEADDR too: a socket in TIME_WAIT is not "busy".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise StreamError(
                f"port {port} on {host} is busy ({exc.strerror}): set {setting} to a free port"
            ) from exc


class _Source(Protocol):
    registry: CollectorRegistry

    def live(self) -> dict[str, Any]: ...


class WebServer:
    def __init__(
        self,
        metrics: _Source,
        ready: Callable[[], bool],
        host: str,
        port: int,
        model_ok: Callable[[], bool] | None = None,
        partitions: Callable[[], dict[int, dict[str, Any]]] | None = None,
        units: Callable[[], dict[str, int]] | None = None,
        group: Callable[[], dict[str, Any]] | None = None,
        ideas: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.ready = ready
        # Each assigned partition's unit (open, restoring, failing), in /readyz's body and
        # on the live page: which partitions a not-ready processor does not serve yet.
        self.partitions = partitions
        # /api/live's `units`: per partition owned here, its consumed records not yet
        # committed (what a crash there leaves to be redone; fault tests aim by it).
        self.units = units
        # This member's place in its group (stable, epoch, rebalances in the last minute):
        # why a processor whose partitions all serve can still be not ready.
        self.group = group
        # Said in /readyz's body, never in its status: an LLM outage is the same for
        # every pod, so a readiness that followed it would make every pod unready at once
        # (PodDisruptionBudgets then block drains, rollouts stall) while nothing a pod
        # restart or a reschedule could fix. It is a metric and an alert instead.
        self.model_ok = model_ok
        # The plans' Idea Process (runtime/pipeline/idea_view.py): graphs and counts only.
        self.ideas = ideas
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        # prometheus-client's own handler: the text format or OpenMetrics as the scraper
        # asks (Accept), gzip when it accepts it, `?name[]=` to pick series
        app.router.add_get("/metrics", make_aiohttp_handler(self.metrics.registry))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/api/live", self._live)
        app.router.add_get("/api/ideas", self._ideas)
        app.router.add_get("/", self._page)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            await self._runner.cleanup()
            raise StreamError(f"port {self.port} on {self.host} is busy: {exc.strerror}") from exc

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.ready()
        body: dict[str, Any] = {"ready": ok}
        if self.model_ok is not None:
            body["model_ok"] = self.model_ok()
        if self.partitions is not None:
            body["partitions"] = {str(p): v for p, v in self.partitions().items()}
        if self.group is not None:
            body["group"] = self.group()
        return web.json_response(body, status=200 if ok else 503)

    async def _live(self, _: web.Request) -> web.Response:
        live = self.metrics.live()
        if self.partitions is not None:
            live["partitions"] = {str(p): v for p, v in self.partitions().items()}
        if self.units is not None:
            live["units"] = self.units()
        if self.group is not None:
            live["group"] = self.group()
        return web.Response(body=orjson.dumps(live), content_type="application/json")

    async def _ideas(self, _: web.Request) -> web.Response:
        """The Idea Process of each plan edition: its steps, their edges and counts."""
        plans = self.ideas() if self.ideas is not None else []
        return web.Response(body=orjson.dumps({"plans": plans}), content_type="application/json")

    async def _page(self, _: web.Request) -> web.Response:
        page = resources.files("instanced_stream.observe").joinpath("live.html").read_text()
        return web.Response(text=page, content_type="text/html")
