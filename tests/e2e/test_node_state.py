"""Fleet's state on a node is fleet's alone (issue 17), against real sshd nodes.

Another user of a node (uid 4242, no passwd entry) can neither read a launch's secrets from any
command line nor steer a cleanup through a path in a shared directory; a launch's rollback finds
its run where its own state dir says; and two nodes that share a home directory (NFS homes) each
keep a run and a janitor of their own. The job is `sh -c 'exec sleep 600'` (launch.sh's
bookkeeping matters here, not training); every process a test starts is killed by pid.
"""

from __future__ import annotations

import shlex
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, poll, run_fleet
from realtorch import RunIds

pytestmark = pytest.mark.root

JOB = "sh -c 'exec sleep 600'"
SECRET = "hf_s3cr3tTok3n-4242-xyz"
OTHER = "setpriv --reuid=4242 --regid=4242 --clear-groups"
CUSTOM_STATE = "/tmp/custom-state"
OLD_LOCK = "/tmp/.fleet-cleanup-kill.lock"
# Where a root login keeps node state after issue 17, and where it kept it before.
STATE_DIRS = "/var/lib/fleet/launch /var/lib/fleet/janitor /root/.local/state/fleet"


@pytest.fixture
def runs(sandbox: Any) -> Iterator[RunIds]:
    """Run ids a test used; their processes are killed on every node at the end."""
    made = RunIds(sandbox, "ns")
    try:
        yield made
    finally:
        for node in sandbox.nodes():
            made.kill_all(node)
            sandbox.run_on(node, f"rm -rf {CUSTOM_STATE} {STATE_DIRS} {OLD_LOCK}; true")


def _launch(sandbox: Any, log_dir: Path, run: str, port: int, *extra: str) -> FleetResult:
    return run_fleet(
        sandbox,
        "launch",
        "--dir",
        "/tmp",
        "--var",
        "min_free_gb=0.01",
        "--launcher",
        JOB,
        "--run-id",
        run,
        "--master-port",
        str(port),
        *extra,
        "--",
        "job",
        log_dir=log_dir,
    )


def _as_other(sandbox: Any, node: Any, script: str) -> str:
    result = sandbox.run_on(node, f"{OTHER} sh -c {shlex.quote(script)}")
    return result.stdout + result.stderr


