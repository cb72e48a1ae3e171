"""Real PyTorch on the sandbox nodes: the venv scripts/setup builds, the training script, and the
bookkeeping that lets every test end exactly the processes its runs started.

The venv lives under /opt, built from the distribution's python3: sandbox nodes have a private
/root and /tmp, so a venv (or an interpreter, or a checkout) there is invisible to them. Node names
do not resolve in the sandbox, so every job gets GLOO_SOCKET_IFNAME=eth0.
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

TRAINER = Path(__file__).with_name("ddp_train.py")
PIN = Path(__file__).parent.parent / "torch-requirements.txt"
VENV = Path(os.environ.get("FLEET_TEST_TORCH_VENV", "/opt/fleet-test/torch"))
TORCHRUN = VENV / "bin" / "torchrun"
TRAIN_PY = "/usr/local/bin/train.py"  # each node's bin dir is its /usr/local/bin
CKPT = "/tmp/ckpt"
STATE = "/var/lib/fleet/launch"
# torch leaves these on a node after every run, even a clean one (what cleanup must remove)
TORCH_LEFTOVERS = ("/tmp/torchelastic_*", "/tmp/pymp-*", "/tmp/torchinductor_*")
# min_free_gb: /tmp on a sandbox node is a small tmpfs; the floor is lowered, not skipped
LAUNCH = (
    "launch",
    "--dir",
    "/tmp",
    "--var",
    "min_free_gb=0.01",
    "--nproc-per-node",
    "2",
    "--env",
    "GLOO_SOCKET_IFNAME=eth0",
)
# Processes of one run, by its marker, as pids on the node.
MARKED = r"""marked() { grep -lzxF "FLEET_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null |
  sed 's|/proc/\([0-9]*\)/environ|\1|'; }
"""


@pytest.fixture(scope="session")
def torch_venv(cluster_host: None) -> Path:
    """The venv scripts/setup built, holding the pinned torch (a failure, not a skip, as root)."""
    pinned = re.search(r"^torch==(\S+)", PIN.read_text(), re.M)
    assert pinned, PIN
    found = list(VENV.glob("lib/python3*/site-packages/torch-*.dist-info"))
    if not TORCHRUN.exists() or not found:
        pytest.fail(f"no torch in {VENV}: run ./scripts/setup (it builds that venv)")
    assert any(d.name.startswith(f"torch-{pinned.group(1)}") for d in found), found
    return VENV


class Runs:
    """The runs a test launched: each one's processes are killed by pid when the test ends."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.ids: list[str] = []

    def launch(
        self,
        run: str,
        log_dir: Path,
        *extra: str,
        args: tuple[str, ...] = (),
        launcher: str = str(TORCHRUN),
    ) -> FleetResult:
        """`fleet launch` of train.py with the venv's torchrun, 2 processes per node."""
        self.ids.append(run)
        return run_fleet(
            self.sandbox,
            *LAUNCH,
            "--launcher",
            launcher,
            "--run-id",
            run,
            *extra,
            "--",
            TRAIN_PY,
            "--ckpt",
            CKPT,
            *args,
            log_dir=log_dir,
            timeout_s=240,
        )

    def pids(self, node: Any, run: str) -> list[int]:
        """Live processes of `run` on the node (by its marker)."""
        out = self.sandbox.run_on(node, MARKED + f"marked {shlex.quote(run)}").stdout
        return [int(p) for p in out.split()]

    def end(self) -> None:
        for node in self.sandbox.nodes():
            for run in self.ids:
                kill = f"kill -KILL $(marked {shlex.quote(run)}) 2>/dev/null"
                self.sandbox.run_on(node, MARKED + kill)
            self.sandbox.run_on(
                node, f"rm -rf {CKPT} {STATE} /tmp/*.json " + " ".join(TORCH_LEFTOVERS)
            )


@pytest.fixture
def runs(sandbox: Any, torch_venv: Path) -> Iterator[Runs]:
    """train.py on every node, a fresh checkpoint dir and no launch state; afterwards every
    process of the runs the test launched is killed and their files removed."""
    for node in sandbox.nodes():
        target = node.bin_dir / "train.py"
        target.write_text(TRAINER.read_text())
        target.chmod(0o755)
        sandbox.run_on(node, f"rm -rf {CKPT} {STATE}; mkdir -p {CKPT}")
    made = Runs(sandbox)
    try:
        yield made
    finally:
        made.end()
        for node in sandbox.nodes():
            (node.bin_dir / "train.py").unlink(missing_ok=True)


def logs(sandbox: Any, log_dir: Path, run: str, *args: str) -> str:
    """Every line of the run's log on every (selected) node (`host | line`)."""
    result = run_fleet(sandbox, "logs", "--run-id", run, "-n", "100000", *args, log_dir=log_dir)
    assert result.code == 0, result.stdout + result.stderr
    return result.stdout


def all_ranks_reduced(text: str, world: int = 8) -> bool:
    """Every rank printed a correct all-reduce of the ranks (proof that all of them joined)."""
    total = world * (world - 1) // 2
    return all(f"rank {r} allreduce ok world={world} sum={total}" in text for r in range(world))


def steps_reached(text: str, step: int, world: int = 8) -> bool:
    return all(re.search(rf"rank {r} step {step} loss ", text) for r in range(world))


def status(sandbox: Any, log_dir: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """`fleet status --json`: exit code and host -> RunState."""
    result = run_fleet(sandbox, "status", "--json", *args, log_dir=log_dir)
    return result.code, result.run_states()


class RunIds:
    """Run ids a test used (`PREFIX-<8 hex>`); kill_all() kills each one's processes on every
    node, found by fleet's own run marking (MARKED)."""

    def __init__(self, sandbox: Any, prefix: str) -> None:
        self.sandbox = sandbox
        self.prefix = prefix
        self.used: list[str] = []

    def new(self) -> str:
        self.used.append(f"{self.prefix}-{uuid.uuid4().hex[:8]}")
        return self.used[-1]

    def pids(self, node: Any, run: str) -> list[int]:
        out = self.sandbox.run_on(node, MARKED + f"marked {shlex.quote(run)}").stdout
        return [int(p) for p in out.split()]

    def anywhere(self, run: str) -> dict[str, list[int]]:
        """node -> live pids of `run`, for the nodes where it has any."""
        found = {n.name: self.pids(n, run) for n in self.sandbox.nodes()}
        return {name: pids for name, pids in found.items() if pids}

    def kill_all(self, node: Any) -> None:
        """SIGKILL every process of every run used, on `node`."""
        for run in self.used:
            self.sandbox.run_on(
                node, MARKED + f"kill -KILL $(marked {shlex.quote(run)}) 2>/dev/null"
            )
