"""The methods a request names besides its own (policy/overrides.py), read as servers and frameworks read
them: override headers, the query, and a POST's form or JSON body."""

from __future__ import annotations

import pytest

from claude_bottle.policy.overrides import (
    MAX_PARTS,
    BodyUnread,
    body_method_overrides,
    body_overrides_read,
    method_overrides,
    path_overrides,
)


def test_method_overrides_are_read_from_every_header_spelling_and_the_query() -> None:
    headers = [(b"x-http-method-override", b"DELETE"), (b"x_http_method", b" put "), (b"x-method-override", b"Patch"),
               (b"x-other", b"POST")]
    assert method_overrides(headers, b"/a") == ("DELETE", "put", "Patch")
    assert method_overrides([], b"/a?x=1&_method=DELETE;%5Fmethod=PUT") == ("DELETE", "PUT")
    assert method_overrides([], b"/a?my_method=DELETE") == ()
    assert method_overrides([], b"/a?%5Fmethod=DELETE&_m%65thod=+put+") == ("DELETE", "put")  # names encoded too
    assert method_overrides([(b"x-http-method-override", b"%44ELETE")], b"/a") == ("DELETE",)


def test_path_overrides_are_read_from_every_header_spelling() -> None:
    headers = [(b"x-original-url", b"/admin?x=1"), (b"x_rewrite_url", b" /a/b "), (b"x-original-uri", b"/c"),
               (b"x-rewrite-url", b"/admin?x=1")]
    assert path_overrides(headers) == ("/admin?x=1", "/a/b")
    assert path_overrides([(b"x-original-url", b"/\xe9")]) == ("/\xe9",)  # judged, and refused, as written


FORM = (b"content-type", b"application/x-www-form-urlencoded")
MULTIPART = (b"content-type", b"multipart/form-data; boundary=b0und")


def multipart(*parts: tuple[str, bytes]) -> bytes:
    """A multipart/form-data body of ``(Content-Disposition parameters and headers, value)`` parts."""
    return b"".join(b"--b0und\r\nContent-Disposition: form-data; " + head.encode() + b"\r\n\r\n" + value + b"\r\n"
                    for head, value in parts) + b"--b0und--\r\n"


