"""Run the real `fleet` CLI (a subprocess, as an operator would) against a sandbox fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

FLEET = (sys.executable, "-m", "fleet")  # the CLI as an operator's shell would start it


@dataclass(frozen=True)
class FleetResult:
    """Exit code and streams of one `fleet` invocation."""

    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as JSON (fails the test if one is not)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def run_states(self) -> dict[str, dict[str, Any]]:
        """`fleet status --json`: host -> its RunState object (state, run, detail, ...)."""
        return {x["host"]: x for x in self.json_lines() if x.get("event") == "RunState"}

    def final(self) -> dict[str, Any]:
        """The RunFinished summary line of a --json run."""
        lines = [x for x in self.json_lines() if x.get("event") == "RunFinished"]
        assert len(lines) == 1, self.stdout
        return lines[0]


def fleet_env(
    box: Any,
    log_dir: Path,
    *,
    inventory: Path | None = None,
    ssh_config: Path | None = None,
    **extra: str,
) -> dict[str, str]:
    """The environment of every fleet the cluster tests start: the sandbox's inventory and ssh
    config (or the given ones), a run-record dir of the test's own, a wide terminal, no --debug."""
    env = dict(os.environ)
    env.update(
        FLEET_INVENTORY=str(inventory or box.inventory_path),
        FLEET_SSH_CONFIG=str(ssh_config or box.ssh_config_path),
        FLEET_LOG_DIR=str(log_dir),
        COLUMNS="160",
    )
    env.pop("FLEET_DEBUG", None)
    env.pop("FLEET_CONFIG", None)  # the operator's own config files must not steer the tests
    env["XDG_CONFIG_HOME"] = str(log_dir.parent / "no-user-config")
    # No keepers left behind; tests/e2e/test_warm.py passes its own. FLEET_TEST_PERSIST=S runs
    # the cluster tests through warm connections (each keeper exits S seconds after its last use).
    env["FLEET_PERSIST"] = os.environ.get("FLEET_TEST_PERSIST", "0")
    env.update(extra)
    return env


def fleet_code(env: dict[str, str]) -> dict[str, str]:
    """`env` with this fleet's package first on PYTHONPATH: `python -m fleet` started in another
    directory imports the code under test, not another copy."""
    import fleet

    root = str(Path(fleet.__file__).resolve().parents[1])
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{root}{os.pathsep}{rest}" if rest else root}


def run_fleet(
    box: Any,
    *args: str,
    log_dir: Path,
    inventory: Path | None = None,
    ssh_config: Path | None = None,
    timeout_s: float = 180,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> FleetResult:
    """`python -m fleet ARGS` with the sandbox's inventory and ssh config, stdin not a terminal;
    `cwd`: run in that directory (this fleet's code still imported: fleet_code)."""
    env = fleet_env(box, log_dir, inventory=inventory, ssh_config=ssh_config, **(extra_env or {}))
    if cwd is not None:
        env = fleet_code(env)
    proc = subprocess.run(
        [*FLEET, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
    )
    return FleetResult(proc.returncode, proc.stdout, proc.stderr)


def poll(check: Callable[[], T], timeout_s: float = 15, step_s: float = 0.1) -> T:
    """Call `check` until it returns something truthy or the deadline passes; return its last
    value (tests poll to deadlines instead of sleeping a guessed time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step_s)
    return check()


def keeper_pids(run_dir: Path) -> list[int]:
    """The warm-connection keepers whose socket is under `run_dir` (their command line names it:
    a spawned keeper's argv, `python -m fleet.ssh.keeper SOCKET`, or a forked one's title,
    `fleet-keeper SOCKET`)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        keeper = b"fleet.ssh.keeper" in argv or argv[0].startswith(b"fleet-keeper ")
        if keeper and any(str(run_dir).encode() in a for a in argv):
            pids.append(int(entry))
    return pids
