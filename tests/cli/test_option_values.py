"""Values the options take: every float option refuses nan and inf as a usage error before
anything connects, and a bad value from an environment variable names the variable."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleet.cli import cli
from fleet.cli.lazy import VERBS, load
from fleet.cli.options import Finite


@pytest.fixture(autouse=True)
def clean_environment(trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch, mocker: object) -> None:
    """No config, inventory or env from the developer's shell; nothing may connect."""
    for name in (
        "FLEET_INVENTORY",
        "FLEET_SSH_CONFIG",
        "FLEET_DEBUG",
        "FLEET_PERSIST",
        "FLEET_WORKERS",
        "FLEET_SSH_ENGINE",
        "FLEET_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trusted_tmp / "no-user-config"))
    monkeypatch.setenv("FLEET_LOG_DIR", str(trusted_tmp / "runs"))
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    mocker.patch(  # type: ignore[attr-defined]
        "fleet.ssh.transport.SSHTransport",
        side_effect=AssertionError("a refused value must not create a transport"),
    )


# ---------------------------------------------------------------- the type


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", float("nan")])
def test_finite_refuses_nan_and_inf(value: object) -> None:
    with pytest.raises(click.BadParameter, match="is not a finite number"):
        Finite(0).convert(value, None, None)


def test_finite_keeps_its_range_and_its_numbers() -> None:
    assert Finite(0.1, 600).convert("2.5", None, None) == 2.5
    assert Finite(0).convert(7, None, None) == 7.0
    with pytest.raises(click.BadParameter, match="'abc' is not a number"):
        Finite(0).convert("abc", None, None)
    with pytest.raises(click.BadParameter, match="not in the range"):
        Finite(0.1, 600).convert("0.01", None, None)


def _commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            assert sub is not None
            yield from _commands(sub, f"{path} {name}")


def _float_options() -> Iterator[tuple[str, click.Parameter]]:
    for verb, where in VERBS.items():
        for path, command in _commands(load(where), verb):
            for param in command.params:
                if isinstance(param.type, (click.types.FloatParamType, click.FloatRange)):
                    yield f"{path} {param.name}", param


def test_every_float_option_of_every_verb_is_finite() -> None:
    """One type for all: a float option added with click's own FloatRange would let nan in."""
    found = dict(_float_options())
    assert "exec timeout_s" in found  # the walk reaches them
    assert "janitor start interval" in found
    kinds = {name: type(p.type).__name__ for name, p in found.items()}
    assert kinds == dict.fromkeys(found, "Finite")


# ---------------------------------------------------------------- the command line

NAN_CASES = [
    ["exec", "--connect-timeout", "nan", "true"],
    ["exec", "--banner-timeout", "nan", "true"],
    ["exec", "--auth-timeout", "nan", "true"],
    ["exec", "--timeout", "nan", "true"],
    ["exec", "--timeout", "inf", "true"],
    ["exec", "--persist", "nan", "true"],
    ["stop", "--yes", "--grace", "nan"],
    ["status", "--watch", "nan"],
    ["cleanup", "--grace", "nan"],
    ["kill-docker", "--grace", "inf"],
    ["preflight", "--dir", "/o", "--min-free-gb", "inf"],
    ["janitor", "start", "--dir", "/o", "--interval", "nan"],
    ["janitor", "start", "--dir", "/o", "--min-age", "nan"],
]


@pytest.mark.parametrize("argv", NAN_CASES, ids=" ".join)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_nan_and_inf_are_usage_errors_before_connecting(
    argv: list[str], dry_run: bool, run_main: Callable[..., tuple[int, str, str]]
) -> None:
    option = next(a for a in argv if a.startswith("--") and a not in ("--yes", "--dir"))
    code, out, err = run_main(*argv, "-w", "gpu01,gpu02", *(["-n"] if dry_run else []))
    assert code == 2, err
    assert f"Invalid value for '{option}'" in err
    assert "is not a finite number" in err
    assert "internal error" not in err
    assert out == ""


# ---------------------------------------------------------------- the environment


@pytest.mark.parametrize(
    ("name", "value", "option"),
    [
        ("FLEET_PERSIST", "abc", "--persist"),
        ("FLEET_PERSIST", "nan", "--persist"),
        ("FLEET_WORKERS", "0", "--workers"),
        ("FLEET_SSH_ENGINE", "openssh", "--ssh-engine"),
    ],
)
def test_a_bad_value_from_the_environment_names_the_variable(
    name: str,
    value: str,
    option: str,
    run_main: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(name, value)
    code, _, err = run_main("exec", "-w", "gpu01", "-n", "true")
    assert code == 2
    assert f"Invalid value for '{option}' (from env {name})" in err


def test_a_bad_flag_is_not_blamed_on_the_environment(
    run_main: Callable[..., tuple[int, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_PERSIST", "5")
    code, _, err = run_main("exec", "-w", "gpu01", "-n", "--persist", "abc", "true")
    assert code == 2
    assert "Invalid value for '--persist': 'abc' is not a number" in err
    assert "FLEET_PERSIST" not in err


def test_the_help_is_unchanged_by_the_type() -> None:
    """The reference docs are generated from the help: the range still shows as click's."""
    result = CliRunner().invoke(cli, ["exec", "--help"])
    assert "--connect-timeout FLOAT RANGE" in result.output
    assert "0.1<=x<=600" in result.output
