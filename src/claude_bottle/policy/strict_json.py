"""JSON read as strictly as the gate needs to judge what a server will read: UTF-8 only (no BOM, none of the
UTF-16/32 forms ``json.loads`` guesses from bytes), no duplicate keys, no NaN or Infinity. Each of those is a
place where the gate's reading and a server's could differ, so a field the gate judged is not the field the
server acts on (``{"name": "allowed", "name": "refused"}``: Python keeps the last, some servers the first).

Two readers, one verdict. ``loads_strict_reference`` is the standard library's ``json`` with hooks: the
definition of what is accepted and what it means. ``loads_strict`` asks jiter (pydantic's Rust parser) first,
4-5 x faster on a large Messages body, which matters because the parse runs after the body's last byte, on the
request's critical path. jiter is the stricter of the two: where it accepts, the reference accepts with an
equal value (tests/unit/test_strict_json.py checks that on thousands of generated texts), and where it refuses,
the reference decides, so the verdict and its words are always the reference's. The texts jiter refuses and
the reference accepts are rare in a real body: a lone surrogate escape (``"\\ud800"``, which JavaScript's
``JSON.stringify`` writes for a string cut inside a pair), nesting deeper than 200, an integer of more than
4300 digits where Python's limit was raised, a number whose decimal expansion overflows jiter's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import jiter

# jiter refuses integers of more than this many digits, as Python does by default (sys.int_info).
_JITER_INT_DIGITS = 4300


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


def loads_strict_reference(body: bytes) -> Any:
    """The JSON value of ``body``, read by the standard library; ValueError (UnicodeDecodeError included) for
    anything ambiguous. RecursionError for nesting deeper than the interpreter allows: callers refuse that too.
    The definition ``loads_strict`` keeps to."""
    text = body.decode("utf-8")
    if text.startswith("\ufeff"):  # as json.loads refuses it: the decoder itself does not look
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    return _DECODER.decode(text)


def loads_strict(body: bytes) -> Any:
    """``loads_strict_reference(body)``: the same value (same types: an int stays an int), the same exception
    with the same words, faster where jiter can read the text."""
    limit = sys.get_int_max_str_digits()
    # Below jiter's own limit, Python refuses integers jiter would accept: the reference alone decides then.
    if limit == 0 or limit >= _JITER_INT_DIGITS:
        try:
            # Keys cached: a body repeats a few keys thousands of times; its strings are mostly unique.
            return jiter.from_json(body if type(body) is bytes else bytes(body), allow_inf_nan=False,
                                   catch_duplicate_keys=True, cache_mode="keys")
        except ValueError:
            pass  # refused by jiter: the reference gives the verdict, and the reason the client is told
    return loads_strict_reference(body)
