"""Images built through the engine seam, on the fake engine: what is built and when, the base image pulled or
made, and a failed build ending with the one error that names the step."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from claude_bottle import launch
from claude_bottle.agent.mounts import Mount
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import build_images
from claude_bottle.runtime import images
from claude_bottle.runtime.images import BASE_IMAGE, ImageSpec
from claude_bottle.runtime.names import image_repository
from tests.fake_engine import FakeEngine
from tests.helpers import make_token

STEPS = ["Step 1/3 : FROM debian:bookworm-slim", " ---> 1a2b", "Step 2/3 : ARG BUILD_ID",
         "Step 3/3 : RUN make", "make: *** No rule to make target 'all'.  Stop."]


def spec(dockerfile: bytes = b"FROM debian:bookworm-slim\nRUN make\n") -> ImageSpec:
    return ImageSpec("probe", {"Dockerfile": dockerfile, "files/a.txt": b"a"}, {"VERSION": "1"})


def test_an_image_is_built_once_from_its_context_after_the_base_image_is_pulled() -> None:
    engine, shown = FakeEngine(), []
    engine.build_output = STEPS[:4]
    tag = images.build(engine, spec(), shown.append)
    assert tag == spec().tag and engine.image_exists(tag)
    assert engine.contexts[tag] == {"Dockerfile": b"FROM debian:bookworm-slim\nRUN make\n", "files/a.txt": b"a"}
    assert [e for e in engine.events if e[0] in ("pull", "build")] == [("pull", BASE_IMAGE), ("build", tag)]
    assert shown[:2] == [f"pulling {BASE_IMAGE}", f"building the probe image {tag}"]
    assert "  probe step 3/3 (RUN make)" in shown and shown[-1].startswith("built the probe image in ")
    assert images.build(engine, spec(), shown.append) == tag
    assert [e for e in engine.events if e[0] == "build"] == [("build", tag)], "built again though it exists"


def test_only_a_dockerfile_with_a_throwaway_stage_has_it_removed_and_only_its_own() -> None:
    engine = FakeEngine()
    engine.tags.add(BASE_IMAGE)
    images.build(engine, spec(b"FROM debian:bookworm-slim AS stage\nARG BUILD_ID\n"), lambda line: None)
    pruned = [label for event, label in engine.events if event == "prune"]
    assert len(pruned) == 1 and pruned[0].startswith("claude-bottle.stage=")
    images.build(engine, spec(), lambda line: None)
    assert len([e for e in engine.events if e[0] == "prune"]) == 2  # pruning by a label no image has is a no-op
    engine.fail.add("prune_images")
    images.build(engine, spec(b"FROM x\nRUN true\n"), lambda line: None)  # a failing prune does not fail a build


def test_a_failed_build_names_its_step_and_shows_its_last_output() -> None:
    engine = FakeEngine()
    engine.tags.add(BASE_IMAGE)
    engine.build_output, engine.fail = STEPS, {"build_image"}
    with pytest.raises(DockerError) as raised:
        images.build(engine, spec(), lambda line: None)
    text = str(raised.value)
    assert text.startswith("building the probe image failed at step 3/3 (RUN make): The command")
    assert "    make: *** No rule to make target 'all'.  Stop." in text
    assert "the output above shows why" in text
    assert not engine.image_exists(spec().tag)


def test_a_base_image_that_cannot_be_pulled_is_made_with_debootstrap_or_the_error_says_how(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, shown = FakeEngine(), []
    engine.fail.add("pull_image")
    monkeypatch.setattr(images.shutil, "which", lambda name: None)
    with pytest.raises(DockerError, match="cannot be pulled and building it locally needs debootstrap"):
        images.build(engine, spec(), shown.append)
    assert shown[-1] == (f"cannot pull {BASE_IMAGE} (pull_image failed (fake)); building it locally with "
                         "debootstrap")
    assert not [e for e in engine.events if e[0] == "build"]


def test_both_images_of_an_agent_are_built_on_the_engine_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_BOTTLE_HOST_CA_CERTS", "0")
    monkeypatch.delenv("CLAUDE_BOTTLE_EXTRA_CA_CERTS", raising=False)
    engine = FakeEngine()
    bottle, gate = build_images(engine, AgentConfig(), lambda line: None)
    assert bottle.startswith(f"{image_repository('bottle')}:") and gate.startswith(f"{image_repository('gate')}:")
    assert engine.image_exists(bottle) and engine.image_exists(gate)
    assert [tag for event, tag in engine.events if event == "build"] == [bottle, gate]


def test_the_proxy_reaches_the_build_as_arguments_outside_the_tag_and_its_password_is_masked() -> None:
    proxy = UpstreamProxy.parse("http://me:s%40cret@proxy.corp:3128", "test", "localhost,.corp")
    engine = FakeEngine()
    engine.tags.add(BASE_IMAGE)
    tag = images.build(engine, spec(), lambda line: None, proxy.environment())
    assert tag == spec().tag, "the proxy is part of the image's tag"
    assert engine.buildargs[tag] == {"VERSION": "1", **proxy.environment()}
    assert engine.buildargs[tag]["https_proxy"] == "http://me:s%40cret@proxy.corp:3128"
    engine.build_output = [*STEPS[:4], "E: Failed to fetch via http://me:s%40cret@proxy.corp:3128 (s@cret)"]
    engine.fail = {"build_image"}
    shown: list[str] = []
    with pytest.raises(DockerError) as raised:
        images.build(engine, spec(b"FROM x\nRUN apt-get update\n"), shown.append, proxy.environment())
    assert "http://me:***@proxy.corp:3128 (***)" in str(raised.value)
    assert "through the upstream proxy http://me:***@proxy.corp:3128: check" in str(raised.value)
    engine.build_output = [*STEPS[:4], "E: Failed to fetch http://deb.debian.org/  407  Proxy Authentication Required"]
    with pytest.raises(DockerError, match=r"proxy http://me:\*\*\*@proxy.corp:3128 refused the build's credentials"):
        images.build(engine, spec(b"FROM x\nRUN apt-get update\n"), shown.append, proxy.environment())
    assert "cret" not in str(raised.value) + "".join(shown)


def test_both_images_are_built_through_the_proxy_given() -> None:
    proxy = UpstreamProxy.parse("http://proxy.corp:3128", "test")
    engine = FakeEngine()
    built = build_images(engine, AgentConfig(), lambda line: None, proxy)
    assert all(engine.buildargs[tag]["HTTPS_PROXY"] == "http://proxy.corp:3128" for tag in built)


@pytest.mark.parametrize("name", ["bottle.Dockerfile", "gate.Dockerfile"])
def test_no_dockerfile_declares_a_proxy_argument(name: str) -> None:
    """A declared ARG would put the proxy's URL, password and all, in the image's history."""
    text = resources.files("claude_bottle.runtime").joinpath(f"dockerfiles/{name}").read_text()
    declared = {line.split()[1].split("=")[0].lower() for line in text.splitlines() if line.startswith("ARG ")}
    assert not declared & {"http_proxy", "https_proxy", "no_proxy", "ftp_proxy", "all_proxy"}


def test_a_runs_automatic_build_goes_through_the_runs_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``start`` and ``run`` build what is missing before the gate exists: through the run's proxy, or apt and
    npm in the build have no way out on a network that allows only the proxy."""
    proxy = UpstreamProxy.parse("http://me:pw@proxy.corp:3128", "test")
    asked: list[UpstreamProxy | None] = []

    def recording(engine: object, agent: object, progress: object, given: UpstreamProxy | None = None) -> None:
        asked.append(given)
        raise DockerError("stop after the build")

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(launch, "open_engine", FakeEngine)
    monkeypatch.setattr(launch, "build_images", recording)
    (tmp_path / "project").mkdir(mode=0o777)
    (tmp_path / "project").chmod(0o777)  # the bottle's user may write it whoever runs the test
    agent = parse_agent("dev", {"version": 1}, "dev.toml")
    run = launch.Launch(agent, tmp_path / "project", Credential.parse(make_token(), "t"), upstream_proxy=proxy)
    with pytest.raises(DockerError, match="stop after the build"), launch.started(run, lambda line: None):
        pass
    assert asked == [proxy]


