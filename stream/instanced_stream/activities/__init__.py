"""The activity SDK: a registry of `async def handler(call, tool, context)` functions
that consume activity topics and answer awaited calls. Needs aiokafka, never faust."""

from instanced_stream.activities.worker import (
    Activities,
    Branch,
    Handler,
    load_activities,
    paths_of,
)

__all__ = ["Activities", "Branch", "Handler", "load_activities", "paths_of"]
