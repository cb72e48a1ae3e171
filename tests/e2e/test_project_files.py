"""What lies in the working directory does not steer fleet, unless the operator wrote it: a YAML
file called `status` planted by another user made `fleet status` run its step as root on every
node, and a planted fleet.yaml chose what cleanup kills. Real `fleet` runs against the sandbox's
sshd nodes, from a directory holding files another user (uid 4242, no passwd entry) owns."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll

pytestmark = pytest.mark.root
OTHER = 4242
MARKER = "/root/pwned-by-a-planted-playbook"
PLANTED_STATUS = f"""\
name: status
steps:
  - name: planted
    run: touch {MARKER}
    sudo: true
"""


def _fleet(box: Any, cwd: Path, log_dir: Path, *args: str) -> FleetResult:
    """`python -m fleet ARGS` run from `cwd`, as an operator in that directory would."""
    proc = subprocess.run(
        [*FLEET, *args],
        cwd=cwd,
        env=fleet_env(box, log_dir),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=180,
        check=False,
    )
    return FleetResult(proc.returncode, proc.stdout, proc.stderr)


def _planted(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chown(path, OTHER, OTHER)
    return path


def _marked(box: Any) -> list[str]:
    return [n.name for n in box.nodes() if box.run_on(n, f"test -e {MARKER}").returncode == 0]


def test_a_planted_status_file_does_not_replace_the_status_verb(
    sandbox: Any, trusted_tmp: Path, tmp_path: Path
) -> None:
    _planted(trusted_tmp / "status", PLANTED_STATUS)
    try:
        result = _fleet(sandbox, trusted_tmp, tmp_path, "status", "--json")
        assert set(result.run_states()) == {n.name for n in sandbox.nodes()}, result.stderr
        assert _marked(sandbox) == []
        # The same file, named as a path by the operator, is theirs to run.
        named = _fleet(sandbox, trusted_tmp, tmp_path, "run", "./status", "--json")
        assert named.code == 0, named.stdout + named.stderr
        assert _marked(sandbox) == [n.name for n in sandbox.nodes()]
    finally:
        for node in sandbox.nodes():
            sandbox.run_on(node, f"rm -f {MARKER}")


SLEEPER = "sleep 4242017"


def _sleeping(box: Any, node: Any) -> bool:
    return box.run_on(node, f"pgrep -fx '{SLEEPER}' >/dev/null").returncode == 0


def test_a_planted_fleet_yaml_does_not_choose_what_cleanup_kills(
    sandbox: Any, trusted_tmp: Path, tmp_path: Path
) -> None:
    (node, *_) = sandbox.nodes()
    sandbox.run_on(node, f"setsid {SLEEPER} </dev/null >/dev/null 2>&1 &")
    assert poll(lambda: _sleeping(sandbox, node))
    project = _planted(trusted_tmp / "fleet.yaml", f"patterns: ['{SLEEPER}']\n")
    try:
        args = ("cleanup", "--yes", "--grace", "1", "--json", "-l", node.name)
        result = _fleet(sandbox, trusted_tmp, tmp_path, *args)
        assert result.code == 0, result.stdout + result.stderr
        assert (
            f"fleet: warning: ignoring {project}: owned by uid 4242, not you or root\n"
            in result.stderr
        )
        assert _sleeping(sandbox, node), "a planted fleet.yaml chose what cleanup killed"

        # The operator's own fleet.yaml, the same text, is read.
        os.chown(project, 0, 0)
        result = _fleet(sandbox, trusted_tmp, tmp_path, *args)
        assert result.code == 0, result.stdout + result.stderr
        assert "warning" not in result.stderr
        assert poll(lambda: not _sleeping(sandbox, node))
    finally:
        sandbox.run_on(node, f"pkill -KILL -fx '{SLEEPER}'; true")
