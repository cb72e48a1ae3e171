"""`fleet cleanup` against what real PyTorch leaves on a node (the venv scripts/setup builds).

Each test runs tests/support/torch_job.py with the venv's torchrun on one sandbox node (2 ranks,
gloo on loopback, a DataLoader with one persistent worker), so every leftover is torch's own:
/tmp/torchelastic_* (torchrun's run dir), /tmp/pymp-* (the DataLoader worker's multiprocessing
dir), /tmp/torchinductor_<user> (created when DDP imports torch._dynamo), and after a crash with
the file_system sharing strategy and a spawn DataLoader context also /dev/shm/torch_*,
/tmp/torch-shm-dir-* (torch_shm_manager) and /dev/shm/sem.mp-* (multiprocessing semaphores).
Every process a test starts carries a marker in its environment and is killed by pid afterwards.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, poll, run_fleet
from realtorch import TORCHRUN, VENV

pytestmark = pytest.mark.root

JOB = Path(__file__).parents[1] / "support" / "torch_job.py"
JOB_DIR = "/root/torch-job"  # the job's log, exit code and ready flags: node-private, no glob's
MARK = "FLEET_TEST_TORCH_JOB"
PYTHON_LAUNCHER = (str(VENV / "bin" / "python3"), "-m", "torch.distributed.run")
# Everything these tests may leave in /tmp and /dev/shm, removed after each of them.
TORCH_LEFTOVERS = (
    "/tmp/torchelastic_*",
    "/tmp/pymp-*",
    "/tmp/torchinductor_*",
    "/tmp/torch-shm-dir-*",
    "/dev/shm/torch_*",
    "/dev/shm/sem.mp-*",
)
MARKED = f"""marked() {{ grep -lzxF "{MARK}=$1" /proc/[0-9]*/environ 2>/dev/null |
  sed 's|/proc/\\([0-9]*\\)/environ|\\1|'; }}
