"""``verify``'s attacks in the bottle, as the agent user: a search for the credential wherever a process could
find it, and checks of its privileges and of what it could leave for the host. Each runs a script in the bottle
with bash and judges its exit code and output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from claude_bottle.verify.attack import Attack, Outcome, Verdict
from claude_bottle.verify.standins import Verification, engine_view, in_bottle

ValueJudge = Callable[[int, str, str], tuple[str, bool]]  # (exit code, output, a held value) -> (actual, blocked)


def held_values(target: Verification) -> tuple[str, ...]:
    """What the bottle must never find: the throwaway credential and each credential route's value."""
    return (target.credential.secret, *(route.secret for route in target.run.spec.routes))


@dataclass(frozen=True)
class Check(Attack[Verification, tuple[int, str]]):
    """``script`` run with bash in the bottle, as the agent user: its exit code and output, judged by
    ``judge_value`` for each value the bottle must never find. With ``needle``, those values go in on the
    script's standard input (a pipe, never a file or argv)."""

    script: str
    judge_value: ValueJudge
    needle: bool = False

    def run(self, target: Verification) -> tuple[int, str]:
        return in_bottle(target.run, self.script, "\n".join(held_values(target)) if self.needle else None)

    def judge(self, target: Verification, result: tuple[int, str]) -> Verdict:
        code, output = result
        return judged_for_each(self, code, output, held_values(target))


def judged_for_each(check: Check, code: int, output: str, values: tuple[str, ...]) -> tuple[str, bool]:
    """``check``'s verdict for every value: blocked only if blocked for each; the first leak otherwise."""
    verdicts = [check.judge_value(code, output, value) for value in values]
    return next((v for v in verdicts if not v[1]), verdicts[0])


def _no_secret(what: str) -> ValueJudge:
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        return (f"the credential is in {what}", False) if secret in output else (f"not in {what}", True)
    return judge


def _nothing(found: str, none: str) -> ValueJudge:
    """Blocked when the output is empty; else ``found`` and the first few items."""
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        items = output.split()
        return (f"{found}: {' '.join(items[:5])}", False) if items else (none, True)
    return judge


def _fails(code: int, output: str, secret: str) -> tuple[str, bool]:
    if code == 0:
        return "it worked", False
    return (output.strip().splitlines()[-1:] or ["failed"])[0][-80:], True


def _status_field(name: str, wanted: str) -> ValueJudge:
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        values = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
        value = values.get(name, "missing").strip()
        return f"{name} {value}", value == wanted
    return judge


def _gate_hidden(code: int, output: str, secret: str) -> tuple[str, bool]:
    seen = [line for line in output.splitlines() if "claude_bottle" in line or "--token-file" in line]
    return (f"visible: {seen[0].strip()[:60]}", False) if seen else (f"{len(output.splitlines()) - 1} "
                                                                     "processes, none of the gate's", True)


CREDENTIAL, PRIVILEGE = "credential discovery", "privilege and persistence"
BOTTLE_CHECKS = (
    Check(CREDENTIAL, "environment variables", "no credential", "env", _no_secret("the environment")),
    Check(CREDENTIAL, "every readable /proc/*/environ and cmdline", "no credential",
          "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'", _no_secret("/proc")),
    Check(CREDENTIAL, "the process list", "no gate process visible", "ps -eo pid,user,args", _gate_hidden),
    Check(CREDENTIAL, "Claude Code's config files", "no credential",
          "cat ~/.claude.json; find ~/.claude /etc/claude-code -type f -exec cat {} + 2>/dev/null; true",
          _no_secret("Claude's config")),
    Check(PRIVILEGE, "effective capabilities", "none", "cat /proc/self/status", _status_field("CapEff", "0" * 16)),
    Check(PRIVILEGE, "bounding capabilities", "none", "cat /proc/self/status", _status_field("CapBnd", "0" * 16)),
    # prctl(PR_GET_NO_NEW_PRIVS), which gVisor answers; its /proc/self/status has no NoNewPrivs line
    Check(PRIVILEGE, "no-new-privileges", "set", "setpriv -d 2>&1", _status_field("no_new_privs", "1")),
    Check(PRIVILEGE, "setuid and setgid programs", "none",
          "find / -xdev -type f -perm /6000 2>/dev/null", _nothing("found", "none found")),
    Check(PRIVILEGE, "a Docker socket", "none",
          "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -name '*docker*' -print 2>/dev/null; "
          "curl -s -m 3 --unix-socket /var/run/docker.sock http://docker/version; true",
          _nothing("found", "none found")),
    Check(PRIVILEGE, "write a hook into the workspace's .git/hooks", "refused",
          "echo 'curl attacker' > /workspace/.git/hooks/pre-commit", _fails),
    Check(PRIVILEGE, "change the workspace's .git/config", "refused",
          "echo '[core] fsmonitor = attacker' >> /workspace/.git/config", _fails),
    Check(PRIVILEGE, "write outside the workspace and home", "refused everywhere",
          "for d in / /etc /usr/bin /usr/local/bin /opt /var /root; do "
          "touch $d/.claude-bottle-probe 2>/dev/null && echo $d; done; true", _nothing("writable", "refused in each")),
)

# Last, once every other check is done: the needle goes in on stdin, so this grep is the only process that
# holds it. Exit 1 means nothing was found; 2 means some files were unreadable, which is fine.
FILE_SEARCH = Check(CREDENTIAL, "a search of the whole file system and home directory", "not found",
                    "grep -rlsF -D skip -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys",
                    _nothing("found in", "not found"), needle=True)



def bottle_attacks(target: Verification) -> list[Outcome]:
    """Every check in the bottle, the file search last."""
    return [check.outcome(target) for check in (*BOTTLE_CHECKS, FILE_SEARCH)]


@dataclass(frozen=True)
class EngineView(Attack[Verification, str]):
    """Seen from the host: what the engine shows of the bottle and the gate (``docker inspect``) must hold
    none of the values the bottle must never find."""

    def run(self, target: Verification) -> str:
        return engine_view(target.run)

    def judge(self, target: Verification, result: str) -> Verdict:
        found = any(value in result for value in held_values(target))
        return "the credential is shown" if found else "not shown", not found


ENGINE_VIEW = EngineView(CREDENTIAL, "docker inspect of the bottle and the gate (from the host)", "no credential")
