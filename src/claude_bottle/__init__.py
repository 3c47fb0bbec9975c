"""claude-bottle: run Claude Code where it can neither read your credential nor reach what you did not allow."""

__version__ = "0.1.0"
