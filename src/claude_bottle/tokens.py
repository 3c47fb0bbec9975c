"""Where the user's token lives on the host: the environment, the OS keyring, or a 0600 file.

Looked up in that order. ``claude-bottle login`` stores into the keyring when one works, else the file.

A credential route's value (``[credentials.NAME]``) comes from a host variable (``env``), a host command run
at start (``command``, such as ``gh auth token``), or else the same store: ``claude-bottle login NAME`` puts
it in the keyring (account ``credential:NAME``) or in ``<config dir>/credentials/NAME`` (0600).

The upstream proxy's password (for a proxy URL with a user and no password) is stored the same way by
``claude-bottle login proxy``: account ``upstream-proxy``, else ``<config dir>/upstream-proxy-password``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from claude_bottle.agent.credential_config import COMMAND_TIMEOUT, CredentialConfig
from claude_bottle.credentials import Credential, CredentialKind, read_private_file, read_token_file
from claude_bottle.errors import CredentialError
from claude_bottle.gate.routes import CredentialRoute, InvalidRoute, check_name, check_secret, new_sentinel
from claude_bottle.paths import config_dir, host_command_dir

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


def _keyring() -> ModuleType:
    """The keyring package, imported on first use: finding its backends costs a start that takes its token
    from the environment a tenth of a second."""
    import keyring
    import keyring.errors

    return keyring


# Every stored secret (the token, a route's value, the proxy's password) lives under its own keyring account, or,
# where no keyring backend works, in its own 0600 file: these three are the one way in and out of both.

def _save(account: str, path: Path, value: str) -> str:
    """Store ``value`` in the keyring, else in the 0600 file ``path``; returns where."""
    keyring = _keyring()
    try:
        keyring.set_password(SERVICE, account, value)
        return "the OS keyring"
    except keyring.errors.KeyringError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(temporary, path)
    return str(path)


def _from_keyring(account: str) -> str | None:
    keyring = _keyring()
    with contextlib.suppress(keyring.errors.KeyringError):  # no usable backend: the file is the fallback
        stored: str | None = keyring.get_password(SERVICE, account)
        return stored or None
    return None


def _forget(account: str, path: Path) -> list[str]:
    """Remove the secret from the keyring and the file; returns the places it was removed from."""
    keyring = _keyring()
    removed = []
    with contextlib.suppress(keyring.errors.KeyringError):
        if keyring.get_password(SERVICE, account) is not None:
            keyring.delete_password(SERVICE, account)
            removed.append("the OS keyring")
    if path.exists():
        path.unlink()
        removed.append(str(path))
    return removed


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
    stored = _from_keyring(ACCOUNT)
    if stored:
        return Credential.parse(stored, "the token in the OS keyring"), "the OS keyring"
    path = token_file()
    if path.exists():
        return read_token_file(str(path)), str(path)
    raise CredentialError(HOW_TO_GET_ONE)


def store(credential: Credential) -> str:
    """Save the token; returns where. The keyring when one works, else a 0600 file."""
    return _save(ACCOUNT, token_file(), credential.secret)


def remove() -> list[str]:
    """Forget the stored token everywhere; returns the places it was removed from."""
    return _forget(ACCOUNT, token_file())


def route_account(name: str) -> str:
    return f"credential:{name}"


def route_file(name: str) -> Path:
    return config_dir() / "credentials" / name


def store_route(name: str, text: str) -> str:
    """Save credential ``name``'s value (checked as the gate will check it); returns where."""
    try:
        check_name(name)
        value = check_secret(text, f"the value given for {name}")
    except InvalidRoute as exc:
        raise CredentialError(str(exc)) from None
    return _save(route_account(name), route_file(name), value)


def remove_route(name: str) -> list[str]:
    return _forget(route_account(name), route_file(name))


def route_value(credential: CredentialConfig, environ: Mapping[str, str] | None = None) -> str:
    """The value of ``credential`` from where its config says, checked. Raises CredentialError saying what
    to do; the message never holds the value, nor what the command printed."""
    environ = os.environ if environ is None else environ
    where = credential.origin or f"credentials.{credential.name}"
    try:
        if credential.env:
            if not environ.get(credential.env):
                raise CredentialError(f"{where}: ${credential.env} is not set (or empty) on this host")
            return check_secret(environ[credential.env], f"${credential.env}")
        if credential.command:
            return check_secret(_command_output(credential.command, where), f"the output of {credential.command[0]}")
        stored = _from_keyring(route_account(credential.name))
        if stored:
            return check_secret(stored, f"the value of {credential.name} in the OS keyring")
        path = route_file(credential.name)
        if path.exists():
            return check_secret(read_private_file(str(path)), f"{path}")
    except InvalidRoute as exc:
        raise CredentialError(f"{where}: {exc}") from None
    raise CredentialError(f"{where}: no value stored; run `claude-bottle login {credential.name}` (or give env = "
                          f"\"VARIABLE\" or command = [...] in the table)")


def _command_output(command: tuple[str, ...], where: str) -> str:
    """Standard output of ``command`` run on the host (no shell, no standard input, bounded in time)."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=COMMAND_TIMEOUT, check=False, cwd=host_command_dir())
    except FileNotFoundError:
        raise CredentialError(f"{where}: command {command[0]!r} not found on this host") from None
    except subprocess.TimeoutExpired:
        raise CredentialError(f"{where}: command {' '.join(command)!r} did not finish within "
                              f"{COMMAND_TIMEOUT:g}s") from None
    except OSError as exc:
        raise CredentialError(f"{where}: command {command[0]!r} cannot run ({exc.strerror})") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        raise CredentialError(f"{where}: command {' '.join(command)!r} failed (exit {done.returncode}): {said}")
    return done.stdout


def routes_for(credentials: tuple[CredentialConfig, ...]) -> tuple[CredentialRoute, ...]:
    """Each configured credential with its value and a fresh sentinel: the routes of one run."""
    return tuple(CredentialRoute(c.spec(new_sentinel(c.name)), route_value(c)) for c in credentials)


PROXY_ACCOUNT = "upstream-proxy"
PROXY_NAME = "proxy"  # `login proxy`: not a credential route's name (agent/credential_config.py refuses it)


def proxy_password_file() -> Path:
    return config_dir() / "upstream-proxy-password"


def store_proxy_password(text: str) -> str:
    """Save the upstream proxy's password (one line, not empty); returns where."""
    value = text.strip("\r\n")
    if not value or "\n" in value or "\r" in value:
        raise CredentialError("the proxy's password given is empty or holds several lines")
    return _save(PROXY_ACCOUNT, proxy_password_file(), value)


def proxy_password() -> str | None:
    """The stored upstream proxy's password, or None."""
    if stored := _from_keyring(PROXY_ACCOUNT):
        return stored
    path = proxy_password_file()
    return read_private_file(str(path)).strip("\r\n") if path.exists() else None


def remove_proxy_password() -> list[str]:
    return _forget(PROXY_ACCOUNT, proxy_password_file())
