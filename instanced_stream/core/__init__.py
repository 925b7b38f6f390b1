"""The protocol core: everything the seeds define, testable in memory.

Pure by rule: nothing here imports faust, aiokafka, aiohttp or openai (a unit test
checks it). The model is reached through the `Model` protocol in `solve`.
"""

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import Call, SourcePosition
from instanced_stream.core.prompt import Ask, PromptBuilder, token_for
from instanced_stream.core.solve import Outcome, Solver
from instanced_stream.core.spec import AgentSpec, Tool, load_spec
from instanced_stream.core.validate import Validator, Verdict

__all__ = [
    "AgentSpec",
    "Ask",
    "Call",
    "Instance",
    "Outcome",
    "PromptBuilder",
    "Solver",
    "SourcePosition",
    "Tool",
    "Validator",
    "Verdict",
    "load_spec",
    "token_for",
]
