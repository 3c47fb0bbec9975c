"""Image builds clean up after themselves without breaking a build running beside them.

The classic builder keeps the bottle's throwaway Claude Code stage as an untagged image. A build removes it
afterwards, but two builds on one engine (two agents started at once, parallel CI jobs) share that stage's
layers: a build that removed every such stage took away the one the other was about to copy from
("invalid from flag value claude-code: No such image"). Each build now labels its stage with its own id and
removes only that one.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

import docker
import pytest

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.launch import build_inputs
from claude_bottle.runtime import images
from claude_bottle.runtime.docker_engine import DockerEngine

pytestmark = pytest.mark.docker


def stage_image(client: docker.DockerClient, build_id: str) -> str:
    """Build only the throwaway stage, as build ``build_id`` leaves it (untagged, labelled); its layers come
    from the cache the session's image build made. Returns its id."""
    spec = images.bottle_spec(build_inputs(AgentConfig()))
    with tempfile.TemporaryDirectory() as context:
        for relative, data in spec.files.items():
            Path(context, relative).parent.mkdir(parents=True, exist_ok=True)
            Path(context, relative).write_bytes(data)
        image, _ = client.images.build(path=context, target="claude-code", pull=False, rm=True, forcerm=True,
                                       buildargs={**spec.buildargs, "BUILD_ID": build_id})
    assert image.labels.get("claude-bottle.stage") == build_id
    return str(image.id)


def exists(client: docker.DockerClient, image_id: str) -> bool:
    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False


def test_a_build_removes_its_own_stage_and_not_one_another_build_is_using(
        client: docker.DockerClient, built_images: tuple[str, str]) -> None:
    mine, theirs = secrets.token_hex(8), secrets.token_hex(8)
    own, other = stage_image(client, mine), stage_image(client, theirs)
    try:
        assert exists(client, own) and exists(client, other)
        images.remove_build_stage(DockerEngine(client), mine)
        assert not exists(client, own), "a build leaves its throwaway stage behind"
        assert exists(client, other), "a build removed the stage of another build running beside it"
        assert exists(client, built_images[0]), "removing a stage took the bottle image's layers"
    finally:
        images.remove_build_stage(DockerEngine(client), theirs)
    assert not exists(client, other)
