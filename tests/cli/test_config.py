"""Config files: flag > env > project file > user file > built-in, errors with file:line."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.cli import config

FLEET = (sys.executable, "-m", "fleet")


def _inventory(path: Path, *names: str) -> Path:
    hosts = "".join(f"        {n}: {{ansible_host: 127.0.0.1}}\n" for n in names)
    path.write_text(f"all:\n  children:\n    gpu:\n      hosts:\n{hosts}")
    return path


@pytest.fixture
def world(trusted_tmp: Path) -> dict[str, Path]:
    tmp_path = trusted_tmp
    """A user config dir, a project dir with a subdir to run in, two inventories."""
    (tmp_path / "xdg" / "fleet").mkdir(parents=True)
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    return {
        "user": tmp_path / "xdg" / "fleet" / "config.yaml",
        "project": tmp_path / "proj" / "fleet.yaml",
        "cwd": tmp_path / "proj" / "sub",
        "inv_a": _inventory(tmp_path / "proj" / "a.yaml", "alpha1", "alpha2"),
        "inv_b": _inventory(tmp_path / "b.yaml", "beta1"),
        "xdg": tmp_path / "xdg",
    }


def _fleet(world: dict[str, Path], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    full.update(XDG_CONFIG_HOME=str(world["xdg"]), **env)
    return subprocess.run(
        [*FLEET, *args],
        cwd=world["cwd"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _port_in_dry_run(world: dict[str, Path], *args: str, **env: str) -> str:
    out = _fleet(world, "cleanup", "--dry-run", *args, **env)
    assert out.returncode == 0, out.stderr
    word = out.stdout.split("--port ", 1)[1].split()[0]
    return word.strip("'")


def test_precedence_flag_env_project_user_builtin(world: dict[str, Path]) -> None:
    inv = str(world["inv_a"])
    assert _port_in_dry_run(world, "-i", inv) == "39500"  # built-in
    world["user"].write_text("port: 40000\nforks: 3\n")
    assert _port_in_dry_run(world, "-i", inv) == "40000"  # user file
    world["project"].write_text("port: 40001\ninventory: a.yaml\n")  # relative to the file
    assert _port_in_dry_run(world) == "40001"  # project over user; its inventory found
    assert _port_in_dry_run(world, "--port", "40002") == "40002"  # the flag over all

    hosts = json.loads(_fleet(world, "hosts", "--json").stdout)
    assert sorted(h["name"] for h in hosts) == ["alpha1", "alpha2"]
    env_hosts = json.loads(
        _fleet(world, "hosts", "--json", FLEET_INVENTORY=str(world["inv_b"])).stdout
    )
    assert [h["name"] for h in env_hosts] == ["beta1"]  # env over the project file

    shown = json.loads(_fleet(world, "config", "--json").stdout)
    settings = shown["settings"]
    assert settings["port"] == {"value": 40001, "source": f"{world['project']}:1"}
    assert settings["forks"] == {"value": 3, "source": f"{world['user']}:2"}
    assert settings["inventory"]["value"] == str(world["inv_a"])
    assert settings["grace"]["source"] == "built-in"
    with_env = json.loads(
        _fleet(world, "config", "--json", FLEET_INVENTORY=str(world["inv_b"])).stdout
    )
    assert with_env["settings"]["inventory"] == {
        "value": str(world["inv_b"]),
        "source": "env FLEET_INVENTORY",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("forkz: 3\n", ":1: unknown setting 'forkz'"),
        ("forks: 0\n", ":1: forks: expected a number from 1 to 1024"),
        ("forks: many\n", ":1: forks: expected a number from 1 to 1024"),
        ("host_keys: yes-please\n", ":1: host_keys: expected one of strict, accept-new"),
        ("patterns: []\n", ":1: patterns: expected a string or a list of strings"),
        ("- forks\n", "expected a mapping of settings"),
        ("forks: [\n", "invalid YAML"),
        ("grace: .nan\n", ":1: grace: expected a number from 0 to 600"),
        ("persist: .inf\n", ":1: persist: expected a number from 0 to 86400"),
        # An integer past a float's range is out of range, not an OverflowError.
        (f"forks: {'9' * 400}\n", ":1: forks: expected a number from 1 to 1024"),
        (f"port: {'9' * 400}\n", ":1: port: expected a number from 1 to 65535"),
        (f"workers: {'9' * 400}\n", ":1: workers: expected auto or a whole number from 1 to 256"),
        ('patterns: "("\n', ":1: patterns: '(': '(' is never closed"),
        ("patterns: [torchrun, 'a)']\n", ":1: patterns: 'a)': ')' closes nothing"),
        ('launcher: "\'/opt/x"\n', ":1: launcher: expected shell words"),
        ('output_dir: "/a\\nb"\n', ":1: output_dir: expected a directory name on one line"),
    ],
)
def test_a_bad_file_is_one_line_with_file_and_line(
    world: dict[str, Path], text: str, message: str
) -> None:
    world["project"].write_text(text)
    out = _fleet(world, "hosts", "-i", str(world["inv_a"]))
    assert out.returncode == 1
    first, hint = out.stderr.splitlines()[:2]
    assert first.startswith(f"fleet: error: config {world['project']}") or first.startswith(
        f"fleet: error: {world['project']}"
    )
    assert message in first
    assert hint.strip().startswith("hint:")
    assert "Traceback" not in out.stderr
    assert _fleet(world, "--help").returncode == 0  # help still works


def test_a_secret_like_key_is_not_echoed(world: dict[str, Path]) -> None:
    world["user"].write_text("'hunter2 is my password': 1\n")
    out = _fleet(world, "hosts", "-i", str(world["inv_a"]))
    assert out.returncode == 1
    assert "hunter2" not in out.stderr


def test_default_map_reaches_every_command_with_the_option() -> None:
    from fleet.cli import cli

    settings = {
        "port": config.Setting("port", 40100, "f:1"),
        "output_dir": config.Setting("output_dir", "/data/out", "f:2"),
    }
    dm = config.default_map(settings, cli)
    assert dm["cleanup"]["port"] == 40100
    assert dm["launch"]["master_port"] == 40100
    assert dm["janitor"]["start"]["directory"] == "/data/out"
    assert "port" not in dm.get("exec", {})


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ('patterns: "("\n', ["cleanup", "-n"]),
        ('patterns: "("\n', ["status", "-n"]),
        ('launcher: "\'/opt/x"\n', ["launch", "-n", "--dir", "/o", "t.py"]),
    ],
)
def test_a_bad_value_in_a_config_file_is_blamed_on_its_line_not_the_command_line(
    world: dict[str, Path], text: str, argv: list[str]
) -> None:
    """The file's values are a command's defaults: one refused later was said to come from
    the command line (exit 2); the file's line is what to fix (exit 1)."""
    named = world["xdg"] / "c.yaml"
    named.write_text(text)
    out = _fleet(world, *argv, "-i", str(world["inv_a"]), FLEET_CONFIG=str(named))
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"fleet: error: {named}:1: "), out.stderr
    assert "command line" not in out.stderr


