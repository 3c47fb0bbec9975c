"""The strict JSON reader: jiter first, the standard library's reader as the fallback and the reference.

The differential test generates thousands of JSON texts (nesting, every escape, surrogates paired and lone,
duplicate keys plain and respelled by escapes, numbers of every form, whitespace JSON has and has not, and
then mutations: trailing garbage, a BOM, invalid UTF-8, bytes cut, inserted and replaced) and shows that
where jiter accepts, the reference accepts with an equal value of the same types, and that ``loads_strict``
gives the reference's verdict everywhere: its value, or its exception with its words.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jiter
import pytest

from claude_bottle.policy import strict_json
from claude_bottle.policy.strict_json import loads_strict, loads_strict_reference

SEED = 20261126
TEXTS = 6000

Outcome = tuple[Any, ...]


def outcome(read: Callable[[bytes], Any], body: bytes) -> Outcome:
    try:
        return ("value", read(body))
    except (ValueError, RecursionError) as exc:
        return ("refused", type(exc), str(exc))


def jiter_read(body: bytes) -> Any:
    return jiter.from_json(body, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys")


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down: 1 is not 1.0, -0.0 is not 0.0, key order counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def same_outcome(a: Outcome, b: Outcome) -> bool:
    return a[0] == b[0] and (same(a[1], b[1]) if a[0] == "value" else a == b)


class Texts:
    """Random JSON texts, spelled every way JSON allows and some ways it does not."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def ws(self) -> str:
        r = self.rng
        if r.random() < 0.7:
            return ""
        if r.random() < 0.03:  # whitespace that JSON does not have
            return r.choice(["\x0b", "\x0c", "\xa0", "\u3000", "\u2028", "\x85"])
        return "".join(r.choice(" \t\n\r") for _ in range(r.randint(1, 3)))

    def number(self) -> str:
        r = self.rng
        kind = r.randrange(14)
        if kind == 0:
            return r.choice(["0", "-0", "-0.0", "0.0", "0e0", "-0E-0", "1E+2", "1e-2", "1.5e+300"])
        if kind == 1:
            return str(r.randint(-10**6, 10**6))
        if kind == 2:  # beyond 64 bits: an int stays an int
            return str(r.choice([-1, 1]) * r.randint(2**63 - 2, 10**40))
        if kind == 3:
            return repr(r.uniform(-1e6, 1e6))
        if kind == 4:  # any double's shortest spelling, subnormals included
            value = r.choice([r.random() * 10.0 ** r.randint(-320, 308), 5e-324, 2.2250738585072014e-308,
                              1.7976931348623157e308])
            return repr(value * r.choice([-1, 1]))
        if kind == 5:  # past a double's range either way
            return r.choice(["1e400", "-1e400", "1e-400", "-1e-400", "1E309", "123456789e999", "0.1e-999"])
        if kind == 6:  # long mantissas, rounding halfway cases
            return r.choice(["9007199254740993", "9007199254740993.0", "2.2250738585072011e-308",
                             "1.00000000000000011102230246251565404236316680908203125",
                             "0." + "0" * r.randint(1, 400) + "1", "1" + "0" * r.randint(20, 400) + ".5"])
        if kind == 7:  # at Python's and jiter's limit of 4300 digits: for an int in both, for a float in jiter's
            digits = r.choice([4299, 4300, 4301, 4400])
            return (r.choice(["", "-"]) + "1" + "".join(r.choice("0123456789") for _ in range(digits - 1))
                    + r.choice(["", "", ".5", "e-5"]))
        if kind == 8:  # not JSON numbers
            return r.choice(["01", "-01", "+1", ".5", "1.", "1e", "1e+", "-", "--1", "0x10", "1_000", "\u0661",
                             "NaN", "Infinity", "-Infinity", "nan", "inf", "1.5.2", "00", "-.5"])
        digits = "".join(r.choice("0123456789") for _ in range(r.randint(1, 25))).lstrip("0") or "0"
        fraction = "." + "".join(r.choice("0123456789") for _ in range(r.randint(1, 25))) if r.random() < 0.5 else ""
        exponent = (r.choice("eE") + r.choice(["", "+", "-"]) + str(r.randint(0, 400))) if r.random() < 0.4 else ""
        return r.choice(["", "-"]) + digits + fraction + exponent

    def char(self) -> str:
        r = self.rng
        kind = r.randrange(20)
        if kind < 8:
            return r.choice("abcxyz AZ09_-.:/{}[],")
        if kind == 8:
            return "\\" + r.choice('"\\/bfnrt')
        if kind == 9:  # a BMP escape, either case
            code = r.choice([r.randrange(0x20), r.randrange(0x80, 0xD800), r.randrange(0xE000, 0x10000),
                             ord(r.choice("aAzZ\"\\/"))])
            return "\\u" + (f"{code:04x}" if r.random() < 0.5 else f"{code:04X}")
        if kind == 10:  # an escaped pair
            code = r.randrange(0x10000, 0x110000) - 0x10000
            return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}"
        if kind == 11:  # a lone or misordered surrogate, as JSON.stringify of a string cut inside a pair
            high, low = f"\\u{r.randrange(0xD800, 0xDC00):04x}", f"\\u{r.randrange(0xDC00, 0xE000):04x}"
            return r.choice([high, low, low + high, high + high, high + "x", high + "\\n"])
        if kind == 12:  # raw UTF-8 of every length, noncharacters and separators included
            return r.choice(["é", "€", "😀", "\uffff", "\ufffe", "\u2028", "\u2029", "\x7f", "\ufeff", "\U0010ffff"])
        if kind == 13:  # raw control characters: not JSON inside a string
            return chr(r.randrange(0x20))
        if kind == 14:  # broken escapes
            return r.choice(["\\x41", "\\u12", "\\u12G4", "\\U0041", "\\", "\\'", "\\0", "\\a"])
        return r.choice("aeiou")

    def string(self, key: bool = False) -> str:
        r = self.rng
        if key and r.random() < 0.5:
            return '"' + r.choice(["a", "b", "type", "text", "name", "mcp_servers"]) + '"'
        return '"' + "".join(self.char() for _ in range(r.randint(0, 12))) + '"'

    def respell(self, key: str) -> str:
        """``key`` (a plain ASCII JSON string) with some of its characters written as escapes."""
        inner = key[1:-1]
        return '"' + "".join(f"\\u{ord(c):04x}" if self.rng.random() < 0.5 and c.isalnum() else c
                             for c in inner) + '"'

    def value(self, depth: int) -> str:
        r = self.rng
        kind = r.randrange(10 if depth < 5 else 6)
        if kind < 2:
            return self.number()
        if kind < 4:
            return self.string()
        if kind < 6:
            return r.choice(["true", "false", "null", "True", "nul", "undefined"]) if r.random() < 0.05 \
                else r.choice(["true", "false", "null"])
        if kind < 8:
            items = [self.value(depth + 1) for _ in range(r.randint(0, 4))]
            return "[" + self.ws() + ("," + self.ws()).join(items) + self.ws() + "]"
        keys = [self.string(key=True) for _ in range(r.randint(0, 4))]
        if keys and r.random() < 0.25:  # a duplicate, plain or respelled by escapes
            again = r.choice(keys)
            keys.insert(r.randrange(len(keys) + 1), self.respell(again) if r.random() < 0.5 else again)
        pairs = [k + self.ws() + ":" + self.ws() + self.value(depth + 1) for k in keys]
        return "{" + self.ws() + ("," + self.ws()).join(pairs) + self.ws() + "}"

    def nested(self) -> str:
        """Around jiter's nesting limit of 200 (Python's is the interpreter's recursion limit)."""
        opens = [self.rng.choice(["[", '{"k":']) for _ in range(self.rng.choice([150, 199, 200, 201, 250]))]
        return "".join(opens) + self.value(5) + "".join("]" if o == "[" else "}" for o in reversed(opens))

    def mutate(self, data: bytes) -> bytes:
        r = self.rng
        kind = r.randrange(10)
        at = r.randrange(len(data) + 1)
        if kind == 0:  # trailing garbage
            return data + r.choice([b"x", b",", b" 1", b"]", b"}", b"\x00", b" {}", b"\n\n", b"//", b"\xff"])
        if kind == 1:
            return b"\xef\xbb\xbf" + data
        if kind == 2:  # invalid UTF-8: a stray byte, an overlong form, an encoded surrogate, a cut sequence
            bad = r.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\x80"])
            return data[:at] + bad + data[at:]
        if kind == 3:
            return data[:at]
        if kind == 4 and data:
            at = min(at, len(data) - 1)
            return data[:at] + data[at + 1:]
        if kind == 5 and data:
            at = min(at, len(data) - 1)
            return data[:at] + bytes([r.choice(b'"\\{}[],:.eE-+0u ')]) + data[at + 1:]
        if kind == 6:
            return data[:at] + r.choice([b"NaN", b"Infinity", b"-Infinity"]) + data[at:]
        return data[:at] + bytes([r.randrange(256)]) + data[at:]

    def __iter__(self) -> Iterator[bytes]:
        r = self.rng
        for _ in range(TEXTS):
            text = self.nested() if r.random() < 0.02 else self.ws() + self.value(0) + self.ws()
            data = text.encode("utf-8", "surrogatepass")
            yield self.mutate(data) if r.random() < 0.3 else data


