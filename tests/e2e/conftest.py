"""Fixtures for tests that drive a real fleet of sshd nodes in Linux namespaces (needs root).

The session sandbox uses its own subnet, apart from the demo's default (10.251.0.0/16), so the
tests can run while an operator's `fleet sandbox up` is running. When that subnet is taken (by
another session, or by the bridge of a session that was killed), the next candidate is used and
a warning names what holds it: nothing that is not this session's is taken down.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from docker_engine import DockerEngine, engine_session
from freesubnet import on_a_free_subnet
from realckpt import ckpt_artifacts, ckpt_nodes, ckpt_venv  # noqa: F401 (real checkpoints)
from realtorch import runs, torch_venv  # noqa: F401 (fixtures: real PyTorch on the nodes)

from fleet.sandbox import Sandbox, SandboxError, preflight

# FLEET_TEST_SUBNET names the one subnet to use; unset, the first free of the candidates is.
# (/16s apart from the demo's 10.251, test_sandbox's 10.252, the bench's 10.249 and 10.250, and
# the throwaway /24s the tests take in 10.230-10.253.)
SESSION_SUBNETS = (
    [os.environ["FLEET_TEST_SUBNET"]]
    if os.environ.get("FLEET_TEST_SUBNET")
    else ["10.253.0.0/16", "10.254.0.0/16", "10.229.0.0/16", "10.228.0.0/16", "10.227.0.0/16"]
)
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
    """A 4-node sandbox shared by the session on the first free subnet; always torn down, even
    after a failure."""
    made: list[Sandbox] = []

    def up(subnet: str) -> Sandbox:
        sb = Sandbox(tmp_path_factory.mktemp("sandbox"), subnet=subnet)
        made.append(sb)
        sb.up(SESSION_NODES)
        return sb

    try:
        sb, refused = on_a_free_subnet(SESSION_SUBNETS, up)
        for message in refused:
            warnings.warn(f"{message}; this session's sandbox is on {sb.subnet}", stacklevel=1)
        yield sb
    finally:
        for each in made:
            each.down()


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
def docker_engine(sandbox: Sandbox) -> Iterator[DockerEngine]:
    """A private, real dockerd with the test image (docker_engine.py); torn down at the end."""
    yield from engine_session(sandbox.subnet)
