"""Observability, the floor above the core: Prometheus metrics, OpenTelemetry traces,
the HTTP server of probes and the live page, log formatting, progress lines, and the
window's agreement figures. Imports only the core and the package's base modules; modules
are imported where used."""

__all__ = [
    "agreement",
    "logs",
    "metrics",
    "progress",
    "telemetry",
    "web",
]