@pytest.mark.parametrize(
    ("name", "value", "key"),
    [
        ("FLEET_PERSIST", "abc", "persist"),
        ("FLEET_PERSIST", "nan", "persist"),
        ("FLEET_WORKERS", "0", "workers"),
        ("FLEET_WORKERS", "4.5", "workers"),
        ("FLEET_SSH_ENGINE", "openssh", "ssh_engine"),
    ],
)
def test_config_flags_a_bad_value_from_the_environment(
    world: dict[str, Path], name: str, value: str, key: str
) -> None:
    out = _fleet(world, "config", **{name: value})
    assert out.returncode == 1
    (line,) = [x for x in out.stdout.splitlines() if x.startswith(f"{key} ")]
    assert f"[env {name}]  (invalid: expected" in line
    first, hint = out.stderr.splitlines()
    assert first.startswith(f"fleet: error: env {name}: {key}: expected")
    assert f"unset {name}" in hint
    shown = _fleet(world, "config", "--json", **{name: value})
    assert shown.returncode == 1
    setting = json.loads(shown.stdout)["settings"][key]
    assert setting["value"] == value
    assert setting["problem"].startswith("expected")


def test_config_takes_good_values_from_the_environment(world: dict[str, Path]) -> None:
    env = {"FLEET_PERSIST": "0.5", "FLEET_WORKERS": "auto", "FLEET_SSH_ENGINE": "paramiko"}
    out = _fleet(world, "config", "--json", **env)
    assert out.returncode == 0, out.stderr
    assert not any("problem" in s for s in json.loads(out.stdout)["settings"].values())
    assert _fleet(world, "config", FLEET_WORKERS="12").returncode == 0


def test_a_removed_working_directory_is_one_error_line_and_help_still_works(
    tmp_path: Path,
) -> None:
    """A shell left in a directory someone removed: every command says so (it reads ./fleet.yaml
    and resolves relative paths against that directory) instead of an internal error."""
    gone = tmp_path / "gone"
    gone.mkdir()
    fleet = " ".join(shlex.quote(word) for word in FLEET)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_INVENTORY"] = str(_inventory(tmp_path / "inv.yaml", "alpha1"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        script = f'cd "$1" && rmdir "$1" && shift && exec {fleet} "$@"'
        return subprocess.run(
            ["sh", "-c", script, "sh", str(gone), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    for args in (("hosts",), ("exec", "--dry-run", "true"), ("config",)):
        gone.mkdir(exist_ok=True)
        done = run(*args)
        assert done.returncode == 1, (args, done.stderr)
        lines = done.stderr.splitlines()
        assert lines[0] == (
            "fleet: error: the current directory no longer exists "
            "(removed while this shell was in it)"
        ), (args, done.stderr)
        assert lines[1].startswith("  hint: cd to a directory that exists"), done.stderr
        assert "internal error" not in done.stderr
    gone.mkdir(exist_ok=True)
    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage: fleet" in helped.stdout
