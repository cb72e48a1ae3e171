"""What fleet writes and deletes on the operator's machine, through the real CLI against real
sshd nodes: run records are private and keep environment values out, pruning removes only
fleet's own records, and a --log-dir fleet cannot write is refused before anything runs."""

from __future__ import annotations

import json
import shlex
import shutil
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, run_fleet

from fleet.records import runlog

pytestmark = pytest.mark.root

STATE = "/var/lib/fleet/launch"  # playbooks/launch.yaml's state_dir on the nodes


def _written(log_dir: Path) -> list[Path]:
    return [p for p in log_dir.rglob("*") if p.is_file()]


@pytest.mark.parametrize("log_dir", ["/etc/passwd", "/etc/passwd/runs", "/proc/self"])
def test_a_log_dir_fleet_cannot_write_fails_before_anything_runs(
    sandbox: Any, tmp_path: Path, log_dir: str
) -> None:
    mark = f"/tmp/fleet-ran-{uuid.uuid4().hex[:8]}"
    result = run_fleet(
        sandbox, "exec", f"touch {mark}", "--log-dir", log_dir, log_dir=tmp_path / "unused"
    )

    assert result.code == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"fleet: error: run record dir {log_dir}: ")
    assert "internal error" not in result.stderr
    assert lines[1].strip().startswith("hint: ")
    assert "--log-dir" in lines[1]
    for node in sandbox.nodes():
        assert sandbox.run_on(node, f"test ! -e {mark}").returncode == 0, node.name
    assert Path("/etc/passwd").is_file()


