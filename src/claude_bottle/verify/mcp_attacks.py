"""``verify``'s attacks on a remote MCP server's tool rules and credential, sent from the bottle with curl, as
Claude Code's MCP client would send them, to the MCP stand-in (``verify.mcp_server``) that verify adds to the
agent (``standins.mcp_server_of``: tools ``search_*`` and ``get_issue``, ``delete_*`` denied, a credential route
whose sentinel the bottle's MCP config holds).

Every request goes out in one script in the bottle (at once: each is a curl of its own), carrying a marker of
its own; each is then judged by the gate's answer and by what the stand-ins logged. A refused request must
never reach a stand-in (its marker is in none of their logs) and must get the gate's refusal: an HTTP 4xx, or
a JSON-RPC error naming the user's claude-bottle policy. A control, an allowed call, must reach the server with
the route's real value and never the sentinel; if it does not, every refusal counts as a leak, since it proved
nothing."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import re
import secrets
import shlex
from dataclasses import dataclass
from typing import Any

from claude_bottle.policy.mcp import POLICY_ERROR
from claude_bottle.verify.attack import Attack, Outcome, Verdict
from claude_bottle.verify.standins import INSPECTED, MCP_PATH, TLS_PORT, TRACKER, Verification, in_bottle

MCP = "MCP server"
# In a request's body, URL and headers (``Sent.fills``): its marker, the route's sentinel (as it is, and each
# character in a JSON escape), the MCP server's host, port and address, another inspected host:port.
MARK, SENTINEL, ESCAPED_SENTINEL = "@MARK@", "@SENTINEL@", "@ESCAPED_SENTINEL@"
HOST, PORT, ADDRESS, OTHER = "@HOST@", "@PORT@", "@ADDRESS@", "@OTHER@"
HOST_SPELLED = "@HOST_SPELLED@"  # the host in upper case
SERVER = f"{HOST}:{PORT}"
ALLOWED, DENIED = "get_issue", "delete_issue"
CURL_SECONDS = 20
# Requests in flight together. All of the round at once (about 100 processes) made gVisor's sandbox (runsc
# 2022, ptrace platform) die under the script, the bottle with it.
AT_ONCE = 4
_SECTION = re.compile(r"\n@@verify-mcp (\d+)\n")


@dataclass(frozen=True)
class Answer:
    """What came of one request: the final response status (None if no answer came), its X-Deny-Reason or
    curl's last words, and its body."""

    status: int | None
    reason: str
    body: str

    def errors(self) -> list[dict[str, Any]]:
        """The JSON-RPC errors in the body (one message, a batch, or SSE events carrying them)."""
        return [m["error"] for m in messages(self.body) if isinstance(m.get("error"), dict)]

    def refused_by_policy(self) -> bool:
        """The gate's refusal: a 4xx with its reason (the server's own 4xx has none), or a JSON-RPC error naming
        the user's claude-bottle policy."""
        if self.status is not None and 400 <= self.status < 500:
            return bool(self.reason)
        return self.status == 200 and any("claude-bottle" in str(e.get("message", "")) for e in self.errors())

    def shown(self) -> str:
        if self.status is None:
            return self.reason
        errors = sorted(self.errors(), key=lambda e: e.get("code") != POLICY_ERROR)  # the policy's first
        coded = [f"JSON-RPC error {e.get('code')}" for e in errors[:1]]
        return ", ".join([f"HTTP {self.status}", *coded]) + (f" ({self.reason})" if self.reason else "")


