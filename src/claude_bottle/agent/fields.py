"""Typed access to a TOML table, with errors naming the file and the key."""

from __future__ import annotations

import tomllib
from collections.abc import Set
from pathlib import Path
from typing import Any

from claude_bottle.display import printable
from claude_bottle.errors import ConfigError


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``; a ConfigError naming it when it cannot be read or parsed."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


class Fields:
    """Typed access to one table, with errors naming the file and key."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def fail(self, key: str, problem: str) -> ConfigError:
        """The error for ``key``, which a project file (a bottle may have written it) names as it likes: shown
        on one line, its control characters as escapes."""
        return ConfigError(f"{self.source}: {self.prefix}{printable(key)}: {problem}")

    def check_keys(self, allowed: Set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(key, f"unknown key (known: {', '.join(sorted(allowed))})")

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, 'must be a list of strings, like ["a", "b"]')
        return tuple(value)

    def string(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "must be a string")
        return value

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table ([{self.prefix}{key}])")
        return value