def test_records_are_private_whatever_the_umask(sandbox: Any, tmp_path: Path) -> None:
    env = fleet_env(sandbox, tmp_path / "runs")
    argv = " ".join(shlex.quote(a) for a in (*FLEET, "exec", "echo hi", "--plain"))
    proc = subprocess.run(
        ["sh", "-c", f"umask 000 && exec {argv}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr

    (record,) = (tmp_path / "runs").iterdir()
    paths = [record, *record.rglob("*")]
    for path in paths:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"
    names = {p.name for p in paths}
    assert {"summary.json", "events.jsonl", "hosts"} <= names
    assert {f"{n.name}.log" for n in sandbox.nodes()} <= names


@pytest.fixture
def env_inventory(sandbox: Any, tmp_path: Path) -> Path:
    """The sandbox's inventory with an `env` mapping for every host, one value a secret."""
    text = sandbox.inventory_path.read_text()
    assert "\n  vars:\n" in text
    path = tmp_path / "inventory.yaml"
    path.write_text(
        text.replace(
            "\n  vars:\n",
            '\n  vars:\n    env: {HF_TOKEN: "hf_inv SECRET\'1", NCCL_DEBUG: INFO}\n',
            1,
        )
    )
    return path


def test_env_values_never_reach_the_record_or_the_output(
    sandbox: Any, env_inventory: Path, tmp_path: Path
) -> None:
    """A launch whose job prints its environment and exits at once: the start step's command
    (`--env K=V`) and the job's log tail (shown by the failed start) both carry the values."""
    run_id = f"run-redact-{uuid.uuid4().hex[:6]}"
    logs = tmp_path / "runs"
    job = (
        'echo "WANDB_API_KEY=$WANDB_API_KEY"; echo "HF_TOKEN=$HF_TOKEN"; '
        'echo "NCCL_DEBUG=$NCCL_DEBUG"; exit 3'
    )
    try:
        result: FleetResult = run_fleet(
            sandbox,
            "launch",
            "--dir",
            "/tmp",
            "--var",
            "min_free_gb=0.01",
            "--force",
            "--yes",
            "--run-id",
            run_id,
            "--env",
            "WANDB_API_KEY=wandb-cli-SECRET-2",
            "--launcher",
            f"sh -c {shlex.quote(job)}",
            "--json",
            "--",
            "train.py",
            log_dir=logs,
            inventory=env_inventory,
            extra_env={"FLEET_RECORD_ENV": "NCCL_DEBUG"},
        )
    finally:
        for node in sandbox.nodes():
            sandbox.run_on(
                node,
                f"rm -rf {STATE}/{run_id}; grep -qx {run_id} {STATE}/current "
                f"2>/dev/null && rm -f {STATE}/current; true",
            )

    assert result.code == 3, result.stdout + result.stderr  # the job exited at once: not started
    everything = result.stdout + result.stderr
    texts = {str(p): p.read_text(errors="replace") for p in _written(logs)}
    for where, text in [("output", everything), *texts.items()]:
        assert "SECRET" not in text, where
    recorded = "\n".join(texts.values())
    # the start step's command and the job's own output, both redacted
    assert "--env WANDB_API_KEY=<redacted>" in recorded
    assert "--env HF_TOKEN=<redacted>" in recorded
    assert "log: WANDB_API_KEY=<redacted>" in recorded
    assert "log: HF_TOKEN=<redacted>" in recorded
    # the value the operator chose to keep (FLEET_RECORD_ENV) is shown
    assert "--env NCCL_DEBUG=INFO" in recorded
    assert "log: NCCL_DEBUG=INFO" in recorded


def test_pruning_keeps_what_fleet_did_not_write(sandbox: Any, tmp_path: Path) -> None:
    """A log dir shared with a job's checkpoints: `00000NNN-step/` dirs sort before fleet's
    records and were taken for them. Only directories fleet marked as its records are pruned."""
    logs = tmp_path / "runs"
    first = run_fleet(sandbox, "exec", "true", "--plain", log_dir=logs)
    assert first.code == 0, first.stderr
    (record,) = logs.iterdir()
    # KEEP_RUNS older records, as fleet wrote them (copies of a real one, older names)
    old = [logs / f"2025{i:04d}-000000-exec-{i:04x}" for i in range(1, runlog.KEEP_RUNS + 1)]
    for path in old:
        shutil.copytree(record, path)
    checkpoints = []
    for step in range(0, 600, 100):
        ckpt = logs / f"{step:08d}-step"
        ckpt.mkdir()
        (ckpt / "optimizer.pt").write_bytes(b"state")
        checkpoints.append(ckpt)
    foreign = logs / "20200101-000000-not-a-record"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")

    result = run_fleet(sandbox, "exec", "true", "--plain", log_dir=logs)

    assert result.code == 0, result.stderr
    for ckpt in checkpoints:
        assert (ckpt / "optimizer.pt").read_bytes() == b"state", ckpt
    assert (foreign / "notes.txt").read_text() == "mine"
    # KEEP_RUNS + 2 records: the two oldest made room
    assert [path.exists() for path in old[:3]] == [False, False, True]
    assert all(path.is_dir() for path in old[2:])
    assert record.is_dir()
    assert len(list(logs.iterdir())) == runlog.KEEP_RUNS + len(checkpoints) + 1


@pytest.mark.parametrize("mode", ["--plain", "--json"])
def test_a_reader_that_leaves_ends_fleet_quietly_and_the_record_whole(
    sandbox: Any, tmp_path: Path, mode: str
) -> None:
    """`fleet exec ... | head -2`: once the pipe's reader is gone fleet stops as for Ctrl-C (its
    remote commands stopped, no node left running them), completes its run record with
    summary.json, and exits 141 (128 + SIGPIPE) with nothing on stderr."""
    tag = f"fleet-epipe-{uuid.uuid4().hex[:8]}"
    command = f"i=0; while :; do echo {tag} $i; i=$((i+1)); done"
    proc = subprocess.Popen(
        [*FLEET, "exec", command, mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=fleet_env(sandbox, tmp_path),
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    read = [proc.stdout.readline() for _ in range(2)]  # what `head -2` reads
    assert all(read), read
    proc.stdout.close()  # the reader leaves
    stderr = proc.stderr.read()
    code = proc.wait(timeout=120)

    assert code == 141, stderr
    assert stderr == b""
    (record,) = tmp_path.iterdir()
    summary = json.loads((record / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert {r["outcome"] for r in summary["hosts"].values()} == {"cancelled"}
    events = (record / "events.jsonl").read_text().splitlines()
    assert json.loads(events[-1])["event"] == "RunFinished"
    for node in sandbox.nodes():
        left = sandbox.run_on(node, f"pgrep -f {tag} || true").stdout
        assert left == "", (node.name, left)
