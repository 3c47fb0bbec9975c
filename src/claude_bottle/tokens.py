"""Where the user's token lives on the host: the environment, the OS keyring, or a 0600 file.

Looked up in that order. ``claude-bottle login`` stores into the keyring when one works, else the file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import keyring
import keyring.errors

from claude_bottle.credentials import Credential, CredentialKind, read_token_file
from claude_bottle.errors import CredentialError
from claude_bottle.paths import config_dir

SERVICE = "claude-bottle"
ACCOUNT = "anthropic-token"
ENV_OAUTH = "CLAUDE_BOTTLE_OAUTH_TOKEN"
ENV_API_KEY = "ANTHROPIC_API_KEY"
HOW_TO_GET_ONE = (
    "no Anthropic token found: run `claude setup-token` to get one, then `claude-bottle login` to store it "
    f"(or set {ENV_OAUTH}, or {ENV_API_KEY} for an API key)"
)


def token_file() -> Path:
    return config_dir() / "token"


def _keyring_get() -> str | None:
    try:
        return keyring.get_password(SERVICE, ACCOUNT)
    except keyring.errors.KeyringError:
        return None  # no usable backend: the file is the fallback


def find(environ: Mapping[str, str] | None = None) -> tuple[Credential, str]:
    """The token and a description of where it came from. Raises CredentialError with what to do."""
    environ = os.environ if environ is None else environ
    for variable, kind in ((ENV_OAUTH, CredentialKind.OAUTH), (ENV_API_KEY, CredentialKind.API_KEY)):
        if environ.get(variable):
            credential = Credential.parse(environ[variable], f"${variable}")
            if credential.kind is not kind:
                raise CredentialError(f"${variable} holds an {credential.kind.value} token; "
                                      f"use {ENV_OAUTH} for OAuth tokens and {ENV_API_KEY} for API keys")
            return credential, f"${variable}"
    stored = _keyring_get()
    if stored:
        return Credential.parse(stored, "the token in the OS keyring"), "the OS keyring"
    path = token_file()
    if path.exists():
        return read_token_file(str(path)), str(path)
    raise CredentialError(HOW_TO_GET_ONE)


def store(credential: Credential) -> str:
    """Save the token; returns where. The keyring when one works, else a 0600 file."""
    try:
        keyring.set_password(SERVICE, ACCOUNT, credential.secret)
        return "the OS keyring"
    except keyring.errors.KeyringError:
        pass
    path = token_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credential.secret + "\n")
    os.replace(temporary, path)
    return str(path)


def remove() -> list[str]:
    """Forget the stored token everywhere; returns the places it was removed from."""
    removed = []
    with contextlib.suppress(keyring.errors.KeyringError):
        if keyring.get_password(SERVICE, ACCOUNT) is not None:
            keyring.delete_password(SERVICE, ACCOUNT)
            removed.append("the OS keyring")
    path = token_file()
    if path.exists():
        path.unlink()
        removed.append(str(path))
    return removed
