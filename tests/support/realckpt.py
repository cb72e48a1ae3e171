"""Real checkpoints on the sandbox nodes: a DeepSpeed ZeRO-3 job (2 nodes x 2 ranks, node-local
output dirs) and PEFT LoRA adapters, made once and cached, then laid out afresh for each test.

The job (ds_ckpt_job.py) runs directly on the nodes under torchrun from the venv scripts/setup
builds (/opt/fleet-test/ckpt), detached, as fleet launch would start it; a second, smaller run
(1 node x 2 ranks) of the same tag gives the "old bigger run" case its real newer files. What they
saved is copied to a cache keyed by the pin file and the job script, so a later session (or CI on
the same machine) skips the ~30-90 s of training and of DeepSpeed's first JIT build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

JOB = Path(__file__).with_name("ds_ckpt_job.py")
PIN = Path(__file__).parent.parent / "ckpt-requirements.txt"
VENV = Path(os.environ.get("FLEET_TEST_CKPT_VENV", "/opt/fleet-test/ckpt"))
CACHE = Path(os.environ.get("FLEET_TEST_CKPT_CACHE", "/var/cache/fleet-test/ckpt-artifacts"))
# DeepSpeed's JIT-built comm op, kept where every node (and the next session) finds it
EXTENSIONS = Path("/var/cache/fleet-test/ckpt-torch-extensions")
TAG = "global_step2"
DIR = "/tmp/ckpt"  # on every node: where the tests lay the job's output
EXTRA = "/tmp/ckpt-extra"  # on every node: the adapters that are not part of a good run
PORT = 29731
JOB_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Artifacts:
    """The cached output: `root/NODE/out`, `root/NODE/extra` for the 4-rank run on the first
    two nodes, `root/small/out` for the 2-rank run of the same tag."""

    root: Path
    nodes: tuple[str, str]

    def out(self, node: str) -> Path:
        return self.root / node / "out"

    def extra(self, node: str) -> Path:
        return self.root / node / "extra"

    @property
    def small(self) -> Path:
        return self.root / "small" / "out"


def cache_key() -> str:
    digest = hashlib.sha256(PIN.read_bytes() + JOB.read_bytes()).hexdigest()
    return digest[:16]


@pytest.fixture(scope="session")
def ckpt_venv(cluster_host: None) -> Path:
    """The venv scripts/setup built (a failure, not a skip, as root)."""
    pinned = re.search(r"^deepspeed==(\S+)", PIN.read_text(), re.M)
    assert pinned, PIN
    if not (VENV / "requirements.txt").exists() or not (VENV / "bin" / "torchrun").exists():
        pytest.fail(f"no DeepSpeed venv at {VENV}: run ./scripts/setup (it builds that venv)")
    assert (VENV / "requirements.txt").read_bytes() == PIN.read_bytes(), "rerun ./scripts/setup"
    return VENV


@pytest.fixture(scope="session")
def ckpt_artifacts(sandbox: Any, ckpt_venv: Path) -> Artifacts:
    """The real checkpoint and adapters, from the cache or made now (once per cache key)."""
    first, second = sandbox.nodes()[:2]
    root = CACHE / cache_key()
    made = Artifacts(root, (first.name, second.name))
    if (root / "complete").exists():
        return made
    EXTENSIONS.mkdir(parents=True, exist_ok=True)
    try:
        _train(sandbox, [first, second], "/tmp/ds-big")
        for node in (first, second):
            _keep(sandbox, node, "/tmp/ds-big", root / node.name)
        _train(sandbox, [first], "/tmp/ds-small")
        _keep(sandbox, first, "/tmp/ds-small", root / "small")
    finally:
        for node in (first, second):
            # What torchrun and torch leave in the node's /tmp, a job that failed too: a later
            # cleanup test would find it beside the ghosts it planted (only when the cache is
            # cold: a fresh machine, as CI's).
            sandbox.run_on(node, "rm -rf /tmp/torchelastic_* /tmp/torchinductor_*")
    (root / "complete").write_text("")
    return made


def _train(sandbox: Any, nodes: list[Any], work: str) -> None:
    """The job on every given node at once, 2 ranks each; waits (bounded) for every rank."""
    master = nodes[0].address
    for rank, node in enumerate(nodes):
        env = {
            "DS_ACCELERATOR": "cpu",
            "GLOO_SOCKET_IFNAME": "eth0",
            "TORCH_EXTENSIONS_DIR": str(EXTENSIONS),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [
            str(VENV / "bin" / "torchrun"),
            f"--nnodes={len(nodes)}",
            "--nproc-per-node=2",
            f"--node-rank={rank}",
            f"--master-addr={master}",
            f"--master-port={PORT}",
            f"{work}/{JOB.name}",
            "--out",
            f"{work}/out",
            "--extra",
            f"{work}/extra",
        ]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        cmd = " ".join(shlex.quote(a) for a in argv)
        # The job is copied to the node: the checkout may sit where nodes have their own
        # (/tmp, /root are private to each node).
        script = (
            f"rm -rf {work}; mkdir -p {work}; cd {work}; "
            f"printf %s {shlex.quote(JOB.read_text())} >{JOB.name}; "
            f"{exports} setsid {cmd} </dev/null >{work}/log 2>&1 & echo $! >{work}/pid"
        )
        sandbox.run_on(node, script)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    pending = list(nodes)
    while pending and time.monotonic() < deadline:
        for node in list(pending):
            state = sandbox.run_on(
                node, f"kill -0 $(cat {work}/pid) 2>/dev/null && echo running; cat {work}/log"
            ).stdout
            if not state.startswith("running"):
                pending.remove(node)
                assert state.count(" done") == 2, f"{node.name}: the job failed:\n{state[-4000:]}"
        time.sleep(0.5)
    for node in pending:
        log = sandbox.run_on(node, f"kill -KILL -$(cat {work}/pid); tail -c 4000 {work}/log")
        pytest.fail(f"{node.name}: the job did not end in {JOB_TIMEOUT_S:g}s:\n{log.stdout}")


def _keep(sandbox: Any, node: Any, work: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    q = shlex.quote(str(dest))
    done = sandbox.run_on(node, f"rm -rf {q}; mkdir -p {q}; cp -a {work}/out {work}/extra {q}/")
    assert done.returncode == 0, done.stderr


@pytest.fixture
def ckpt_nodes(sandbox: Any, ckpt_artifacts: Artifacts) -> Iterator[Artifacts]:
    """Each of the two nodes gets its own saved output at DIR (and EXTRA); removed afterwards."""
    for node in ckpt_artifacts.nodes:
        out = shlex.quote(str(ckpt_artifacts.out(node)))
        extra = shlex.quote(str(ckpt_artifacts.extra(node)))
        done = sandbox.run_on(
            node, f"rm -rf {DIR} {EXTRA}; cp -a {out} {DIR}; cp -a {extra} {EXTRA}"
        )
        assert done.returncode == 0, done.stderr
    try:
        yield ckpt_artifacts
    finally:
        for node in ckpt_artifacts.nodes:
            sandbox.run_on(node, f"rm -rf {DIR} {EXTRA} /tmp/ckpt-out")