"""


def _sh(sandbox: Any, node: Any, script: str) -> str:
    result = sandbox.run_on(node, script)
    assert result.returncode == 0, f"{node.name}: {script}\n{result.stdout}{result.stderr}"
    return str(result.stdout)


class Jobs:
    """The jobs and planted processes a test started, by marker: all killed when it ends."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.marks: set[str] = set()

    def start(self, node: Any, *args: str, launcher: tuple[str, ...] = (str(TORCHRUN),)) -> str:
        """Start torch_job.py under `launcher` on the node, detached; return the run's marker.
        The job writes its output to JOB_DIR/log and its exit code to JOB_DIR/rc."""
        run = uuid.uuid4().hex[:12]
        self.marks.add(run)
        argv = [*launcher, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        argv += ["--master-port", "29500", "/usr/local/bin/torch_job.py", *args]
        wrapper = f'"$@" > {JOB_DIR}/log 2>&1; echo $? > {JOB_DIR}/rc'
        _sh(
            self.sandbox,
            node,
            f"mkdir -p {JOB_DIR} && cd {JOB_DIR}\n"
            f"{MARK}={run} GLOO_SOCKET_IFNAME=lo setsid sh -c {shlex.quote(wrapper)} job "
            f"{shlex.join(argv)} </dev/null >/dev/null 2>&1 &",
        )
        return run

    def plant(self, node: Any, command: str) -> None:
        """Start shell `command` detached on the node, marked."""
        run = uuid.uuid4().hex[:12]
        self.marks.add(run)
        detach = "</dev/null >/dev/null 2>&1 &"
        _sh(self.sandbox, node, f"{MARK}={run} setsid sh -c {shlex.quote(command)} {detach}")

    def end(self, nodes: list[Any]) -> None:
        for node in nodes:
            for run in self.marks:
                self.sandbox.run_on(node, MARKED + f"kill -KILL $(marked {run}) 2>/dev/null")


@pytest.fixture
def jobs(sandbox: Any, torch_venv: Path) -> Iterator[Jobs]:
    """torch_job.py on every node and no torch leftovers there; afterwards every process the
    test started is killed (by its marker) and the leftovers, planted dirs and job files are
    removed."""
    nodes = sandbox.nodes()
    clear = f"rm -rf {JOB_DIR} {' '.join(TORCH_LEFTOVERS)}"
    for node in nodes:
        target = node.bin_dir / "torch_job.py"
        target.write_text(JOB.read_text())
        target.chmod(0o755)
        _sh(sandbox, node, clear)
    made = Jobs(sandbox)
    try:
        yield made
    finally:
        made.end(nodes)
        for node in nodes:
            _sh(sandbox, node, clear)
            (node.bin_dir / "torch_job.py").unlink(missing_ok=True)


def _marked(sandbox: Any, node: Any, run: str) -> list[int]:
    return [int(p) for p in _sh(sandbox, node, MARKED + f"marked {run}").split()]


def _entries(sandbox: Any, node: Any) -> set[str]:
    """What is in the node's /tmp and /dev/shm (top level)."""
    return set(_sh(sandbox, node, "find /tmp /dev/shm -mindepth 1 -maxdepth 1").split())


def _job_log(sandbox: Any, node: Any) -> str:
    return _sh(sandbox, node, f"cat {JOB_DIR}/log 2>/dev/null; true")


def _job_rc(sandbox: Any, node: Any) -> str:
    return _sh(sandbox, node, f"cat {JOB_DIR}/rc 2>/dev/null; true").strip()


def _ready(sandbox: Any, node: Any) -> bool:
    """Both ranks of the job have trained a step."""
    return "rank0 rank1" in _sh(sandbox, node, f"ls {JOB_DIR}/ready 2>/dev/null | xargs; true")


def _steps(sandbox: Any, node: Any) -> int:
    return len(re.findall(r"^rank \d step \d+$", _job_log(sandbox, node), re.M))


# Whether some process has its cwd at $1 and some has an fd open on $2.
HOLDING = """
cwd=0 fd=0
for p in /proc/[0-9]*; do
    [ "$(readlink "$p/cwd")" = "$1" ] && cwd=1
    for f in "$p"/fd/*; do [ "$(readlink "$f")" = "$2" ] && fd=1; done
done
echo "$cwd$fd"
"""


def _lines(result: FleetResult, host: str) -> list[str]:
    return [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e.get("host") == host
    ]


def _kinds(paths: set[str]) -> set[str]:
    """Which of torch's leftover globs the paths match."""
    return {glob for glob in TORCH_LEFTOVERS for p in paths if fnmatch.fnmatch(p, glob)}


def test_cleanup_removes_what_real_torch_runs_leave(
    sandbox: Any, jobs: Jobs, tmp_path: Path
) -> None:
    """A clean run and a crashed one (every process SIGKILLed mid-run, as when a node's job is
    killed wholesale); `fleet cleanup` removes all they left and the node ends clean."""
    finished, crashed = sandbox.nodes()[1:3]
    before = {node.name: _entries(sandbox, node) for node in (finished, crashed)}
    jobs.start(finished, "--steps", "3")
    run = jobs.start(
        crashed, "--steps", "100000", "--step-s", "0.05", "--ready", f"{JOB_DIR}/ready",
        "--rank1-sharing", "file_system", "--rank1-context", "spawn",
    )  # fmt: skip
    assert poll(lambda: _ready(sandbox, crashed), 120), _job_log(sandbox, crashed)
    _sh(sandbox, crashed, MARKED + f"kill -KILL $(marked {run})")
    assert poll(lambda: not _marked(sandbox, crashed, run), 15)
    assert poll(lambda: _job_rc(sandbox, finished), 120) == "0", _job_log(sandbox, finished)
    log = _job_log(sandbox, finished)
    assert "rank 0 done" in log, log
    assert "rank 1 done" in log, log

    left = {node.name: _entries(sandbox, node) - before[node.name] for node in (finished, crashed)}
    # even a clean run leaves torchrun's run dir, the DataLoader workers' dirs, inductor's cache
    clean_run = {"/tmp/torchelastic_*", "/tmp/pymp-*", "/tmp/torchinductor_*"}
    assert _kinds(left[finished.name]) == clean_run, left[finished.name]
    crash_only = {"/tmp/torch-shm-dir-*", "/dev/shm/torch_*", "/dev/shm/sem.mp-*"}
    assert _kinds(left[crashed.name]) >= clean_run | crash_only, left[crashed.name]

    result = run_fleet(
        sandbox, "cleanup", "--yes", "--limit", f"{finished.name},{crashed.name}",
        "--grace", "1", "--json", log_dir=tmp_path,
    )  # fmt: skip

    assert result.code == 0, result.stdout + result.stderr
    hosts = result.final()["hosts"]
    for node in (finished, crashed):
        assert hosts[node.name]["outcome"] == "ok"
        lines = _lines(result, node.name)
        removed = sum(1 for line in lines if line.startswith("removed: "))
        # The result line says what was done, nothing left or failed: `removed 9 paths`, after
        # `killed N processes (...)` where the crash left some behind.
        assert re.fullmatch(
            rf"(killed \d+ process(es)? \([A-Z0-9 ,]+\), )?removed {removed} paths?",
            hosts[node.name]["last_line"],
        ), hosts[node.name]["last_line"]
        for path in left[node.name]:
            assert f"removed: {path}" in lines, (path, lines)
        assert not _entries(sandbox, node) & left[node.name]


def test_cleanup_keeps_what_a_live_torch_job_holds(
    sandbox: Any, jobs: Jobs, tmp_path: Path
) -> None:
    """A live job that matches no cleanup pattern (started as `python -m torch.distributed.run`)
    holds its DataLoader workers' /tmp/pymp-* only through the listener sockets in them and its
    /tmp/torchelastic_* only through its workers' environment: cleanup keeps both, says so, and
    the job trains on and ends well (with its pymp dirs gone, its next batch fails). So are kept
    a run dir with a log open inside it (torchrun --redirects) and a dir a shell has its cwd in;
    a dead run's dirs beside them are removed."""
    node = sandbox.nodes()[3]
    stop = f"{JOB_DIR}/stop"
    jobs.start(
        node, "--until", stop, "--step-s", "0.05", "--ready", f"{JOB_DIR}/ready",
        "--steps", "100000", launcher=PYTHON_LAUNCHER,
    )  # fmt: skip
    assert poll(lambda: _ready(sandbox, node), 120), _job_log(sandbox, node)
    live = {
        p for p in _entries(sandbox, node) if _kinds({p}) & {"/tmp/pymp-*", "/tmp/torchelastic_*"}
    }
    assert len([p for p in live if p.startswith("/tmp/pymp-")]) == 2, live
    assert len([p for p in live if p.startswith("/tmp/torchelastic_")]) == 1, live

    redirected = "/tmp/torchelastic_redirected"
    log = f"{redirected}/none_r/attempt_0/0/stdout.log"
    _sh(sandbox, node, f"mkdir -p {redirected}/none_r/attempt_0/0 /tmp/pymp-cwd")
    jobs.plant(node, f"exec sleep 600 3>{log}")
    jobs.plant(node, "cd /tmp/pymp-cwd && exec sleep 601")
    holding = f"set -- /tmp/pymp-cwd {log}\n{HOLDING}"
    assert poll(lambda: _sh(sandbox, node, holding).strip() == "11", 15)
    dead = ("/tmp/torchelastic_dead", "/tmp/pymp-dead")
    _sh(sandbox, node, f"mkdir -p {dead[0]}/none_d/attempt_0/0 {dead[1]} && touch {dead[1]}/x")
    steps_before = _steps(sandbox, node)

    result = run_fleet(
        sandbox, "cleanup", "--yes", "--limit", node.name, "--grace", "1", "--json",
        log_dir=tmp_path,
    )  # fmt: skip

    lines = _lines(result, node.name)
    kept = live | {redirected, "/tmp/pymp-cwd"}
    for path in kept:
        held = [x for x in lines if x.startswith("kept (in use by ") and x.endswith(f"): {path}")]
        assert held, (path, lines)
    for path in dead:
        assert f"removed: {path}" in lines, lines
    assert result.code == 3, result.stdout + result.stderr
    host = result.final()["hosts"][node.name]
    removed = sum(1 for line in lines if line.startswith("removed: "))
    assert removed >= len(dead), lines
    assert host["last_line"] == f"removed {removed} paths; left: {len(kept)} paths", host
    assert not any(line.startswith("killed ") for line in lines), "cleanup killed the live job"
    assert kept <= _entries(sandbox, node)
    # the job goes on reading batches from its workers, then ends well
    assert poll(lambda: _steps(sandbox, node) > steps_before + 8, 60), _job_log(sandbox, node)
    _sh(sandbox, node, f"touch {stop}")
    assert poll(lambda: _job_rc(sandbox, node), 60) == "0", _job_log(sandbox, node)