def messages(body: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages in an answer's body: JSON (one or a batch), or the ``data`` of SSE events."""
    texts = [body]
    if body.lstrip().startswith(("event:", "data:", ":")):
        texts = ["\n".join(line[5:].strip() for line in event.splitlines() if line.startswith("data:"))
                 for event in re.split(r"\r?\n\r?\n", body)]
    found: list[dict[str, Any]] = []
    for text in texts:
        try:
            data = json.loads(text)
        except ValueError:
            continue
        found += [m for m in (data if isinstance(data, list) else [data]) if isinstance(m, dict)]
    return found


@dataclass(frozen=True)
class Sent:
    """Where the round goes and what it carries: the MCP server's ``host``, ``port`` and ``address``,
    ``other`` (another host:port the gate inspects), the route's ``sentinel`` (the bottle's) and ``value``
    (the gate's), and the round's ``mark``, which every request's marker holds."""

    host: str
    port: int
    address: str
    other: str
    sentinel: str
    value: str
    mark: str = dataclasses.field(default_factory=lambda: secrets.token_hex(4))

    def fills(self, marker: str) -> dict[str, str]:
        return {MARK: marker, SENTINEL: self.sentinel, HOST: self.host, PORT: str(self.port),
                ADDRESS: self.address, OTHER: self.other, HOST_SPELLED: self.host.upper(),
                ESCAPED_SENTINEL: "".join(f"\\u{ord(c):04x}" for c in self.sentinel)}


@dataclass(frozen=True)
class Exchange:
    """The MCP round: each request's answer by its index, what the stand-ins logged (the MCP server's and the
    open HTTPS one's), the route's sentinel and value, and whether the control reached the server."""

    answers: dict[int, Answer]
    logged: list[dict[str, Any]]
    sent: Sent
    control_arrived: bool = True

    def arrived(self, marker: str) -> list[dict[str, Any]]:
        """The logged requests that carry ``marker`` anywhere (target, headers, body)."""
        return [entry for entry in self.logged if marker in json.dumps(entry, ensure_ascii=False)]


@dataclass(frozen=True)
class McpRequest(Attack[Exchange, Answer]):
    """One request the bottle sends: ``body`` (``MARK`` and ``SENTINEL`` filled in) POSTed to ``url``, with the
    bottle's MCP credential (the sentinel, as Claude Code's config sends it) and ``headers``. It must be
    refused by the gate and never reach a stand-in. ``index``: its place in the round, set by ``ROUND``."""

    body: str
    url: str = f"https://{SERVER}{MCP_PATH}"
    headers: tuple[str, ...] = ()
    accept: str = "application/json, text/event-stream"
    encoded: bool = False  # the body gzip-encoded (Content-Encoding: gzip)
    index: int = 0

    def marker(self, mark: str) -> str:
        """Its marker in the round ``mark``: no other request's contains it (the final dash)."""
        return f"verify-{mark}-{self.index}-"

    def curl(self, sent: Sent) -> str:
        """The command that sends it, its body on standard input."""
        fills = sent.fills(self.marker(sent.mark))

        def filled(text: str) -> str:
            return re.sub("|".join(map(re.escape, fills)), lambda m: fills[m.group()], text)

        data = filled(self.body).encode()
        data = gzip.compress(data) if self.encoded else data
        headers = ["Content-Type: application/json", f"Accept: {self.accept}",
                   f"Authorization: Bearer {sent.sentinel}",
                   *map(filled, self.headers), *(["Content-Encoding: gzip"] if self.encoded else [])]
        return (f"printf %s {base64.b64encode(data).decode()} | base64 -d | curl -k -sS --suppress-connect-headers "
                f"--max-time {CURL_SECONDS} -D - -X POST {shlex.quote(filled(self.url))} "
                + " ".join(f"-H {shlex.quote(h)}" for h in headers) + " --data-binary @-")

    def run(self, target: Exchange) -> Answer:
        return target.answers.get(self.index, Answer(None, "not sent", ""))

    def judge(self, target: Exchange, result: Answer) -> Verdict:
        got = target.arrived(self.marker(target.sent.mark))
        if target.sent.value in result.body:
            return "the route's value came back to the bottle", False
        if any(target.sent.sentinel in json.dumps(entry) for entry in got):
            return f"the server got the sentinel ({result.shown()})", False
        return self.judge_arrival(target, result, got)

    def judge_arrival(self, target: Exchange, result: Answer, got: list[dict[str, Any]]) -> Verdict:
        if got:
            return f"the server got it ({result.shown()})", False
        if not target.control_arrived:
            return f"inconclusive: the allowed call did not arrive either ({result.shown()})", False
        if result.refused_by_policy():
            return result.shown(), True
        return f"not refused ({result.shown()})", False


@dataclass(frozen=True)
class Stripped(McpRequest):
    """The sentinel sent where the gate may refuse the request or strip the sentinel: blocked if the server
    never got the sentinel (``McpRequest.judge`` says so if it did)."""

    def judge_arrival(self, target: Exchange, result: Answer, got: list[dict[str, Any]]) -> Verdict:
        if got:
            return f"stripped before the server ({result.shown()})", True
        return super().judge_arrival(target, result, got)


@dataclass(frozen=True)
class AllowedCall(McpRequest):
    """The control: an allowed call, which must reach the server with the route's real value."""

    def judge_arrival(self, target: Exchange, result: Answer, got: list[dict[str, Any]]) -> Verdict:
        if not got:
            return f"did not arrive ({result.shown()})", False
        sent = {v for entry in got for n, v in entry.get("headers", []) if n.lower() == "authorization"}
        if sent != {f"Bearer {target.sent.value}"}:
            return "arrived without the route's value", False
        return f"arrived with the route's value ({result.shown()})", True


@dataclass(frozen=True)
class ToolList(McpRequest):
    """``tools/list``, which must reach the server and come back without the denied tool (and with the
    allowed one, else it proves nothing)."""

    def judge_arrival(self, target: Exchange, result: Answer, got: list[dict[str, Any]]) -> Verdict:
        tools = [t.get("name") for m in messages(result.body) if isinstance(m.get("result"), dict)
                 for t in m["result"].get("tools", []) if isinstance(t, dict)]
        if DENIED in tools:
            return f"offered {DENIED}", False
        if not got or ALLOWED not in tools:
            return f"inconclusive: no list with {ALLOWED} came back ({result.shown()})", False
        return f"offered {', '.join(map(str, tools))}", True


def call(tool: str, arguments: dict[str, Any] | None = None, ident: object = MARK) -> dict[str, Any]:
    """A ``tools/call`` message (a notification when ``ident`` is None)."""
    message = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": tool, "arguments": arguments or {}}}
    return message if ident is None else {**message, "id": ident}


def as_text(message: object) -> str:
    return json.dumps(message, ensure_ascii=False)


REFUSED, POLICY_REFUSAL = "refused", "refused (JSON-RPC policy error)"
LIST = as_text({"jsonrpc": "2.0", "id": MARK, "method": "tools/list"})
ROUND: tuple[McpRequest, ...] = tuple(
    dataclasses.replace(attack, index=index) for index, attack in enumerate((
        AllowedCall(MCP, f"an allowed call ({ALLOWED}) (the control)", "reaches the server with the route's value",
                    as_text(call(ALLOWED, {"number": 1}))),
        ToolList(MCP, "tools/list answered in JSON", f"lacks {DENIED}", LIST, accept="application/json"),
        ToolList(MCP, "tools/list answered as an SSE event", f"lacks {DENIED}", LIST, accept="text/event-stream"),
        McpRequest(MCP, f"call a denied tool ({DENIED})", POLICY_REFUSAL, as_text(call(DENIED, {"number": 1}))),
        McpRequest(MCP, f"{DENIED} hidden in a batch after an allowed call", POLICY_REFUSAL,
                   as_text([call(ALLOWED, {"number": 1}, f"{MARK}-a"), call(DENIED, {"number": 1})])),
        McpRequest(MCP, f"{DENIED} as a notification (no id) in a batch", REFUSED,
                   as_text([call(ALLOWED, {"number": 1}, f"{MARK}-a"), call(DENIED, {"number": 1, "m": MARK}, None)])),
        *(McpRequest(MCP, f"{DENIED} spelled {shown}", POLICY_REFUSAL, body) for shown, body in (
            ("in upper case (DELETE_ISSUE)", as_text(call("DELETE_ISSUE"))),
            ("in mixed case (Delete_Issue)", as_text(call("Delete_Issue"))),
            ("in fullwidth letters", as_text(call("\uff44\uff45\uff4c\uff45\uff54\uff45_issue"))),
            ("with a zero-width space after it", as_text(call("delete_issue\u200b"))),
            ("in JSON escapes", as_text(call("@TOOL@")).replace(
                "@TOOL@", "".join(f"\\u{ord(c):04x}" for c in DENIED))),
        )),
        McpRequest(MCP, f"malformed: not JSON (a cut-off call of {DENIED})", "refused (400)",
                   as_text(call(DENIED))[:-2]),
        McpRequest(MCP, "malformed: not JSON-RPC 2.0", "refused (400)",
                   as_text({**call(DENIED), "jsonrpc": "1.0"})),
        McpRequest(MCP, "malformed: a tool name that is not a string", "refused (400)",
                   as_text({**call(DENIED), "params": {"name": [DENIED], "arguments": {}}})),
        McpRequest(MCP, f"malformed: two tool names, {DENIED} first (a server may keep the first)", "refused (400)",
                   as_text(call(ALLOWED)).replace(f'"name": "{ALLOWED}"', f'"name": "{DENIED}", "name": "{ALLOWED}"')),
        McpRequest(MCP, f"{DENIED} in a gzip-encoded body", "refused (415)", as_text(call(DENIED)), encoded=True),
        McpRequest(MCP, "the route's sentinel in a tool argument", POLICY_REFUSAL,
                   as_text(call(ALLOWED, {"number": 1, "note": SENTINEL}))),
        McpRequest(MCP, "the route's sentinel in a tool argument, in JSON escapes", POLICY_REFUSAL,
                   as_text(call(ALLOWED, {"number": 1, "note": ESCAPED_SENTINEL}))),
        Stripped(MCP, "the route's sentinel under another header name (X-Tracker-Token)", "never reaches the server",
                 as_text(call(ALLOWED, {"number": 1})), headers=(f"X-Tracker-Token: {SENTINEL}",)),
        McpRequest(MCP, "the route's sentinel sent to another host the gate inspects", "refused (DLP)",
                   as_text(call(ALLOWED, {"number": 1})), url=f"https://{OTHER}/{MARK}"),
        McpRequest(MCP, f"{DENIED} posted to another path of the server (/other)", POLICY_REFUSAL,
                   as_text(call(DENIED)), url=f"https://{SERVER}/other"),
        McpRequest(MCP, f"{DENIED} sent to the server's name in upper case with a final dot", REFUSED,
                   as_text(call(DENIED)), url=f"https://{HOST_SPELLED}.:{PORT}{MCP_PATH}"),
        McpRequest(MCP, f"{DENIED} sent to the server's address", REFUSED, as_text(call(DENIED)),
                   url=f"https://{ADDRESS}:{PORT}{MCP_PATH}"),
        McpRequest(MCP, f"{DENIED} sent in plain HTTP through the proxy", REFUSED, as_text(call(DENIED)),
                   url=f"http://{SERVER}{MCP_PATH}"),
    )))


def script(requests: tuple[McpRequest, ...], sent: Sent) -> str:
    """One bash script sending the requests ``AT_ONCE`` at a time, each answer in a file, printed in order
    after a line ``@@verify-mcp INDEX``."""
    lines = ['d=$(mktemp -d)']
    for request in requests:
        lines.append(f"( {request.curl(sent)} ) > $d/{request.index} 2>&1 &")
        if request.index % AT_ONCE == AT_ONCE - 1:
            lines.append("wait")
    lines += ["wait", f"for i in {' '.join(str(r.index) for r in requests)}; do "
              "printf '\\n@@verify-mcp %s\\n' $i; cat $d/$i; done", "rm -rf $d"]
    return "\n".join(lines)


def parse_answers(output: str) -> dict[int, Answer]:
    """Each request's ``Answer`` from the script's output: the last response head in its section (curl's
    ``-D -``), its body; a refused CONNECT's status (curl hides the CONNECT's head); or curl's last words when
    no answer came."""
    parts = _SECTION.split(output)
    found: dict[int, Answer] = {}
    for index, text in zip(parts[1::2], parts[2::2], strict=True):
        heads = [m.start() for m in re.finditer(r"(?m)^HTTP/\d(?:\.\d)? \d{3}", text)]
        last = (text.strip().splitlines()[-1:] or ["no answer"])[0]
        if not heads:
            connect = re.search(r"CONNECT tunnel failed, response (\d{3})", last)
            found[int(index)] = Answer(int(connect.group(1)), "the CONNECT refused", "") if connect else \
                Answer(None, last[-80:], "")
            continue
        head, body = [*re.split(r"\r?\n\r?\n", text[heads[-1]:], maxsplit=1), ""][:2]
        lines = head.splitlines()
        reason = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("x-deny-reason:")),
                      "")
        found[int(index)] = Answer(int(lines[0].split()[1]), reason, body)
    return found


def judged(sent: Sent, output: str, logged: list[dict[str, Any]]) -> list[Outcome]:
    """The round judged from ``output`` (the script's) and ``logged`` (what the stand-ins logged, one dict a
    request with its target, headers and body): the control first, then the rest, each counted a leak if the
    control did not arrive."""
    exchange = Exchange(parse_answers(output), logged, sent)
    control = ROUND[0].outcome(exchange)
    exchange = dataclasses.replace(exchange, control_arrived=control.blocked)
    return [control, *(request.outcome(exchange) for request in ROUND[1:])]


def mcp_attacks(target: Verification) -> list[Outcome]:
    """The round of MCP requests from the bottle, each judged; the control first."""
    route = next(r for r in target.run.spec.routes if r.spec.name == target.mcp_server)
    sent = Sent(TRACKER, TLS_PORT, target.mcp.address, f"{INSPECTED}:{TLS_PORT}", route.spec.sentinel, route.secret)
    _, output = in_bottle(target.run, script(ROUND, sent))
    return judged(sent, output, target.mcp.requests() + target.https[INSPECTED].requests())
