"""Who the bottle runs as: the user on the host whose workspace it is, in a namespace that keeps that true."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from claude_bottle.errors import ConfigError

AGENT_UID = 1000  # the image's user: who a bottle runs as when root starts it on a folder root owns


def bottle_user(uid: int, gid: int, workspace: Path) -> str:
    """Who the bottle runs as (uid:gid): the invoking user, so files made in /workspace are theirs. Never root:
    for root, the workspace's owner, or uid 1000 when root owns it too. A ConfigError, before anything starts,
    when that user cannot write the workspace: a session must not find out halfway that it cannot save."""
    return user_for(uid, gid, workspace.stat(), workspace)


def user_for(uid: int, gid: int, info: os.stat_result, workspace: Path) -> str:
    """``bottle_user`` for a workspace whose stat is ``info``."""
    if uid != 0:
        user, group, who = uid, gid, "you"
    elif info.st_uid != 0:
        user, group, who = info.st_uid, info.st_gid, "its owner, as root started it"
    else:
        user, group, who = AGENT_UID, AGENT_UID, "uid 1000, as root started it on a folder root owns"
    owner, member = info.st_uid == user, info.st_gid == group
    write, search = ((stat.S_IWUSR, stat.S_IXUSR) if owner else (stat.S_IWGRP, stat.S_IXGRP) if member
                     else (stat.S_IWOTH, stat.S_IXOTH))
    if info.st_mode & write and info.st_mode & search:
        return f"{user}:{group}"
    fix = (f"run claude-bottle as a user who can write it, or `chown -R {AGENT_UID}:{AGENT_UID} {workspace}`"
           if uid == 0 else f"make it yours (`chown -R {uid}:{gid} {workspace}`) or writable for you")
    raise ConfigError(f"the workspace {workspace} is not writable by the bottle's user {user}:{group} ({who}): "
                      f"{fix}")