def test_jiter_agrees_with_the_reference_and_the_verdict_is_always_the_reference_s() -> None:
    seen: Counter[str] = Counter()
    for body in Texts(random.Random(SEED)):
        reference, fast = outcome(loads_strict_reference, body), outcome(jiter_read, body)
        if fast[0] == "value":
            assert reference[0] == "value", f"jiter accepted what the reference refuses: {body!r} {reference}"
            assert same(fast[1], reference[1]), f"jiter read another value: {body!r} {fast[1]!r} {reference[1]!r}"
        assert same_outcome(outcome(loads_strict, body), reference), f"another verdict than the reference's: {body!r}"
        seen[f"jiter {fast[0]}, reference {reference[0]}"] += 1
    # Every case the reader has is there, in numbers: the test is not vacuous.
    assert seen["jiter value, reference value"] > 1500, seen
    assert seen["jiter refused, reference refused"] > 1000, seen
    assert seen["jiter refused, reference value"] > 100, seen  # where the fallback decides


def deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(("body", "expected"), [
    # JSON.stringify of a string cut inside a surrogate pair: Python reads it, and so does the gate.
    (b'{"text":"cut \\ud83d"}', {"text": "cut \ud83d"}),
    (b'["\\ude00\\ud83d"]', ["\ude00\ud83d"]),
    (b"[" * 300 + b"]" * 300, deep(300)),  # jiter stops at 200
    (b"1" + b"0" * 4400 + b".5", float("inf")),  # a float of more than 4300 digits
])
def test_what_jiter_refuses_and_json_reads_is_read_as_json_reads_it(body: bytes, expected: Any) -> None:
    with pytest.raises(ValueError):
        jiter_read(body)
    assert same(loads_strict(body), expected)