@pytest.mark.parametrize("how", ["agent", "variable", "mount"])
def test_a_ca_certificate_where_the_bottle_writes_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """The bottle writes the workspace and its writable mounts: a CA certificate there would be its choice of whom
    the next run's gate, images and host trust (a CA of its own added to the file). Named by the agent, or by a
    relative path in $CLAUDE_BOTTLE_EXTRA_CA_CERTS resolved in the workspace (the drop-in's current directory)."""
    built: list[AgentConfig] = []

    def recording(engine: object, agent: AgentConfig, *rest: object) -> None:
        built.append(agent)
        raise DockerError("the images were built")

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(launch, "open_engine", FakeEngine)
    monkeypatch.setattr(launch, "build_images", recording)
    project, shared = tmp_path / "project", tmp_path / "shared"
    project.mkdir()
    project.chmod(0o777)  # the bottle's user may write it whoever runs the test
    folder = shared if how == "mount" else project / "certs"
    folder.mkdir()
    (folder / "corp.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    agent = AgentConfig(extra_ca_certificates=(folder / "corp.crt",))
    if how == "variable":
        agent = AgentConfig()
        monkeypatch.chdir(project)
        monkeypatch.setenv(launch.EXTRA_CA_VARIABLE, "certs/corp.crt")
    elif how == "mount":
        agent = AgentConfig(extra_ca_certificates=(folder / "corp.crt",),
                            mounts=(Mount(shared, "/shared", False, "dev.toml: mounts[0].source"),))
    run = launch.Launch(agent, project, Credential.parse(make_token(), "t"))
    with pytest.raises(ConfigError, match="which a bottle can write") as caught, \
            launch.started(run, lambda line: None):
        pass
    assert "corp.crt" in str(caught.value) and built == []
