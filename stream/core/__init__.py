"""The protocol core: everything the seeds define, testable in memory.

Pure by rule: nothing here imports faust, aiokafka, aiohttp or openai (a unit test
checks it). The model is reached through the `Model` protocol in `solve`.
"""

from stream.core.instance import Instance
from stream.core.messages import Call, SourcePosition
from stream.core.prompt import Ask, PromptBuilder, token_for
from stream.core.solve import Outcome, Solver
from stream.core.spec import AgentSpec, Tool, load_spec
from stream.core.validate import Validator, Verdict

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
