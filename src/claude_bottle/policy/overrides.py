"""The methods and paths a request names besides its own, as servers and frameworks read them: the method
override headers (``X-HTTP-Method-Override``, ``X-HTTP-Method``, ``X-Method-Override``), a ``_method`` query
parameter, a ``_method`` field in a POST's form or JSON body (Rails' Rack, Laravel, Symfony, Spring), and the
path override headers (``X-Original-URL``, ``X-Rewrite-URL``). ``RequestPolicy.decide`` (policy/rules.py) judges
each of them as it judges the request's own method and path; gate/inspection.py reads them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from email import policy as email_policy
from email.message import EmailMessage
from email.parser import BytesParser
from urllib.parse import unquote_to_bytes

METHOD_OVERRIDE_HEADERS = frozenset({b"x-http-method-override", b"x-http-method", b"x-method-override"})


def method_overrides(headers: Iterable[tuple[bytes, bytes]], target: bytes) -> tuple[str, ...]:
    """The methods a request names besides its own, as frameworks read them: the values of the override
    headers (names lower-case, in any spelling with ``_`` for ``-``) and of ``_method`` query parameters."""
    named = [unquote_to_bytes(value) for value in _values(headers, METHOD_OVERRIDE_HEADERS)]
    named += _form_fields(b"", target.partition(b"?")[2])  # the query, read as a form is (``%5Fmethod`` too)
    return tuple(value.decode("latin-1").strip() for value in named)


# Headers that IIS's URL Rewrite (X-Original-URL) and ISAPI_Rewrite (X-Rewrite-URL) set to the target they
# rewrote, and that Symfony before 3.4.14, Zend and the applications on them routed by, whoever sent them.
PATH_OVERRIDE_HEADERS = frozenset({b"x-original-url", b"x-rewrite-url"})


def path_overrides(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, ...]:
    """The paths a request names besides its target: the values of the path override headers (names lower-case,
    in any spelling with ``_`` for ``-``), as those servers route them."""
    return tuple(dict.fromkeys(value.decode("latin-1").strip() for value in _values(headers, PATH_OVERRIDE_HEADERS)))


def _values(headers: Iterable[tuple[bytes, bytes]], names: frozenset[bytes]) -> list[bytes]:
    """The values of the headers in ``names``, each name spelled in any case or with ``_`` for ``-`` (as PHP and
    CGI servers read a header's name); the request's names arrive lower-case."""
    return [value for name, value in headers if name.replace(b"_", b"-") in names]


FORM = b"application/x-www-form-urlencoded"


def body_overrides_read(method: bytes, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a framework may read a method override from this request's body (``body_method_overrides``):
    Rails (Rack), Laravel, Symfony and Spring read a ``_method`` field from the body of a POST only, and only
    from a form (Rack reads a POST without a Content-Type as one), or from JSON (Laravel)."""
    if method != b"POST":
        return False
    types = [value for name, value in headers if name == b"content-type"]
    return not types or any(_body_kind(value) is not None for value in types)


def body_method_overrides(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> tuple[str, ...]:
    """The methods a POST's body names in ``_method`` fields, as frameworks read them (see
    ``body_overrides_read``): in a URL-encoded form (the name and value percent-decoded, ``+`` a space, ``&``
    or ``;`` between fields), in a multipart body (the part's name plain or RFC 2231-encoded, its value as
    written and transfer-decoded), or a JSON object's top-level ``_method``. Every Content-Type given is read;
    none, or an empty one, means a URL-encoded form, as Rack reads it. ``BodyUnread`` for a form of more than
    ``MAX_PARTS`` fields or a multipart body of more than ``MAX_PARTS`` parts."""
    types = [value for name, value in headers if name == b"content-type"] or [FORM]
    named = [field for value in types if (kind := _body_kind(value)) is not None
             for field in _BODY_READERS[kind](value, body)]
    return tuple(dict.fromkeys(value.decode("latin-1").strip() for value in named))


def _body_kind(content_type: bytes) -> str | None:
    media = content_type.split(b";", 1)[0].strip().lower()
    if media in (FORM, b""):  # Rack reads a POST with an empty Content-Type as a form, as one without any
        return "form"
    if media.startswith(b"multipart/"):
        return "multipart"
    if b"/json" in media or b"+json" in media:  # as Laravel tells JSON
        return "json"
    return None


# A field named _method in a URL-encoded body, its name as written (any of its characters percent-encoded), and
# its value: matched where a field begins.
_FORM_METHOD_FIELD = re.compile(rb"(?:_|%5[fF])(?:m|%6[dD])(?:e|%65)(?:t|%74)(?:h|%68)(?:o|%6[fF])"
                                rb"(?:d|%64)(?:=([^&;]*))?(?=[&;]|$)")
# Rack's limit on a form's fields and a multipart body's parts (PHP reads 1,000 fields, Express 1,000, Tomcat 50
# parts); a server may raise it, so a body with more is refused rather than read in part. It also bounds what
# judging a form costs the gate's one thread, whatever the body's bytes.
MAX_PARTS = 4096
MAX_PART_HEAD = 8 * 1024
_PART_HEAD_END = re.compile(rb"\r?\n\r?\n")
# What a part's head must hold to name _method: the name itself, or a parameter's encoded or escaped spelling
# (RFC 2231's ``name*``, a quoted-pair, an RFC 2047 encoded word). Other heads are not parsed.
_MAY_NAME_METHOD = re.compile(rb"_method|\*|\\|=\?")


class BodyUnread(ValueError):
    """A body whose ``_method`` fields cannot all be read (``body_method_overrides``)."""


def _form_fields(content_type: bytes, body: bytes) -> list[bytes]:
    if body.count(b"&") + body.count(b";") >= MAX_PARTS:
        raise BodyUnread(f"a form of more than {MAX_PARTS} fields")
    starts = [0, *_after(body, b"&"), *_after(body, b";")]  # where each field begins
    return [_form_decoded(m[1] or b"") for at in sorted(starts) if (m := _FORM_METHOD_FIELD.match(body, at))]


def _after(body: bytes, separator: bytes) -> Iterator[int]:
    at = body.find(separator)
    while at >= 0:
        yield at + 1
        at = body.find(separator, at + 1)


def _form_decoded(text: bytes) -> bytes:
    return unquote_to_bytes(text.replace(b"+", b" "))


def _multipart_fields(content_type: bytes, body: bytes) -> list[bytes]:
    """The ``_method`` parts among the first ``MAX_PARTS`` of a multipart body, a part beginning at each line that
    begins with its delimiter. Only the parts' heads are parsed (by the standard library's MIME parser, for
    quoting and RFC 2231 parameters), so the cost stays linear in the body, whatever its parts."""
    boundary = _parsed(b"Content-Type: " + content_type).get_boundary()
    if not boundary:
        return []
    delimiter = b"\n--" + boundary.encode("latin-1", "replace")
    marks = [0] if body.startswith(delimiter[1:]) else []  # where each delimiter line begins, less its line break
    while (at := body.find(delimiter, marks[-1] if marks else 0)) >= 0:
        if len(marks) > MAX_PARTS:  # the closing delimiter's line is one more
            raise BodyUnread(f"a multipart body of more than {MAX_PARTS} parts")
        marks.append(at + 1)
    found: list[bytes] = []
    for mark, end in zip(marks, [*marks[1:], len(body)], strict=True):
        head_at = body.find(b"\n", mark + len(delimiter) - 1, end) + 1  # past the rest of the delimiter's line
        head_end = _PART_HEAD_END.search(body, head_at, min(end, head_at + MAX_PART_HEAD)) if head_at else None
        if head_end is None:
            continue
        head = body[head_at : head_end.start()]
        if _MAY_NAME_METHOD.search(head) and _parsed(head).get_param("name", header="content-disposition") == "_method":
            value = body[head_end.end() : end]
            found.append(value)
            decoded = _parsed(head + b"\r\n\r\n" + value).get_payload(decode=True)  # as its transfer encoding says
            if isinstance(decoded, bytes):
                found.append(decoded)
    return found


def _parsed(head: bytes) -> EmailMessage:
    return BytesParser(policy=email_policy.HTTP).parsebytes(head + b"\r\n\r\n")


def _json_field(content_type: bytes, body: bytes) -> list[bytes]:
    if not body.lstrip(b" \t\r\n").startswith(b"{"):  # only an object has a top-level field
        return []
    if b"method" not in body and b"\\u" not in body:  # its letters as written, or escaped: no field names it
        return []
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return []
    named = value.get("_method") if isinstance(value, dict) else None
    return [named.encode("utf-8", "replace")] if isinstance(named, str) else []


_BODY_READERS = {"form": _form_fields, "multipart": _multipart_fields, "json": _json_field}
