"""What people run and watch: the `stream` CLI, the console commands (produce, tail,
topics), the audit, Prometheus metrics, the live web page, log formatting, and the
JSON Schema writer. Modules are imported where used."""

__all__ = ["audit", "cli", "console", "logs", "metrics", "schemas", "web"]
