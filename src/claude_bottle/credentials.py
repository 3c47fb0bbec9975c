"""The Anthropic credential: its two kinds, validation, and reading it from a file the way ssh reads keys.

The secret lives only in a Credential object; its repr never shows it.
"""

from __future__ import annotations

import enum
import os
import re
import stat
import sys
from dataclasses import dataclass, field

from claude_bottle.errors import CredentialError


class CredentialKind(enum.Enum):
    OAUTH = "oauth"  # from `claude setup-token`; sent as Authorization: Bearer
    API_KEY = "api-key"  # from the Console; sent as x-api-key


_PATTERNS = {
    CredentialKind.OAUTH: re.compile(r"sk-ant-oat\d\d-[A-Za-z0-9_-]{20,400}"),
    CredentialKind.API_KEY: re.compile(r"sk-ant-api\d\d-[A-Za-z0-9_-]{20,400}"),
}


@dataclass(frozen=True)
class Credential:
    kind: CredentialKind
    secret: str = field(repr=False)

    def __repr__(self) -> str:
        return f"Credential(kind={self.kind.value}, secret=<redacted>)"

    @classmethod
    def parse(cls, text: str, source: str) -> Credential:
        """Validate a token. ``source`` names where it came from, for the error message."""
        token = text.strip()
        if not token:
            raise CredentialError(f"{source} is empty; get a token with `claude setup-token`")
        for kind, pattern in _PATTERNS.items():
            if pattern.fullmatch(token):
                return cls(kind, token)
        hint = " (it holds more than one line)" if "\n" in token else ""
        raise CredentialError(
            f"{source} does not hold an Anthropic token{hint}: expected an OAuth token (sk-ant-oat01-…, "
            "from `claude setup-token`) or an API key (sk-ant-api03-…)"
        )

    def header(self) -> tuple[bytes, bytes]:
        """The one header that carries this credential upstream."""
        if self.kind is CredentialKind.OAUTH:
            return b"authorization", b"Bearer " + self.secret.encode()
        return b"x-api-key", self.secret.encode()

    def placeholder(self) -> str:
        """A well-formed token of the same kind that grants nothing, for the client side of the gate."""
        prefix = "sk-ant-oat01-" if self.kind is CredentialKind.OAUTH else "sk-ant-api03-"
        return prefix + "placeholder-the-gate-injects-the-real-credential-" + "0" * 24


def read_token_file(path: str) -> Credential:
    """Read a token from ``path`` ('-' for stdin), refusing files that group or others could read."""
    if path == "-":
        return Credential.parse(sys.stdin.read(), "the token on standard input")
    return Credential.parse(read_private_file(path), f"token file {path}")


def read_private_file(path: str) -> str:
    """The text of a secret's file, refusing one that group or others could read, or another user owns."""
    try:
        # O_NONBLOCK: a FIFO with no writer must not hang the start; it is refused below as not regular.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CredentialError(f"token file {path} does not exist") from None
    except OSError as exc:
        raise CredentialError(f"cannot open token file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CredentialError(f"token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise CredentialError(
                f"token file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"run `chmod 600 {path}`"
            )
        if st.st_uid not in (os.getuid(), 0):
            raise CredentialError(f"token file {path} is owned by another user (uid {st.st_uid})")
        return os.read(fd, 1 << 16).decode("utf-8", "replace")
    finally:
        os.close(fd)