@pytest.mark.parametrize(("body", "words"), [
    (b'{"a":1,"\\u0061":2}', "duplicate key 'a'"),
    (b'{"mcp_servers":[],"mcp_servers":null}', "duplicate key 'mcp_servers'"),
    (b'{"t":NaN}', "NaN is not JSON"),
    (b"[-Infinity]", "-Infinity is not JSON"),
    (b'\xef\xbb\xbf{}', "Unexpected UTF-8 BOM"),
    (b'{"a":"\xed\xa0\x80"}', "can't decode byte 0xed"),
    (b'{"a":"\x01"}', "Invalid control character"),
    (b"{} x", "Extra data"),
    (b"", "Expecting value"),
])
def test_a_refusal_carries_the_reference_s_words(body: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        loads_strict(body)


def test_an_ordinary_body_is_read_by_jiter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = jiter.from_json

    def spy(body: bytes, **options: Any) -> Any:
        calls.append(body)
        return real(body, **options)

    monkeypatch.setattr(strict_json.jiter, "from_json", spy)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    assert loads_strict(body) == json.loads(body) and calls == [body]
    assert loads_strict(bytearray(b"[1]")) == [1], "any bytes-like body, as json reads it"


def test_below_jiter_s_integer_limit_the_reference_alone_decides() -> None:
    """Python's limit on an integer's digits can be lowered (sys.set_int_max_str_digits, PYTHONINTMAXSTRDIGITS);
    jiter's cannot, so it would accept integers Python then refuses."""
    before = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(640)
        with pytest.raises(ValueError, match="Exceeds the limit"):
            loads_strict(b"[" + b"7" * 1000 + b"]")
        sys.set_int_max_str_digits(0)  # no limit: jiter refuses past 4300 digits, the reference reads them
        assert loads_strict(b"7" * 5000) == int("7" * 5000)
    finally:
        sys.set_int_max_str_digits(before)
