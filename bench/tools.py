"""The tools compared (fleet, its variants, pdsh, parallel-ssh, Ansible) and their command lines."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BENCH, PORT
from bench.measure import NodeCpu
from fleet.sandbox import Sandbox

# What operators run through pdsh/ansible today (the README's seed), adapted to root without sudo:
# the bracket trick keeps `pkill -f` from matching its own shell, whose argv holds the pattern.
HAND_CLEANUP = (
    "pkill -9 -f '[t]orchrun'; pkill -9 -f '[t]rain.py'; "
    "rm -rf /tmp/.torch_distributed_* /dev/shm/torch_* /tmp/cuda_* ~/.nv/; "
    f"fuser -k {PORT}/tcp; exit 0"
)
TOOL_ORDER = ("fleet", "fleet-default", "fleet-live", "fleet-oneliner", "pdsh", "pssh", "ansible")
# Variants, and Ansible (10x slower: its median only decides the 10x target), get fewer runs.
MAX_RUNS = {"fleet-default": 2, "fleet-live": 3, "ansible": 3}
NO_BUDGET = {"fleet"}  # the subject always gets its full runs, however long they take
TOOL_NOTES = {
    "fleet": "fleet -f F --plain (F = min(N, 64))",
    "fleet-default": "fleet with its default --forks 32 (only where it differs from -f F)",
    "fleet-live": "fleet -f F with the rich live table on a pty (`script`), exec only",
    "fleet-oneliner": "`fleet exec -f F --plain` running the peers' own cleanup one-liner, cleanup "
    "only: the same node work as the peers, so the engines compare like for like",
    "pdsh": "pdsh -R ssh -f F (OpenSSH client per host, strict host keys)",
    "pssh": "parallel-ssh ParallelSSHClient, pool_size F (libssh2; verifies NO host keys)",
    "ansible": "ansible ad-hoc -f F, pipelining on, ControlMaster off, host key checking on",
}


@dataclass
class Ctx:
    """What every tool's command line needs for one fleet size."""

    box: Sandbox
    node_cpu: NodeCpu
    n: int
    forks: int
    names_file: Path
    addrs_file: Path
    log_dir: Path
    fleet_cmd: list[str]
    env: dict[str, str]  # base environment for every tool
    py_env: dict[str, str]  # for tools on this interpreter (fleet, pssh): warm bytecode cache

    @property
    def inventory(self) -> str:
        return str(self.box.inventory_path)

    @property
    def ssh_config(self) -> str:
        return str(self.box.ssh_config_path)

    @property
    def key(self) -> str:
        return str(self.box.key_path)


@dataclass
class Tool:
    name: str
    available: Callable[[], str | None]  # None if usable, else why not
    command: Callable[[Ctx, str], tuple[list[str], dict[str, str]] | None]  # None: not measured


def _fleet_common(ctx: Ctx) -> list[str]:
    return ["-i", ctx.inventory, "-F", ctx.ssh_config, "--log-dir", str(ctx.log_dir)]


def _fleet_args(ctx: Ctx, workload: str) -> list[str]:
    if workload == "exec":
        return ["exec", "true", *_fleet_common(ctx)]
    return ["cleanup", "--yes", "--grace", "1", *_fleet_common(ctx)]


def fleet_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    argv = [*ctx.fleet_cmd, *_fleet_args(ctx, workload), "--plain", "-f", str(ctx.forks)]
    return argv, ctx.py_env


def fleet_default_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if min(ctx.n, 32) == min(ctx.n, ctx.forks):
        return None  # identical to `fleet -f F` at this size
    return [*ctx.fleet_cmd, *_fleet_args(ctx, workload), "--plain"], ctx.py_env


def fleet_oneliner_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if workload != "cleanup":
        return None
    argv = [
        *ctx.fleet_cmd,
        "exec",
        HAND_CLEANUP,
        *_fleet_common(ctx),
        "--plain",
        "-f",
        str(ctx.forks),
    ]
    return argv, ctx.py_env


def fleet_live_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]] | None:
    if workload != "exec":
        return None
    inner = shlex.join([*ctx.fleet_cmd, *_fleet_args(ctx, workload), "-f", str(ctx.forks)])
    env = {**ctx.py_env, "COLUMNS": "160", "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    return ["script", "-qfec", inner, "/dev/null"], env


def pdsh_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    env = {**ctx.env, "PDSH_SSH_ARGS": f"-F {ctx.ssh_config} -a -x -l%u %h"}
    command = "true" if workload == "exec" else HAND_CLEANUP
    argv = ["pdsh", "-R", "ssh", "-S", "-f", str(ctx.forks), "-w", f"^{ctx.names_file}", command]
    return argv, env


def ansible_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    env = {
        **ctx.env,
        "ANSIBLE_SSH_ARGS": f"-F {ctx.ssh_config} -o ControlMaster=no",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(ctx.log_dir / "ansible-tmp"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
    }
    module = (
        ["-m", "command", "-a", "true"]
        if workload == "exec"
        else ["-m", "shell", "-a", HAND_CLEANUP]
    )
    argv = ["ansible", "all", "-i", ctx.inventory, "-f", str(ctx.forks), "-o", *module]
    return argv, env


def pssh_cmd(ctx: Ctx, workload: str) -> tuple[list[str], dict[str, str]]:
    command = "true" if workload == "exec" else HAND_CLEANUP
    argv = [
        sys.executable,
        str(BENCH / "peers" / "pssh_run.py"),
        "--hosts-file",
        str(ctx.addrs_file),
    ]
    argv += ["--key", ctx.key, "--pool", str(ctx.forks), command]
    return argv, ctx.py_env


def _need_exe(*names: str) -> Callable[[], str | None]:
    def check() -> str | None:
        missing = [n for n in names if shutil.which(n) is None]
        return f"not installed: {', '.join(missing)}" if missing else None

    return check


def _need_module(module: str) -> Callable[[], str | None]:
    def check() -> str | None:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
        )
        return None if probe.returncode == 0 else f"cannot import {module}"

    return check


TOOLS = {
    "fleet": Tool("fleet", lambda: None, fleet_cmd),
    "fleet-default": Tool("fleet-default", lambda: None, fleet_default_cmd),
    "fleet-live": Tool("fleet-live", _need_exe("script"), fleet_live_cmd),
    "fleet-oneliner": Tool("fleet-oneliner", lambda: None, fleet_oneliner_cmd),
    "pdsh": Tool("pdsh", _need_exe("pdsh", "ssh"), pdsh_cmd),
    "pssh": Tool("pssh", _need_module("pssh.clients"), pssh_cmd),
    "ansible": Tool("ansible", _need_exe("ansible"), ansible_cmd),
}
