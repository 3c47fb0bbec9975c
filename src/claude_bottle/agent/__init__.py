"""Agents: named TOML configs, parsed once into frozen, validated values.

- ``<config dir>/agents/NAME.toml``: user-level agents (``claude-bottle start NAME``).
- ``.claude-bottle.toml`` in the workspace: the project's default agent (``claude-bottle start``). A
  repository (or a bottle) may have written it, so it is used only once the user approved exactly these bytes
  (``claude-bottle trust``), and never sets what ``project.PROJECT_FORBIDDEN`` lists.
- Neither: built-in defaults. Every error names the file, the key, what was wrong and how to fix it.

The modules: ``schema`` (``AgentConfig`` and the parsing of an agent's table), ``presets`` (named host sets and
credential presets), ``credential_config`` (``[credentials.NAME]``), ``mounts`` (``[[mounts]]`` and what a
bottle must never reach), ``project`` (the project file and what it may set), ``load`` (finding an agent by
name or workspace) and ``fields`` (typed access to a TOML table, errors naming the file and key).
"""