@pytest.mark.parametrize(("headers", "body", "named"), [
    # a URL-encoded form, as Rack, Laravel, Symfony and Spring decode it
    ([FORM], b"title=x&_method=DELETE", ("DELETE",)),
    ([], b"_method=delete", ("delete",)),  # no Content-Type: Rack reads a POST's body as a form
    ([(b"content-type", b" ")], b"_method=delete", ("delete",)),  # nor an empty one
    ([(b"content-type", b"Application/X-WWW-Form-URLEncoded; charset=utf-8")], b"_method=PUT", ("PUT",)),
    ([FORM], b"%5Fmethod=PUT", ("PUT",)),  # the name percent-encoded
    ([FORM], b"_m%65thod=%44ELETE", ("DELETE",)),
    ([FORM], b"a=1;_method=+patch+&x=2", ("patch",)),  # ';' between fields, '+' a space
    ([FORM], b"_method=PUT&_method=DELETE", ("PUT", "DELETE")),  # every one: servers differ on which wins
    ([FORM], b"_method", ("",)),  # named without a value: refused as no method
    ([FORM], b"my_method=DELETE&_METHOD=DELETE&_method%20=PUT", ()),
    # multipart, the name quoted, plain, RFC 2231-encoded, in any case; the value as written and decoded
    ([MULTIPART], multipart(('name="title"', b"x"), ('name="_method"', b"DELETE")), ("DELETE",)),
    ([MULTIPART], multipart(("NAME=_method", b"put")), ("put",)),
    ([MULTIPART], multipart(("name*=UTF-8''_method", b"DELETE")), ("DELETE",)),
    ([MULTIPART], multipart(('name="_method"\r\nContent-Transfer-Encoding: base64', b"UFVU")), ("UFVU", "PUT")),
    ([(b"content-type", b"multipart/mixed; boundary=b0und")], multipart(('name="_method"', b"PATCH")), ("PATCH",)),
    ([MULTIPART], multipart(('name="x_method"', b"DELETE"), ('name="file"; filename="_method"', b"PUT")), ()),
    ([MULTIPART], multipart(("name*0=\"_me\"; name*1=\"thod\"", b"PATCH")), ("PATCH",)),  # RFC 2231 continuations
    ([MULTIPART], multipart(("name*=UTF-8''%5F%6Dethod", b"PATCH")), ("PATCH",)),
    ([MULTIPART], b"preamble\r\n" + multipart(('name="_method"', b"PUT")), ("PUT",)),
    ([MULTIPART], b'--b0und junk\r\nContent-Disposition: form-data; name="_method"\r\n\r\nPUT\r\n--b0und--', ("PUT",)),
    ([MULTIPART], b'--b0und\nContent-Disposition: form-data; name="_method"\n\nDELETE\n--b0und--\n', ("DELETE",)),
    # a delimiter within a line is data: it neither ends a part nor hides the next one
    ([MULTIPART], multipart(('name="f"', b"x--b0und" * 5000), ('name="_method"', b"PUT")), ("PUT",)),
    ([MULTIPART], multipart(('name="f"', b"x\r\n--b0und--x"), ('name="_method"', b"PUT")), ("PUT",)),
    # a JSON object's own _method (Laravel), not a nested one
    ([(b"content-type", b"application/json")], b'{"_method": "DELETE", "a": {"_method": "PUT"}}', ("DELETE",)),
    ([(b"content-type", b"application/vnd.api+json")], b'{"_method": "patch"}', ("patch",)),
    ([(b"content-type", b"text/json; charset=utf-8")], b' {"_method": "put"}', ("put",)),
    ([(b"content-type", b"application/json")], b'[{"_method": "DELETE"}]', ()),
    ([(b"content-type", b"application/json")], b'{"_method": "DELETE"', ()),  # not JSON: no server reads it
    # its name's letters escaped
    ([(b"content-type", b"application/json")], b'{"\\u005f\\u006D\\u0065\\u0074\\u0068\\u006f\\u0064": "DELETE"}',
     ("DELETE",)),
    # a body no framework reads a field from
    ([(b"content-type", b"text/plain")], b"_method=DELETE", ()),
    # every Content-Type given is read
    ([(b"content-type", b"text/plain"), FORM], b"_method=DELETE", ("DELETE",)),
])
def test_body_method_overrides_are_read_as_frameworks_read_them(headers: list[tuple[bytes, bytes]], body: bytes,
                                                                 named: tuple[str, ...]) -> None:
    assert body_method_overrides(headers, body) == named


def test_a_multipart_body_of_more_parts_than_frameworks_read_is_not_read_in_part() -> None:
    at_limit = multipart(*[('name="x"', b"1")] * (MAX_PARTS - 1), ('name="_method"', b"PUT"))
    assert body_method_overrides([MULTIPART], at_limit) == ("PUT",)
    with pytest.raises(BodyUnread, match=f"more than {MAX_PARTS} parts"):
        body_method_overrides([MULTIPART], multipart(*[('name="x"', b"1")] * MAX_PARTS, ('name="_method"', b"PUT")))
    with pytest.raises(BodyUnread):
        body_method_overrides([MULTIPART], b"--b0und\r\n\r\n" * 200_000)


def test_a_form_of_more_fields_than_frameworks_read_is_not_read_in_part() -> None:
    """Read where each field begins, so a body of any bytes costs a few passes of ``bytes.find``; a form of
    more fields than Rack reads is refused, whichever separator makes them."""
    at_limit = b"x=1&" * (MAX_PARTS - 2) + b"a=1;_method=PUT"
    assert body_method_overrides([FORM], at_limit) == ("PUT",)
    for separator in (b"&", b";"):
        with pytest.raises(BodyUnread, match=f"a form of more than {MAX_PARTS} fields"):
            body_method_overrides([FORM], b"_method=PUT" + separator * MAX_PARTS)
    assert body_method_overrides([FORM], b"_" * 100_000 + b"&%5Fmethod=DELETE&" + b"%" * 100_000) == ("DELETE",)


def test_only_a_posts_form_or_json_body_is_read_for_a_method_override() -> None:
    assert body_overrides_read(b"POST", [])
    assert body_overrides_read(b"POST", [(b"content-type", b"")])
    assert body_overrides_read(b"POST", [MULTIPART])
    assert body_overrides_read(b"POST", [(b"content-type", b"application/json")])
    assert not body_overrides_read(b"POST", [(b"content-type", b"application/octet-stream")])
    assert not body_overrides_read(b"PUT", [FORM])  # frameworks override a POST only
    assert not body_overrides_read(b"GET", [])
