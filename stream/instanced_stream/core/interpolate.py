"""`${VAR}` and `${VAR:-default}` in an agent spec's string values, filled from the
environment when the spec is loaded, so one spec file serves several environments
(a model name, an endpoint, a topic per stage) without templating tools.

Only string values are interpolated (keys and the YAML structure never change), and
`$${` writes a literal `${`. A variable that is unset and has no default is an error
naming it, not an empty string that would fail later and further away.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from instanced_stream.errors import SpecError

__all__ = ["interpolate"]

# $${...} (escaped), ${NAME}, ${NAME:-default} (unset or empty), ${NAME-default} (unset)
_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def _fill(text: str, env: Mapping[str, str], where: str) -> str:
    def one(match: re.Match[str]) -> str:
        name, how, default = match.groups()
        if name is None:
            return "${"
        value = env.get(name)
        if how == ":-" and not value:
            return default
        if how == "-" and value is None:
            return default
        if value is None:
            raise SpecError(f"{where}: ${{{name}}} is not set (give a default: ${{{name}:-...}})")
        return value

    return _REF.sub(one, text)


def interpolate(data: Any, env: Mapping[str, str], where: str = "agent spec") -> Any:
    """A copy of `data` with every string value's references filled from `env`."""
    if isinstance(data, str):
        return _fill(data, env, where) if "${" in data else data
    if isinstance(data, dict):
        return {key: interpolate(value, env, where) for key, value in data.items()}
    if isinstance(data, list):
        return [interpolate(value, env, where) for value in data]
    return data
