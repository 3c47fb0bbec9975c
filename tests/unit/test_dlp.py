"""DLP on requests: held secrets in every encoding and known credential formats are found in the URL, the
headers and the body, split at every byte across chunks, never forwarded in part; ordinary traffic passes."""

from __future__ import annotations

import base64
import gzip
import io
import json
import random
import tarfile
import urllib.parse
import uuid
import zlib
from pathlib import Path

import pytest

from claude_bottle.gate.dlp import (
    BUILTIN_NAMES,
    BUILTIN_RULES,
    HELD_SECRET,
    DlpMatch,
    DlpPolicy,
    DlpScanner,
    InvalidDlpRule,
    parse_dlp_rule,
    policy_from_flags,
    secret_needles,
)

RNG = random.Random(20261123)
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


# Made-up values in each format, assembled here so no file holds a whole one.
# A held value of no known format, so only the held-secret rule can find it (a credential route's value).
# Its "~~~" puts a '+' in the base64 at every alignment, so the URL-safe alphabet differs from the standard.
HELD = ("route-" + rand(29, ALNUM + "-_") + "~~~~~~" + rand(29, ALNUM + "-_")).encode()
ONLY_HELD = DlpPolicy(disabled=frozenset(BUILTIN_NAMES))  # its tail is set by the held secret's needles alone
SAMPLES: dict[str, bytes] = {
    "anthropic-key": ("sk-ant-" + "api03-" + rand(93, ALNUM + "-_") + "AA").encode(),
    "github-token": ("gh" + "p_" + rand(36)).encode(),
    "github-token/oauth": ("gh" + "o_" + rand(36)).encode(),
    "github-token/app": ("gh" + "s_" + rand(36)).encode(),
    "github-token/fine-grained": ("github" + "_pat_" + rand(22) + "_" + rand(59)).encode(),
    "aws-access-key-id": ("AK" + "IA" + rand(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")).encode(),
    "aws-access-key-id/sts": ("AS" + "IA" + rand(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")).encode(),
    "aws-secret-access-key": ("aws_secret_access_key = " + rand(40, ALNUM + "/+")).encode(),
    "aws-secret-access-key/json": ('"SecretAccessKey": "' + rand(40, ALNUM + "/+") + '"').encode(),
    "npm-token": ("np" + "m_" + rand(36)).encode(),
    "pypi-token": ("py" + "pi-AgEIcHlwaS5vcmc" + rand(150, ALNUM + "-_")).encode(),
    "slack-token": ("xo" + "xb-" + rand(12, "0123456789") + "-" + rand(13, "0123456789") + "-" + rand(24)).encode(),
    "slack-token/user": ("xo" + "xp-" + rand(11, "0123456789") + "-" + rand(10, "0123456789") + "-" + rand(32)).encode(),
    "slack-webhook": ("https://hooks.slack" + ".com/services/T" + rand(8) + "/B" + rand(8) + "/" + rand(24)).encode(),
    "google-api-key": ("AI" + "za" + rand(35, ALNUM + "-_")).encode(),
    "private-key": b"-----BEGIN " + b"RSA PRIVATE KEY-----\nMIIEow" + rand(60).encode(),
    "private-key/openssh": b"-----BEGIN " + b"OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
    "private-key/ec": b"-----BEGIN " + b"EC PRIVATE KEY-----\nMHcCAQEE",
    "private-key/pkcs8": b"-----BEGIN " + b"ENCRYPTED PRIVATE KEY-----\nMIIFHDBO",
    "private-key/pgp": b"-----BEGIN " + b"PGP PRIVATE KEY BLOCK-----\n\nlQOYBF",
    "jwt": (base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=") + b"."
            + base64.urlsafe_b64encode(json.dumps({"sub": rand(10), "iat": 1700000000}).encode()).rstrip(b"=")
            + b"." + rand(43, ALNUM + "-_").encode()),
}
PRE, POST = b'{"note": "see ', b'", "n": 1}\n'


def rule_of(label: str) -> str:
    return label.split("/")[0]


DEFAULT = DlpPolicy()


def scanner(secrets: tuple[bytes, ...] = (HELD,), policy: DlpPolicy = DEFAULT) -> DlpScanner:
    return policy.scanner(secrets)


def feed_all(scan: DlpScanner, chunks: list[bytes]) -> tuple[bytes, DlpMatch | None]:
    """What was passed on before a match, and the match (or None, with everything passed on)."""
    out = b""
    try:
        for chunk in chunks:
            out += scan.feed(chunk)
        out += scan.finish()
    except DlpMatch as match:
        return out, match
    return out, None


def split_everywhere(data: bytes) -> list[list[bytes]]:
    return [[data[:cut], data[cut:]] for cut in range(1, len(data))]


# --- held secrets, in every encoding --------------------------------------------------------------------------


def percent_all(data: bytes, upper: bool) -> bytes:
    return b"".join((b"%%%02X" if upper else b"%%%02x") % c for c in data)


def encodings(secret: bytes) -> dict[str, bytes]:
    forms = {"as is": secret, "hex": secret.hex().encode(), "HEX": secret.hex().upper().encode(),
             "percent lower": percent_all(secret, upper=False), "percent upper": percent_all(secret, upper=True),
             "percent mixed": b"".join(percent_all(secret[i:i + 1], upper=i % 3 == 0) if i % 2 else secret[i:i + 1]
                                       for i in range(len(secret))),
             "query": urllib.parse.quote_plus(secret.decode()).encode()}
    for prefix in (b"", b"x", b"xy"):
        for suffix in (b"", b"!", b"!?"):
            data = prefix + secret + suffix
            standard = base64.b64encode(data)
            forms[f"base64 +{len(prefix)} +{len(suffix)}"] = standard
            forms[f"base64 unpadded +{len(prefix)} +{len(suffix)}"] = standard.rstrip(b"=")
            forms[f"base64url +{len(prefix)} +{len(suffix)}"] = base64.urlsafe_b64encode(data)
            forms[f"base64url unpadded +{len(prefix)} +{len(suffix)}"] = base64.urlsafe_b64encode(data).rstrip(b"=")
            forms[f"base64 in a URL +{len(prefix)} +{len(suffix)}"] = urllib.parse.quote(standard, safe="").encode()
    return forms


HELD_FORMS = encodings(HELD)


def test_the_base64_alphabets_differ_for_the_held_secret() -> None:
    standard = [needle for needle, encoding in secret_needles([HELD]) if encoding == "base64"]
    assert len(standard) == 3 and all(b"+" in needle for needle in standard), "one per alignment, each with a +"


@pytest.mark.parametrize("policy", [DlpPolicy(), ONLY_HELD], ids=["all rules", "no format rules"])
@pytest.mark.parametrize("form", HELD_FORMS)
def test_a_held_secret_is_found_in_every_encoding_split_at_every_byte(form: str, policy: DlpPolicy) -> None:
    body = PRE + HELD_FORMS[form] + POST
    for chunks in [[body], *split_everywhere(body)]:
        out, match = feed_all(scanner(policy=policy), chunks)
        assert match is not None and match.rule == HELD_SECRET, (form, [len(c) for c in chunks])
        assert len(out) <= len(PRE), "bytes of the secret were passed on before the match"
    url = b"/upload?data=" + HELD_FORMS[form]
    with pytest.raises(DlpMatch, match=r"a secret the gate holds .* in the request URL"):
        scanner().check_head(url, [])


def test_the_anthropic_credential_is_refused_in_every_encoding() -> None:
    credential = SAMPLES["anthropic-key"]
    for form, data in encodings(credential).items():
        body = PRE + data + POST
        for chunks in [[body], [body[:len(body) // 2], body[len(body) // 2:]]]:
            out, match = feed_all(scanner((credential,)), chunks)
            assert match is not None and match.rule in (HELD_SECRET, "anthropic-key"), form
            assert len(out) <= len(PRE)


def test_a_secret_with_spaces_is_found_form_encoded() -> None:
    secret = b"correct horse battery staple 42"
    scan = scanner((secret,))
    with pytest.raises(DlpMatch, match=r"\(form-encoded\)"):
        scan.check_head(b"/login?p=" + urllib.parse.quote_plus(secret.decode()).encode(), [])


def test_the_reason_names_the_rule_and_never_the_value() -> None:
    with pytest.raises(DlpMatch) as caught:
        scanner().check_head(b"/", [(b"x-exfil", base64.b64encode(HELD))])
    assert caught.value.reason == "a secret the gate holds (base64) in the request headers: DLP rule held-secret"
    decision = caught.value.decision
    assert (decision.allow, decision.status) == (False, 403)
    for label, sample in SAMPLES.items():
        with pytest.raises(DlpMatch) as found:
            scanner().check_head(b"/", [(b"x-a", sample)])
        assert found.value.reason == f"a credential in the request headers: DLP rule {rule_of(label)}"
        assert sample.decode() not in str(found.value)


def test_held_secrets_must_be_long_enough_to_match_safely() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        scanner((b"short",))


# --- known credential formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("label", SAMPLES)
def test_a_credential_format_is_found_split_at_every_byte(label: str) -> None:
    body = PRE + SAMPLES[label] + POST
    for chunks in [[body], *split_everywhere(body), [body[i:i + 1] for i in range(len(body))]]:
        out, match = feed_all(scanner(secrets=()), chunks)
        assert match is not None and match.rule == rule_of(label), (label, [len(c) for c in chunks])
        assert len(out) <= len(PRE)


@pytest.mark.parametrize("label", SAMPLES)
def test_a_credential_format_is_found_in_the_url_and_headers_and_percent_encoded(label: str) -> None:
    sample = SAMPLES[label]
    for target, headers in [(b"/x?token=" + sample, []), (b"/" + percent_all(sample, upper=True), []),
                            (b"/", [(b"authorization", b"Bearer " + sample)]), (b"/", [(b"x-note", sample)])]:
        with pytest.raises(DlpMatch) as caught:
            scanner().check_head(target, headers)
        assert caught.value.rule == rule_of(label)


@pytest.mark.parametrize("label", SAMPLES)
def test_a_disabled_rule_lets_its_format_through(label: str) -> None:
    policy = DlpPolicy(disabled=frozenset({rule_of(label)}))
    out, match = feed_all(policy.scanner(()), [PRE + SAMPLES[label] + POST])
    assert match is None, match
    assert out == PRE + SAMPLES[label] + POST


@pytest.mark.parametrize(("text", "why"), [
    (b"x" + SAMPLES["github-token"], "a longer word"),
    (SAMPLES["github-token"] + b"_x", "a longer word"),  # longer tokens (up to 255) are tokens: GitHub may grow them
    (b"gh" + b"p_" + rand(20).encode(), "too short"),
    (b"A" + SAMPLES["aws-access-key-id"], "a longer word"),
    (SAMPLES["aws-access-key-id"] + b"Q", "a longer word"),
    (b"AK" + b"IAIOSFODNN7EXAMPLE1", "a longer word"),
    (b"aws_secret_access_key = " + rand(39).encode(), "too short"),
    (b"np" + b"m_" + rand(36).encode() + b"x", "a longer word"),
    (b"xo" + b"xb-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx", "a placeholder"),
    (b"AI" + b"za" + rand(34).encode(), "too short"),
    (b"-----BEGIN " + b"PUBLIC KEY-----", "a public key"),
    (b"-----BEGIN " + b"CERTIFICATE-----", "a certificate"),
    (b"eyJhbGciOiJIUzI1NiJ9", "a JWT header alone"),
    (b"sk-ant-" + b"oat01-placeholder", "too short"),
])
def test_near_misses_are_not_credentials(text: str, why: str) -> None:
    body = b"a " + text + b" b"
    for chunks in [[body], *split_everywhere(body)]:
        out, match = feed_all(scanner(secrets=()), chunks)
        assert match is None, (why, match, [len(c) for c in chunks])
        assert out == body


def test_a_longer_word_is_not_a_match_across_a_window_boundary() -> None:
    """Past the first window the scanner has dropped the bytes before its tail; a token that a longer word
    began earlier must still not match there (the look-behind context would otherwise be lost)."""
    policy = DlpPolicy(disabled=frozenset(set(BUILTIN_NAMES) - {"github-token"}))
    scan = policy.scanner(())
    word = b"x" + SAMPLES["github-token"]
    body = b"." * (scan.tail + 50) + word + b" " + b"." * (scan.tail + 50)
    for size in [*range(1, 40), 97, 1000, scan.tail - 1, scan.tail, scan.tail + 1]:
        out, match = feed_all(policy.scanner(()), [body[i:i + size] for i in range(0, len(body), size)])
        assert match is None, size
        assert out == body
    for chunks in split_everywhere(body):
        out, match = feed_all(policy.scanner(()), chunks)
        assert match is None and out == body, [len(c) for c in chunks]
    found = body.replace(b"x" + SAMPLES["github-token"], b" " + SAMPLES["github-token"])
    for size in [1, 7, scan.tail - 3, scan.tail + 5]:
        _, match = feed_all(policy.scanner(()), [found[i:i + size] for i in range(0, len(found), size)])
        assert match is not None and match.rule == "github-token", size


def test_the_tail_is_all_that_is_held() -> None:
    scan = scanner()
    chunk = bytes(RNG.randbytes(64 * 1024))
    passed = scan.feed(chunk)
    assert len(passed) == len(chunk) - scan.tail
    assert scan.feed(chunk) == chunk[len(chunk) - scan.tail :] + chunk[: len(chunk) - scan.tail]
    assert scan.finish() == chunk[len(chunk) - scan.tail :]
    assert scan.tail < 24 * 1024  # six times the longest match (a JSON-escaped JWT), and a margin


# --- ordinary traffic -------------------------------------------------------------------------------------------


def git_pack(size: int) -> bytes:
    objects = b"".join(zlib.compress(b"blob %d\0" % i + RNG.randbytes(RNG.randrange(100, 4000)))
                       for i in range(size // 2000))
    return b"PACK\x00\x00\x00\x02" + len(objects).to_bytes(4, "big") + objects + RNG.randbytes(20)


def npm_tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in [("package/package.json", json.dumps({"name": "left-pad", "version": "1.3.0"}).encode()),
                           ("package/index.js", b"module.exports = (s, n) => s.padStart(n);\n" * 200),
                           ("package/blob.bin", RNG.randbytes(200_000))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue())


def wheel_upload_head() -> bytes:
    boundary = "----" + uuid.UUID(int=RNG.getrandbits(128)).hex
    fields = {":action": "file_upload", "protocol_version": "1", "metadata_version": "2.1", "name": "example-pkg",
              "version": "1.0.0", "filetype": "bdist_wheel", "pyversion": "py3",
              "md5_digest": RNG.randbytes(16).hex(), "sha256_digest": RNG.randbytes(32).hex(),
              "blake2_256_digest": RNG.randbytes(32).hex(), "summary": "An example package"}
    parts = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items())
    return (parts + f'--{boundary}\r\nContent-Disposition: form-data; name="content"; '
            'filename="example_pkg-1.0.0-py3-none-any.whl"\r\nContent-Type: application/octet-stream\r\n\r\nPK\x03\x04').encode()


def json_with_ids() -> bytes:
    items = [{"id": str(uuid.UUID(int=RNG.getrandbits(128))), "sha": RNG.randbytes(32).hex(),
              "node_id": base64.b64encode(RNG.randbytes(24)).decode(), "etag": RNG.randbytes(20).hex().upper(),
              "cursor": base64.urlsafe_b64encode(RNG.randbytes(48)).decode(), "ulid": rand(26, "0123456789ABCDEFGHJKMNPQRSTVWXYZ"),
              "request_id": "req_" + rand(24), "token_count": RNG.randrange(10**6),
              "url": f"https://api.github.com/repos/o/r/commits/{RNG.randbytes(20).hex()}?page=2&per_page=100"}
             for _ in range(300)]
    return json.dumps({"items": items}).encode()


ORDINARY = {
    "git pack": lambda: git_pack(400_000),
    "git upload-pack request": lambda: b"".join(b"0032want %s\n" % RNG.randbytes(20).hex().encode() for _ in range(200)) + b"00000009done\n",
    "npm tarball": npm_tarball,
    "wheel upload head": wheel_upload_head,
    "JSON with ids": json_with_ids,
    "random bytes": lambda: RNG.randbytes(1_000_000),
    "random base64": lambda: base64.b64encode(RNG.randbytes(750_000)),
    "random base64url with dots": lambda: b".".join(base64.urlsafe_b64encode(RNG.randbytes(30)) for _ in range(20_000)),
    "Claude Code messages": lambda: (Path(__file__).parents[1] / "testdata" / "claude-code-messages.json").read_bytes(),
    "form with escapes": lambda: b"&".join(b"k%d=%s" % (i, urllib.parse.quote(RNG.randbytes(30)).encode()) for i in range(5000)),
}


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_traffic_passes_unchanged(name: str) -> None:
    body = ORDINARY[name]()
    for size in (1400, 16 * 1024, 64 * 1024):
        out, match = feed_all(scanner(), [body[i:i + size] for i in range(0, len(body), size)])
        assert match is None, (name, match)
        assert out == body


def test_ordinary_heads_pass() -> None:
    scanner().check_head(
        b"/repos/o/r/contents/src/main.py?ref=" + RNG.randbytes(20).hex().encode(),
        [(b"host", b"api.github.com"), (b"user-agent", b"git/2.43.0"), (b"accept", b"application/vnd.github+json"),
         (b"if-none-match", b'W/"' + RNG.randbytes(32).hex().encode() + b'"'),
         (b"x-request-id", str(uuid.UUID(int=RNG.getrandbits(128))).encode()),
         (b"git-protocol", b"version=2"), (b"content-type", b"application/x-git-upload-pack-request")])


# --- configured rules ----------------------------------------------------------------------------------------------


def test_configured_rules_are_found_and_flags_round_trip() -> None:
    policy = policy_from_flags(["internal-token itk_[a-z0-9]{32}"], ["jwt", "google-api-key"])
    assert [r.name for r in policy.rules][-1] == "internal-token"
    assert "jwt" not in [r.name for r in policy.rules]
    _, match = feed_all(policy.scanner(()), [b"x itk_" + rand(32, "abcdefghij0123456789").encode() + b" y"])
    assert match is not None and match.rule == "internal-token"
    assert policy_from_flags(*_split_args(policy.args())) == policy


def _split_args(args: list[str]) -> tuple[list[str], list[str]]:
    pairs = list(zip(args[::2], args[1::2], strict=True))
    return [v for k, v in pairs if k == "--dlp-rule"], [v for k, v in pairs if k == "--dlp-off"]


@pytest.mark.parametrize(("name", "regex", "message"), [
    ("Internal", "itk_[a-z]{32}", "use lower-case letters"),
    ("jwt", "itk_[a-z]{32}", "is a built-in rule's"),
    ("held-secret", "itk_[a-z]{32}", "is a built-in rule's"),
    ("x", "itk_[a-z", "not a valid regular expression"),
    ("x", "itk_[a-z]+", "bound every repetition"),
    ("x", "itk_.{5000}", "can match more than 4096 bytes"),
    ("x", "[a-z]{2,40}", "fewer than 8 bytes"),
    ("x", "a|itk_[a-z]{32}", "fewer than 8 bytes"),
])
def test_bad_configured_rules_say_how_to_fix_them(name: str, regex: str, message: str) -> None:
    with pytest.raises(InvalidDlpRule, match=message):
        parse_dlp_rule(name, regex)


@pytest.mark.parametrize(("rules", "off", "message"), [
    (["internal-token"], [], "write NAME REGEX"),
    (["a itk_[a-z]{32}", "a itk_[a-z]{32}"], [], "given twice"),
    ([], ["aws"], "not a built-in DLP rule"),
    ([], ["held-secret"], "the gate's own secrets are always refused"),
])
def test_bad_dlp_flags(rules: list[str], off: list[str], message: str) -> None:
    with pytest.raises(InvalidDlpRule, match=message):
        policy_from_flags(rules, off)


# --- small views searched for every literal at once ------------------------------------------------------------


@pytest.mark.parametrize("pad", [0, 200, 600], ids=["tiny", "small", "past the small-view size"])
def test_a_view_finds_the_same_rule_whether_small_or_large(pad: int) -> None:
    """A small view is first searched for every needle and anchor at once (DlpMatcher); a larger one goes
    through them one by one. The match, and what it names, do not depend on which."""
    filler = b" " * pad
    for label, sample in [*SAMPLES.items(), *[(f"held {form}", data) for form, data in HELD_FORMS.items()]]:
        for where, scan in (("URL", lambda s, d: s.check_head(d, [])),
                            ("headers", lambda s, d: s.check_head(b"/", [(b"x-note", d)])),
                            ("body", lambda s, d: (s.feed(d), s.finish()))):
            with pytest.raises(DlpMatch) as found:
                scan(scanner(), filler + sample + filler)
            expected = HELD_SECRET if label.startswith("held") else rule_of(label)
            assert (found.value.rule, found.value.where) == (expected, where), label
    scan = scanner()
    scan.check_head(b"/v1/messages?beta=true" + filler, [(b"user-agent", b"claude-cli" + filler)])
    assert scan.feed(b'{"model": "m"}' + filler) == b"" and scan.finish() == b'{"model": "m"}' + filler


def test_a_body_read_whole_ends_in_one_final_scan_of_its_last_piece() -> None:
    """``finish(last)``: the last piece of a body read whole is scanned once, as the stream's end, together
    with what earlier pieces left held back; a match split across the two is found as when streamed."""
    token = SAMPLES["github-token"]
    for body in (token, b'{"content": "' + token + b'"}'):
        with pytest.raises(DlpMatch):
            scanner().finish(body)
    filler = b" " * (scanner().tail + 100)  # some of it is passed on: the match is not all held back
    for cut in range(1, len(token)):
        scan = scanner()
        assert scan.feed(filler + token[:cut]) == filler[: len(filler) + cut - scan.tail]
        with pytest.raises(DlpMatch):
            scan.finish(token[cut:])
    assert scanner().finish(b'{"model": "m"}') == b'{"model": "m"}'


# --- a rule's regex runs around its anchors only -----------------------------------------------------------------


@pytest.mark.parametrize("keyword", [b"aws_secret_access_key", b"AWS_SECRET_ACCESS_KEY", b"SecretAccessKey",
                                     b"SeCrEt_AcCeSs_KeY", b"awsSECRETkey", b"aws_sEcReT"])
@pytest.mark.parametrize("pad", [0, 600, 70_000], ids=["small view", "large view", "past a scan piece"])
def test_a_case_blind_keyword_is_found_in_any_case(keyword: bytes, pad: int) -> None:
    """The AWS secret key's rule ignores the keyword's case, so its anchor is found in any case too."""
    body = b"x" * pad + keyword + b' = "' + rand(40, ALNUM + "/+").encode() + b'"' + b"x" * pad
    for chunks in ([body], [body[i:i + 16 * 1024] for i in range(0, len(body), 16 * 1024)]):
        out, match = feed_all(scanner(secrets=()), chunks)
        assert match is not None and match.rule == "aws-secret-access-key", (keyword, pad)
        assert len(out) <= pad


@pytest.mark.parametrize("label", SAMPLES)
def test_a_credential_is_found_far_from_another_of_its_anchors(label: str) -> None:
    """The regex runs around each anchor's every occurrence: a token 40 KB after a harmless occurrence of one
    of its rule's anchors (and before another) is found."""
    rule = next(r for r in BUILTIN_RULES if r.name == rule_of(label))
    decoy = b" " + rule.anchors[0] + b" "
    body = decoy + b"." * 40_000 + SAMPLES[label] + b"." * 40_000 + decoy
    _, match = feed_all(scanner(secrets=()), [body])
    assert match is not None and match.rule == rule.name


def test_anchors_everywhere_still_find_the_token() -> None:
    filler = b"secret, " * 20_000
    _, match = feed_all(scanner(secrets=()), [filler + SAMPLES["aws-secret-access-key"] + b", " + filler])
    assert match is not None and match.rule == "aws-secret-access-key"
    out, match = feed_all(scanner(secrets=()), [filler])
    assert match is None and out == filler


def test_searching_around_the_anchors_finds_what_searching_the_whole_view_finds() -> None:
    """Views of samples, their near misses, stray anchors and filler, cut at random: a rule finds a match in
    exactly the views where its regex run over the whole view finds one."""
    pieces = [*SAMPLES.values(), *(a for r in BUILTIN_RULES for a in r.anchors), b"SECRET_access_KEY = ",
              b"x" * 40, b"/" * 40, b" ", b"\n", b"." * 3000, b"eyJ" + rand(20).encode() + b"."]
    for _ in range(400):
        view = b"".join(RNG.choice(pieces) for _ in range(RNG.randrange(1, 12)))
        view = view[RNG.randrange(0, 20):]
        start = RNG.randrange(0, 20)
        for rule in BUILTIN_RULES:
            for final in (True, False):
                whole = any(final or m.end() < len(view) for m in rule.pattern.finditer(view, start))
                assert rule.search(view, start, final) == whole, (rule.name, final, start, view)
