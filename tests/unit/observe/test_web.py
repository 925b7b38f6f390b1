"""/metrics is prometheus-client's own aiohttp handler: the text format by default,
OpenMetrics when the scraper asks for it, gzip when accepted, `name[]` to pick series."""

from __future__ import annotations

import gzip

from aiohttp.test_utils import TestClient, TestServer
from instanced_stream.observe.metrics import Metrics
from instanced_stream.observe.web import WebServer
from prometheus_client import Counter


async def test_metrics_are_served_by_the_librarys_handler() -> None:
    metrics = Metrics()
    # a series of the test's own in the processor's registry (the product's names change)
    Counter("probe_hits", "the test's probe", registry=metrics.registry).inc(3)
    server = WebServer(metrics, ready=lambda: True, host="127.0.0.1", port=0)
    async with TestClient(TestServer(server.app())) as client:
        plain = await client.get("/metrics")
        assert plain.status == 200
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await plain.text()
        assert "probe_hits_total 3.0" in text and "process_resident_memory_bytes" in text

        om = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await om.text()).rstrip().endswith("# EOF")

        picked = await client.get("/metrics", params={"name[]": "probe_hits_total"})
        assert (await picked.text()).count("# TYPE") == 1

        zipped = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert zipped.headers.get("Content-Encoding") == "gzip"
        assert b"probe_hits_total" in gzip.decompress(await zipped.read())
