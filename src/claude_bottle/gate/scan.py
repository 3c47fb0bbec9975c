"""Stop a response from carrying the injected credential back to the client, even split across chunks."""

from __future__ import annotations


class SecretReflected(Exception):
    """The upstream sent the credential back; the response must not be delivered."""


class SecretScanner:
    """Feed response bytes in order; get back the bytes that are safe to send now.

    Bytes that could be the start of the secret are held back until the next chunk shows they are not, so
    no prefix of the secret ever leaves early. Real traffic (SSE events end in a newline) holds back nothing.
    """

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("secret must not be empty")
        self._secret = secret
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        window = self._held + chunk
        if self._secret in window:
            raise SecretReflected("the response contains the injected credential")
        keep = self._overlap(window)
        self._held = window[len(window) - keep :] if keep else b""
        return window[: len(window) - keep]

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _overlap(self, window: bytes) -> int:
        """Length of the longest suffix of ``window`` that is a proper prefix of the secret."""
        first = self._secret[:1]
        start = max(0, len(window) - len(self._secret) + 1)
        at = window.find(first, start)
        while at >= 0:
            if self._secret.startswith(window[at:]):
                return len(window) - at
            at = window.find(first, at + 1)
        return 0
