"""The `stream` command, the top floor: the parser (`parser`), what every command shares
(`runner`), the product's commands (`main`, `commands`), the activity worker's command
(`activities`, the whole CLI of the worker distribution) and SIGTERM handling
(`termination`)."""

__all__ = [
    "activities",
    "commands",
    "main",
    "parser",
    "runner",
    "termination",
]
