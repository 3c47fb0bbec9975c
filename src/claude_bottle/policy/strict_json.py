"""JSON read as strictly as the gate needs to judge what a server will read: UTF-8 only (no BOM, none of the
UTF-16/32 forms ``json.loads`` guesses from bytes), no duplicate keys, no NaN or Infinity. Each of those is a
place where the gate's reading and a server's could differ, so a field the gate judged is not the field the
server acts on (``{"name": "allowed", "name": "refused"}``: Python keeps the last, some servers the first).
"""

from __future__ import annotations

import json
from typing import Any


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        keys = [k for k, _ in pairs]
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: json.loads with these hooks would build a decoder (and its scanner) for every body.
_DECODER = json.JSONDecoder(object_pairs_hook=_strict_object, parse_constant=_no_constant)


def loads_strict(body: bytes) -> Any:
    """The JSON value of ``body``; ValueError (UnicodeDecodeError included) for anything ambiguous.
    RecursionError for nesting deeper than the interpreter allows: callers refuse that too."""
    text = body.decode("utf-8")
    if text.startswith("\ufeff"):  # as json.loads refuses it: the decoder itself does not look
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    return _DECODER.decode(text)
