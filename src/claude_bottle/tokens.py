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


def _keyring() -> ModuleType:
    """The keyring package, imported on first use: finding its backends costs a start that takes its token
    from the environment a tenth of a second."""
    import keyring
    import keyring.errors

    return keyring


def _keyring_get() -> str | None:
    keyring = _keyring()
    try:
        stored: str | None = keyring.get_password(SERVICE, ACCOUNT)
        return stored
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
    keyring = _keyring()
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
    keyring = _keyring()
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


def route_account(name: str) -> str:
    return f"credential:{name}"


def route_file(name: str) -> Path:
    return config_dir() / "credentials" / name


def _write_private(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(temporary, path)


def store_route(name: str, text: str) -> str:
    """Save credential ``name``'s value (checked as the gate will check it); returns where."""
    keyring = _keyring()
    try:
        check_name(name)
        value = check_secret(text, f"the value given for {name}")
    except InvalidRoute as exc:
        raise CredentialError(str(exc)) from None
    try:
        keyring.set_password(SERVICE, route_account(name), value)
        return "the OS keyring"
    except keyring.errors.KeyringError:
        pass
    _write_private(route_file(name), value)
    return str(route_file(name))


def remove_route(name: str) -> list[str]:
    keyring = _keyring()
    removed = []
    with contextlib.suppress(keyring.errors.KeyringError):
        if keyring.get_password(SERVICE, route_account(name)) is not None:
            keyring.delete_password(SERVICE, route_account(name))
            removed.append("the OS keyring")
    if route_file(name).exists():
        route_file(name).unlink()
        removed.append(str(route_file(name)))
    return removed


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
        stored = None
        keyring = _keyring()
        with contextlib.suppress(keyring.errors.KeyringError):
            stored = keyring.get_password(SERVICE, route_account(credential.name))
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
                              timeout=COMMAND_TIMEOUT, check=False)
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
    keyring = _keyring()
    try:
        keyring.set_password(SERVICE, PROXY_ACCOUNT, value)
        return "the OS keyring"
    except keyring.errors.KeyringError:
        pass
    _write_private(proxy_password_file(), value)
    return str(proxy_password_file())


def proxy_password() -> str | None:
    """The stored upstream proxy's password, or None."""
    keyring = _keyring()
    with contextlib.suppress(keyring.errors.KeyringError):
        stored: str | None = keyring.get_password(SERVICE, PROXY_ACCOUNT)
        if stored:
            return stored
    path = proxy_password_file()
    return read_private_file(str(path)).strip("\r\n") if path.exists() else None


def remove_proxy_password() -> list[str]:
    keyring = _keyring()
    removed = []
    with contextlib.suppress(keyring.errors.KeyringError):
        if keyring.get_password(SERVICE, PROXY_ACCOUNT) is not None:
            keyring.delete_password(SERVICE, PROXY_ACCOUNT)
            removed.append("the OS keyring")
    if proxy_password_file().exists():
        proxy_password_file().unlink()
        removed.append(str(proxy_password_file()))
    return removed
