"""Fixtures for tests that drive a real fleet of sshd nodes in Linux namespaces (needs root).

The session sandbox uses its own subnet, apart from the demo's default (10.251.0.0/16), so the
tests can run while an operator's `fleet sandbox up` is running.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from docker_engine import DockerEngine, engine_session
from realckpt import ckpt_artifacts, ckpt_nodes, ckpt_venv  # noqa: F401 (real checkpoints)
from realtorch import runs, torch_venv  # noqa: F401 (fixtures: real PyTorch on the nodes)

from fleet.sandbox import Sandbox, SandboxError, preflight

# Override to run two test sessions side by side (each needs its own subnet).
SESSION_SUBNET = os.environ.get("FLEET_TEST_SUBNET", "10.253.0.0/16")
SESSION_NODES = 4


@pytest.fixture(scope="session")
def cluster_host() -> None:
    """Skip without root; as root (CI) a missing tool is a failure, not a skip."""
    if os.geteuid() != 0:
        pytest.skip("cluster tests need root to create network/PID/mount namespaces")
    try:
        preflight()
    except SandboxError as exc:
        pytest.fail(f"{exc.message} ({exc.hint})")


@pytest.fixture(scope="session")
def sandbox(cluster_host: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A 4-node sandbox shared by the session; always torn down, even after a failure."""
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"), subnet=SESSION_SUBNET)
    try:
        sb.up(SESSION_NODES)
        yield sb
    finally:
        sb.down()


@pytest.fixture
def make_sandbox(
    cluster_host: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Sandbox]]:
    """Factory for extra sandboxes (own state dir and subnet), all downed after the test."""
    made: list[Sandbox] = []

    def make(subnet: str) -> Sandbox:
        sb = Sandbox(Path(tmp_path_factory.mktemp("extra-sandbox")), subnet=subnet)
        made.append(sb)
        return sb

    try:
        yield make
    finally:
        for sb in made:
            sb.down()


@pytest.fixture(scope="session")
def docker_engine(cluster_host: None) -> Iterator[DockerEngine]:
    """A private, real dockerd with the test image (docker_engine.py); torn down at the end."""
    yield from engine_session(SESSION_SUBNET)
