"""The Claude Code release a bottle's image holds: the default one, and the name that asks for the newest.

An agent's ``[claude] version`` is checked against these (``agent.schema``) and the image is built with the
release chosen (``runtime.images``); both read them here, so neither depends on the other.
"""

from __future__ import annotations

DEFAULT_CLAUDE_CODE_VERSION = "2.1.190"
LATEST = "latest"  # claude.version: the newest release, resolved to a version number when the image is built
