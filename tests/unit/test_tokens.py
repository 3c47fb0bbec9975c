"""The host token store: environment first, then the keyring, then a 0600 file."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.errors
import pytest
from keyring.backend import KeyringBackend

from claude_bottle import tokens
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.errors import CredentialError

OAUTH = "sk-ant-oat01-" + "o" * 60
API_KEY = "sk-ant-api03-" + "k" * 60


class MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.items.pop((service, username))


class NoKeyring(MemoryKeyring):
    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.NoKeyringError("no backend")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.NoKeyringError("no backend")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A config home of the test's own, no token variables, and the real keyring put back afterwards."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in (tokens.ENV_OAUTH, tokens.ENV_API_KEY):
        monkeypatch.delenv(name, raising=False)
    original = keyring.get_keyring()
    yield
    keyring.set_keyring(original)


def test_environment_wins_and_names_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    keyring.set_keyring(MemoryKeyring())
    tokens.store(Credential.parse(API_KEY, "t"))
    monkeypatch.setenv(tokens.ENV_OAUTH, OAUTH)
    credential, source = tokens.find()
    assert (credential.secret, source) == (OAUTH, "$CLAUDE_BOTTLE_OAUTH_TOKEN")


def test_kind_must_match_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokens.ENV_API_KEY, OAUTH)
    with pytest.raises(CredentialError, match="holds an oauth token"):
        tokens.find()


def test_keyring_store_find_remove() -> None:
    keyring.set_keyring(MemoryKeyring())
    assert tokens.store(Credential.parse(API_KEY, "t")) == "the OS keyring"
    credential, source = tokens.find()
    assert credential.kind is CredentialKind.API_KEY and source == "the OS keyring"
    assert tokens.remove() == ["the OS keyring"]
    with pytest.raises(CredentialError, match="claude setup-token"):
        tokens.find()


def test_file_fallback_is_0600_without_a_keyring() -> None:
    keyring.set_keyring(NoKeyring())
    where = tokens.store(Credential.parse(OAUTH, "t"))
    path = tokens.token_file()
    assert where == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tokens.find() == (Credential.parse(OAUTH, "t"), str(path))
    path.chmod(0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        tokens.find()
    assert tokens.remove() == [str(path)] and not path.exists()
