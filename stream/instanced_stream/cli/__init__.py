"""The `stream` command, the top floor: the parser (`parser`), what every command shares
(`runner`), the product's commands (`main`, `commands`), the activity worker's command
(`activities`, the whole CLI of the worker distribution). SIGTERM handling is the base
module `termination`: the service and the worker act on what it records."""

__all__ = [
    "activities",
    "commands",
    "main",
    "parser",
    "runner",
]
