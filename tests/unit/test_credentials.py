"""The credential: parsing, the upstream header, the placeholder, and reading it from a file."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import pytest

from claude_bottle.credentials import Credential, CredentialKind, read_token_file
from claude_bottle.errors import ConfigError, CredentialError

OAUTH = "sk-ant-oat01-" + "AbC_d-eF0123456789xyzXYZ" * 3
API_KEY = "sk-ant-api03-" + "Zz9_-Yy8Xx7Ww6Vv5Uu4Tt3" * 3


PARSE_CASES = [
    (OAUTH, CredentialKind.OAUTH, OAUTH, b"authorization", b"Bearer " + OAUTH.encode()),
    (API_KEY, CredentialKind.API_KEY, API_KEY, b"x-api-key", API_KEY.encode()),
    (f"  {OAUTH}\n", CredentialKind.OAUTH, OAUTH, b"authorization", b"Bearer " + OAUTH.encode()),
    (f"\r\n\t{API_KEY}\r\n\n", CredentialKind.API_KEY, API_KEY, b"x-api-key", API_KEY.encode()),
    ("sk-ant-oat99-" + "a" * 20, CredentialKind.OAUTH, "sk-ant-oat99-" + "a" * 20, b"authorization",
     b"Bearer sk-ant-oat99-" + b"a" * 20),
    ("sk-ant-api01-" + "b" * 400, CredentialKind.API_KEY, "sk-ant-api01-" + "b" * 400, b"x-api-key",
     b"sk-ant-api01-" + b"b" * 400),
]


@pytest.mark.parametrize(
    ("text", "kind", "secret", "name", "value"),
    PARSE_CASES,
    ids=["oauth", "api-key", "oauth-whitespace", "api-key-crlf", "oauth-min-length", "api-key-max-length"],
)
def test_parse(text: str, kind: CredentialKind, secret: str, name: bytes, value: bytes) -> None:
    credential = Credential.parse(text, "test")
    assert credential.kind is kind
    assert credential.secret == secret
    assert credential.header() == (name, value)


PARSE_INVALID = [
    ("", "test is empty", "claude setup-token"),
    ("  \n\t ", "test is empty", "claude setup-token"),
    ("sk-ant-xyz", "does not hold an Anthropic token", "sk-ant-oat01-"),
    ("sk-ant-oat01-short", "does not hold an Anthropic token", "sk-ant-api03-"),
    ("sk-ant-oat01-" + "a" * 401, "does not hold an Anthropic token", ""),
    ("sk-ant-oat1-" + "a" * 30, "does not hold an Anthropic token", ""),
    ("sk-ant-foo01-" + "a" * 30, "does not hold an Anthropic token", ""),
    (f"{OAUTH}\n{API_KEY}", "does not hold an Anthropic token", "(it holds more than one line)"),
    (f"{OAUTH}\n", None, None),  # a trailing newline is not a second line (valid; checked below)
    ("ANTHROPIC_API_KEY=" + API_KEY, "does not hold an Anthropic token", ""),
    (f"Bearer {OAUTH}", "does not hold an Anthropic token", ""),
    (OAUTH + " x", "does not hold an Anthropic token", ""),
    ("correct horse battery staple", "does not hold an Anthropic token", ""),
    ("sk-ant-oat01-" + "a" * 29 + "!", "does not hold an Anthropic token", ""),
]


@pytest.mark.parametrize(
    ("text", "words", "hint"),
    PARSE_INVALID,
    ids=["empty", "blank", "sk-ant-xyz", "too-short", "too-long", "one-digit-version", "unknown-kind",
         "two-lines", "trailing-newline-ok", "env-assignment", "bearer-prefix", "trailing-word", "random",
         "bad-char"],
)
def test_parse_invalid(text: str, words: str | None, hint: str | None) -> None:
    if words is None:
        assert Credential.parse(text, "test").secret == text.strip()
        return
    with pytest.raises(CredentialError) as info:
        Credential.parse(text, "test")
    message = str(info.value)
    assert words in message
    assert (hint or "") in message
    assert OAUTH not in message and API_KEY not in message  # the error never echoes a token
    if "\n" not in text.strip():
        assert "more than one line" not in message


def test_credential_error_is_config_error() -> None:
    assert issubclass(CredentialError, ConfigError)


@pytest.mark.parametrize("secret", [OAUTH, API_KEY], ids=["oauth", "api-key"])
def test_repr_never_shows_secret(secret: str) -> None:
    credential = Credential.parse(secret, "test")
    for text in (repr(credential), str(credential), f"{credential}", f"{credential!r}", repr([credential])):
        assert secret not in text
        assert secret[13:] not in text
        assert "<redacted>" in text
    assert repr(credential) == f"Credential(kind={credential.kind.value}, secret=<redacted>)"


@pytest.mark.parametrize(
    ("secret", "prefix", "header_name"),
    [(OAUTH, "sk-ant-oat01-", b"authorization"), (API_KEY, "sk-ant-api03-", b"x-api-key")],
    ids=["oauth", "api-key"],
)
def test_placeholder(secret: str, prefix: str, header_name: bytes) -> None:
    credential = Credential.parse(secret, "test")
    placeholder = credential.placeholder()
    assert placeholder.startswith(prefix)
    assert placeholder != secret
    assert secret not in placeholder
    again = Credential.parse(placeholder, "placeholder")  # well-formed: the client accepts it
    assert again.kind is credential.kind
    assert again.header()[0] == header_name
    assert credential.placeholder() == placeholder  # stable


def _token_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700], ids=oct)
def test_read_token_file_private_modes(tmp_path: Path, mode: int) -> None:
    path = _token_file(tmp_path, OAUTH + "\n", mode)
    credential = read_token_file(str(path))
    assert credential.kind is CredentialKind.OAUTH
    assert credential.secret == OAUTH


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604, 0o660, 0o610, 0o601, 0o666], ids=oct)
def test_read_token_file_refuses_shared_modes(tmp_path: Path, mode: int) -> None:
    path = _token_file(tmp_path, OAUTH, mode)
    with pytest.raises(CredentialError) as info:
        read_token_file(str(path))
    message = str(info.value)
    assert f"chmod 600 {path}" in message
    assert "accessible by group or others" in message
    assert f"mode {mode:04o}" in message
    assert OAUTH not in message


def test_read_token_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    with pytest.raises(CredentialError, match="does not exist") as info:
        read_token_file(str(path))
    assert str(path) in str(info.value)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mode", [0o700, 0o755], ids=oct)
def test_read_token_file_directory(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(CredentialError, match="is not a regular file"):
        read_token_file(str(directory))


def test_read_token_file_directory_does_not_leak_descriptor(tmp_path: Path) -> None:
    """Whatever the error, the descriptor opened on a directory must be closed."""
    directory = tmp_path / "dir"
    directory.mkdir(mode=0o700)
    before = _open_fds()
    for _ in range(3):
        with contextlib.suppress(Exception):
            read_token_file(str(directory))
    assert _open_fds() == before


def test_read_token_file_refusal_does_not_leak_descriptor(tmp_path: Path) -> None:
    path = _token_file(tmp_path, OAUTH, 0o644)
    before = _open_fds()
    with pytest.raises(CredentialError):
        read_token_file(str(path))
    assert _open_fds() == before


def test_read_token_file_not_regular_device() -> None:
    with pytest.raises(CredentialError, match="is not a regular file"):
        read_token_file("/dev/null")


@pytest.mark.parametrize("text", ["", "\n\n  \n"], ids=["empty", "blank"])
def test_read_token_file_empty(tmp_path: Path, text: str) -> None:
    path = _token_file(tmp_path, text, 0o600)
    with pytest.raises(CredentialError) as info:
        read_token_file(str(path))
    assert f"token file {path} is empty" in str(info.value)


def test_read_token_file_garbage(tmp_path: Path) -> None:
    path = _token_file(tmp_path, f"{OAUTH}\n{OAUTH}\n", 0o600)
    with pytest.raises(CredentialError) as info:
        read_token_file(str(path))
    assert f"token file {path} does not hold an Anthropic token (it holds more than one line)" in str(info.value)


def test_read_token_file_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"  {API_KEY}\n"))
    credential = read_token_file("-")
    assert credential.kind is CredentialKind.API_KEY
    assert credential.secret == API_KEY


def test_read_token_file_stdin_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(CredentialError, match="the token on standard input is empty"):
        read_token_file("-")


def test_read_token_file_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(CredentialError, match="is not a regular file"):
        read_token_file(str(fifo))
