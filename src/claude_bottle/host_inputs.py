"""What the host trusts or runs from a file named in the user's config must not lie where a bottle writes: the
workspace, the agent's writable mounts, and every workspace where bottles have run before. A bottle that may
write an extra CA certificate adds one of its own for the next run; one that may write a credential's
``command`` or the ``ask_command`` hook, or a file either names, runs code on the host at the next start or the
next question. Checked before anything is run or built."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from claude_bottle import trust
from claude_bottle.agent.mounts import Mount
from claude_bottle.agent.schema import AgentConfig
from claude_bottle.errors import ConfigError
from claude_bottle.paths import host_command_dir


def where_bottles_write(path: Path, workspace: Path, mounts: Iterable[Mount] = ()) -> str:
    """Which place a bottle writes holds ``path`` (by its real path: a symlink or ``..`` on the way is
    followed), said for a message: the workspace, a writable mount, or a workspace where bottles have run;
    "" if none does."""
    real = Path(os.path.realpath(path))
    for place, what in ((Path(os.path.realpath(workspace)), "the workspace"),
                        *((mount.source, f"the writable mount {mount.origin}") for mount in mounts
                          if not mount.read_only)):
        if real.is_relative_to(place):
            return f"{what} ({place})"
    if earlier := trust.workspace_holding(real):
        return f"{earlier}, a workspace where bottles have run"
    return ""


def check_ca_files(ca_files: Iterable[Path], workspace: Path, mounts: Iterable[Mount] = ()) -> None:
    """No CA certificate the images, the gate and the host trust may lie where a bottle writes."""
    for path in ca_files:
        if place := where_bottles_write(path, workspace, mounts):
            raise ConfigError(f"extra CA certificate {path} lies in {place}, which a bottle can write: keep it "
                              "elsewhere (docs/engines.md#tls-inspection)")


def check_host_commands(agent: AgentConfig, workspace: Path) -> None:
    """No credential ``command`` nor ``ask_command`` of ``agent`` may run a program, or name a file, that lies
    where a bottle writes."""
    commands = [(credential.origin or f"credentials.{credential.name}", credential.command)
                for credential in agent.credentials if credential.command]
    if agent.ask_command:
        commands.append((f"{', '.join(agent.sources) or f'agent {agent.name}'}: ask_command", agent.ask_command))
    for where, command in commands:
        for what, path in host_files(command):
            if place := where_bottles_write(path, workspace, agent.mounts):
                raise ConfigError(f"{where}: {what} {path} lies in {place}, which a bottle can write, and this "
                                  "command runs on your machine; keep what it runs and reads outside every "
                                  "workspace (docs/trust.md#what-the-host-runs)")


def host_files(command: tuple[str, ...]) -> list[tuple[str, Path]]:
    """The program ``command`` runs, as the host finds it from ``paths.host_command_dir`` (by $PATH, or a
    path), and each argument written as a path (holding a ``/`` or starting with ``~``, after ``--flag=``),
    where it exists: each with what it is."""
    cwd = host_command_dir()
    program = command[0]
    if "/" in program or program.startswith("~"):
        found: str | None = str(cwd / os.path.expanduser(program))
    else:  # a relative $PATH entry is relative to the command's working folder
        found = shutil.which(program, path=os.pathsep.join(str(cwd / entry) for entry in os.get_exec_path()))
    files = [("its program", Path(found))] if found and os.path.lexists(found) else []
    for argument in command[1:]:
        written = argument.split("=", 1)[1] if argument.startswith("-") and "=" in argument else argument
        if "/" in written or written.startswith("~"):
            path = cwd / os.path.expanduser(written)
            if os.path.lexists(path):
                files.append(("the file it names", path))
    return files
