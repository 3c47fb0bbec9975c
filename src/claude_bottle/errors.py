"""The one family of errors a user may see.

Everything raised on purpose inside claude-bottle is a BottleError; ``cli.main`` turns it into one line on
stderr and the exit code of its class. Messages say what was wrong and how to fix it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2  # bad input: flags, config files, token files (click uses 2 for usage errors too)
EXIT_DOCKER = 3
EXIT_GATE = 4


class BottleError(Exception):
    exit_code = EXIT_FAILURE


class ConfigError(BottleError):
    """Invalid configuration or input; nothing has been started."""

    exit_code = EXIT_CONFIG


class CredentialError(ConfigError):
    """A token that is missing, malformed or stored unsafely."""


class DockerError(BottleError):
    exit_code = EXIT_DOCKER


class GateError(BottleError):
    exit_code = EXIT_GATE
