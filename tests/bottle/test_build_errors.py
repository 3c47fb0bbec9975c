"""A failed image build ends with one error: which image, which step, what it said and what to do. Built on a
real engine from the local base image, with no network: the failures are made on purpose."""

from __future__ import annotations

import docker
import pytest

from claude_bottle.errors import DockerError
from claude_bottle.runtime import images
from claude_bottle.runtime.docker_engine import DockerEngine

pytestmark = pytest.mark.docker


def failing(script: str) -> images.ImageSpec:
    dockerfile = f"FROM {images.BASE_IMAGE}\nLABEL claude-bottle.test=1\nRUN {script}\n"
    return images.ImageSpec("probe", {"Dockerfile": dockerfile.encode()}, {})


def test_a_certificate_failure_ends_with_the_step_and_the_ca_settings(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    # what npm prints behind a TLS-inspecting proxy whose CA the image does not trust
    spec = failing("echo 'npm error code SELF_SIGNED_CERT_IN_CHAIN' && "
                   "echo 'npm error self-signed certificate in certificate chain' >&2 && exit 1")
    lines: list[str] = []
    with pytest.raises(DockerError) as raised:
        images.build(DockerEngine(client), spec, lines.append)
    text = str(raised.value)
    assert text.startswith("building the probe image failed at step 3/3 (RUN echo 'npm error code")
    assert "self-signed certificate in certificate chain" in text
    assert "CLAUDE_BOTTLE_EXTRA_CA_CERTS" in text and "update-ca-certificates" in text
    assert any("step 3/3" in line for line in lines)
    assert not DockerEngine(client).image_exists(spec.tag)


def test_any_other_failing_step_says_so_without_the_ca_hint(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    with pytest.raises(DockerError) as raised:
        images.build(DockerEngine(client), failing("echo 'no such file: Makefile' && exit 2"), lambda line: None)
    text = str(raised.value)
    assert "failed at step 3/3" in text and "no such file: Makefile" in text
    assert "CLAUDE_BOTTLE_EXTRA_CA_CERTS" not in text and "the output above shows why" in text