def test_env_secret_reaches_the_job_and_no_command_line(
    sandbox: Any, runs: RunIds, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[:2]
    run = runs.new()
    limit = ["-l", ",".join(n.name for n in nodes)]
    dry = _launch(
        sandbox, tmp_path / "dry", run, 39611, *limit, "--env", f"HF_TOKEN={SECRET}", "--dry-run"
    )
    assert dry.code == 0, dry.stdout + dry.stderr
    assert SECRET not in dry.stdout + dry.stderr
    assert "HF_TOKEN=<redacted>" in dry.stdout + dry.stderr

    result = _launch(sandbox, tmp_path, run, 39611, *limit, "--env", f"HF_TOKEN={SECRET}")

    assert result.code == 0, result.stdout + result.stderr
    assert SECRET not in result.stdout + result.stderr
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert SECRET not in path.read_text(errors="replace"), path
    for node in nodes:
        pids = poll(lambda node=node: runs.pids(node, run))
        assert pids, f"{node.name}: run {run} is not running"
        environs = sandbox.run_on(
            node, " ".join(f"tr '\\0' '\\n' </proc/{p}/environ;" for p in pids) + " true"
        ).stdout
        assert f"HF_TOKEN={SECRET}" in environs.splitlines(), f"{node.name}: job lacks the token"
        seen = _as_other(
            sandbox,
            node,
            "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <\"$f\"; echo; done 2>/dev/null;"
            " ps -eo args",
        )
        assert "sleep 600" in seen, f"{node.name}: uid 4242 could not list the job: {seen}"
        assert SECRET not in seen, f"{node.name}: the token is on a command line"
        state = sandbox.run_on(node, f"grep -rl {shlex.quote(SECRET)} /var/lib/fleet; true").stdout
        for path in state.split():
            mode = sandbox.run_on(node, f"stat -c '%a %u' {shlex.quote(path)}").stdout.split()
            assert mode == ["600", "0"], f"{node.name}: {path} holds the token with mode {mode}"


def test_cleanup_lock_is_never_redirected_or_held_by_another_user(
    sandbox: Any, tmp_path: Path
) -> None:
    linked, held = sandbox.nodes()[:2]
    try:
        for node in (linked, held):
            sandbox.run_on(
                node, "setsid bash -c 'exec -a torchrun sleep 3600' </dev/null >/dev/null 2>&1 &"
            )
        # a symlink from the old lock path to a root file, and the same at the new place if
        # uid 4242 can get there at all
        _as_other(
            sandbox,
            linked,
            f"ln -s /root/victim {OLD_LOCK}; ln -s /root/victim /var/lib/fleet/cleanup.lock",
        )
        # a lock file of uid 4242's, held
        sandbox.run_on(
            held, f"{OTHER} setsid flock {OLD_LOCK} sleep 600 </dev/null >/dev/null 2>&1 &"
        )
        poll(lambda: "4242" in sandbox.run_on(held, f"stat -c %u {OLD_LOCK}; true").stdout)
        started = time.monotonic()
        result = run_fleet(
            sandbox,
            "cleanup",
            "--yes",
            "--grace",
            "1",
            "-l",
            f"{linked.name},{held.name}",
            "--json",
            log_dir=tmp_path,
        )
        took_s = time.monotonic() - started

        assert result.code == 0, result.stdout + result.stderr
        victim = sandbox.run_on(linked, "ls -l /root/victim 2>&1; true").stdout
        assert "No such file" in victim, f"root's write was redirected: {victim}"
        assert took_s < 20, f"cleanup waited {took_s:.0f}s on uid 4242's lock"
        for node in (linked, held):
            left = sandbox.run_on(node, "pgrep -x torchrun; true").stdout
            assert not left.strip(), f"{node.name}: torchrun survived: {left}"
    finally:
        for node in (linked, held):
            sandbox.run_on(
                node, f"pkill -x torchrun; pkill -u 4242; rm -f {OLD_LOCK} /root/victim; true"
            )


def test_rollback_with_a_custom_state_dir_stops_the_run_where_it_started(
    sandbox: Any, runs: RunIds, tmp_path: Path
) -> None:
    good, bad = sandbox.nodes()[:2]
    run = runs.new()
    # the run id is taken on one node: its start is refused there, so the launch rolls back
    sandbox.run_on(bad, f"mkdir -p -m 700 {CUSTOM_STATE}/{run}")

    result = _launch(
        sandbox,
        tmp_path,
        run,
        39612,
        "-l",
        f"{good.name},{bad.name}",
        "--var",
        f"state_dir={CUSTOM_STATE}",
    )

    assert result.code == 3, result.stdout + result.stderr
    assert f"stopped on {good.name}" in result.stderr, result.stderr
    assert poll(lambda: not runs.pids(good, run)), f"{good.name}: run {run} still running"


def test_nodes_sharing_a_home_each_keep_their_own_run_and_janitor(
    sandbox: Any, runs: RunIds, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[:2]
    # an NFS home as the nodes see it: one directory, bound at /root on both (outside /tmp,
    # which every node mounts for itself)
    home = Path("/var/tmp") / f"fleet-shared-home-{uuid.uuid4().hex[:8]}"
    home.mkdir(mode=0o700)
    run = runs.new()
    try:
        for node in nodes:
            mounted = sandbox.run_on(
                node, f"cd / && mount --bind {home} /root && mkdir -p /tmp/ckpt"
            )
            assert mounted.returncode == 0, mounted.stderr

        result = _launch(
            sandbox,
            tmp_path,
            run,
            39613,
            "-l",
            ",".join(n.name for n in nodes),
            "--janitor",
            "--yes",  # the janitor is destructive: asked about, refused without a terminal
            "--var",
            "output_dir=/tmp/ckpt",
        )

        assert result.code == 0, result.stdout + result.stderr
        for node in nodes:
            assert poll(lambda node=node: runs.pids(node, run)), f"{node.name}: no run"
        status = run_fleet(
            sandbox,
            "janitor",
            "status",
            "--dir",
            "/tmp/ckpt",
            "-l",
            ",".join(n.name for n in nodes),
            "--json",
            log_dir=tmp_path / "status",
        )
        lines = {
            e["host"]: e["line"]
            for e in status.json_lines()
            if e["event"] == "OutputLine" and e["stream"] == "stdout"
        }
        for node in nodes:
            assert lines.get(node.name, "").startswith("janitor=running dir=/tmp/ckpt"), status
    finally:
        for node in nodes:
            sandbox.run_on(
                node,
                "for f in /proc/[0-9]*/cmdline; do case $(tr '\\0' ' ' <$f) in "
                "*'janitor-loop.sh loop'*) p=${f#/proc/}; kill -KILL ${p%/cmdline};; "
                "esac; done 2>/dev/null; rm -rf /tmp/ckpt; true",
            )
            for pid in runs.pids(node, run):
                sandbox.run_on(node, f"kill -KILL {pid}")
            sandbox.run_on(node, "cd / && umount -l /root; true")
        shutil.rmtree(home, ignore_errors=True)
