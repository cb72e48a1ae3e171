"""What `fleet --help` and `fleet VERB --help` load: click and fleet.cli, never the machinery a
verb body imports when it runs (paramiko, rich, yaml, the inventory, the plan, the engine).
An import-set check in a fresh interpreter, not a wall-clock bound: the time is measured in
bench/startup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from fleet.cli import cli
from fleet.cli.lazy import VERBS

# Packages a help text never needs; each costs milliseconds to tens of them at start-up.
HEAVY = (
    "paramiko",
    "rich",
    "yaml",
    "ClusterShell",
    "fleet.engine",
    "fleet.inventory",
    "fleet.ops",
    "fleet.ssh",
    "fleet.node",
    "fleet.output",
    "fleet.records",
    "fleet.transfer",
    "fleet.checkpoints",
    "fleet.sandbox.box",
    "fleet.core.playbook",
    "fleet.core.events",
)

# Runs `main` as the console script does, then prints the modules it loaded.
PROBE = """\
import json, sys
from fleet.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under the `fleet` group: ('exec',), ('janitor', 'start'), ..."""
    paths: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths.extend(_commands(command, (*prefix, name)))
    return paths


def _probe(
    tmp_path: Path, code: str, args: tuple[str, ...], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`code` run with ARGS in a fresh interpreter, with no config file or environment of the
    developer's (a config file would rightly load the YAML reader), plus `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    clean |= {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _loaded(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    """The exit code and loaded modules of `fleet ARGS` (PROBE)."""
    proc = _probe(tmp_path, PROBE, args)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return report["code"], report["modules"]


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("args", [(), ("--help",), ("--version",)], ids=repr)
def test_top_level_help_loads_no_machinery(tmp_path: Path, args: tuple[str, ...]) -> None:
    code, modules = _loaded(tmp_path, *args)
    assert code == (0 if args else 2)  # bare `fleet`: the help, as a usage error (click)
    assert "click" in modules
    assert _heavy(modules) == []


@pytest.mark.parametrize("command", _commands(cli), ids=" ".join)
def test_every_verbs_help_loads_no_machinery(tmp_path: Path, command: tuple[str, ...]) -> None:
    code, modules = _loaded(tmp_path, *command, "--help")
    assert code == 0
    assert _heavy(modules) == []


def _families(modules: list[str]) -> set[str]:
    """The modules of verbs (fleet/cli/lazy.py's VERBS) among `modules`."""
    return {w.partition(":")[0] for w in VERBS.values()} & set(modules)


@pytest.mark.parametrize(
    ("args", "family"),
    [
        (("exec", "--help"), "fleet.cli.run"),
        (("cleanup", "--help"), "fleet.cli.cleanup"),
        (("janitor", "start", "--help"), "fleet.cli.janitor"),
        (("launch", "--help"), "fleet.cli.launch"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else v,
)
def test_a_verb_loads_its_own_family_of_verbs_only(
    tmp_path: Path, args: tuple[str, ...], family: str
) -> None:
    """Each family declares dozens of options: a command builds those of the verb it runs."""
    code, modules = _loaded(tmp_path, *args)
    assert code == 0
    assert _families(modules) == {family}


def test_the_top_level_help_loads_every_verb(tmp_path: Path) -> None:
    """The check above can fail: `fleet --help` lists every verb, so it loads them all."""
    code, modules = _loaded(tmp_path, "--help")
    assert code == 0
    assert len(_families(modules)) == len({w.partition(":")[0] for w in VERBS.values()}) > 5


def test_the_verbs_table_names_each_verb_as_the_verb_names_itself() -> None:
    """`fleet NAME` finds the command whose name is NAME (a wrong table entry would run, or
    show the help of, another verb)."""
    for name in VERBS:
        assert cli.commands[name].name == name
    assert set(VERBS) | {"config"} == set(cli.commands)


def test_the_probe_sees_what_a_run_loads(tmp_path: Path) -> None:
    """The check can fail: a dry run of exec does load the plan and the inventory."""
    (tmp_path / "inventory.yaml").write_text("all:\n  hosts:\n    gpu01.invalid:\n")
    code, modules = _loaded(tmp_path, "exec", "true", "--dry-run", "-i", "inventory.yaml")
    assert code == 0
    assert {"fleet.engine.plan", "fleet.inventory.loader", "yaml"} <= set(modules)


# ---------------------------------------------------------------- the way out (console_main)


def _fleet(*argv: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        check=False,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_quick_exit_keeps_main_s_code_and_every_line(tmp_path: Path) -> None:
    """console_main ends the process without interpreter shutdown: what was printed is all
    there (flushed first), and the exit code is main's."""
    names = [f"n{i:04d}" for i in range(3000)]  # more than one stdio buffer of output
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n" + "".join(f"    {n}:\n" for n in names))
    listed = _fleet("hosts", "-i", str(inventory), "--json")
    assert listed.returncode == 0, listed.stderr
    assert all(n in listed.stdout for n in (names[0], names[-1]))
    failed = _fleet("hosts", "-i", str(tmp_path / "missing.yaml"))
    assert failed.returncode == 1
    assert "missing.yaml" in failed.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_that_could_not_be_written_is_not_a_success(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    node01:\n")
    with open("/dev/full", "w") as full:
        result = _fleet("hosts", "-i", str(inventory), stdout=full.fileno())
    assert result.returncode == 1  # fleet error: the output is lost


# ---------------------------------------------------------------- a run off a terminal


@pytest.mark.parametrize(
    ("env", "loads_rich"), [({}, False), ({"FORCE_COLOR": "1"}, True)], ids=["pipe", "FORCE_COLOR"]
)
def test_a_run_off_a_terminal_never_loads_rich(
    tmp_path: Path, env: dict[str, str], loads_rich: bool
) -> None:
    """Off a terminal the report and summary are plain text (fleet/output/plain.py): rich's
    import, ~20 ms of every piped or scripted command's start, is left to a terminal, or to a
    pipe that asks for styles with FORCE_COLOR (rich's own rule), which shows the check can
    fail. The node is a closed port on loopback: the run is real and ends unreachable."""
    (tmp_path / "inventory.yaml").write_text(
        "all:\n  hosts:\n    n1:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
    )
    args = ("exec", "true", "-i", "inventory.yaml")
    proc = _probe(tmp_path, PROBE, args, env={"FLEET_PERSIST": "0", **env})
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == 4, proc.stderr  # unreachable
    assert ("rich" in report["modules"]) is loads_rich
    lines = proc.stdout.splitlines()
    assert "n1 | = unreachable: connection refused" in lines
    if loads_rich:
        assert "\x1b[" in proc.stdout  # the summary's styles
    else:  # no terminal control, and the last line is one line however long (never wrapped)
        assert "\x1b" not in proc.stdout
        assert lines[-1].startswith("exit 4  (")
        assert f"run record: {tmp_path}/" in lines[-1]  # past 80 columns: rich would wrap it
