"""fleet/core/defaults.py is the one place of the built-in defaults: the shipped playbooks state the
same values in their `vars:`, and `fleet config`, the help texts and the engine read them."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from fleet.cli import cli, config
from fleet.core import defaults
from fleet.core.playbook import builtin_names, load_playbook
from fleet.engine.runner import RunSettings
from fleet.ssh.settings import SshSettings

# playbook -> {var: the default it must equal}
PLAYBOOK_DEFAULTS: dict[str, dict[str, Any]] = {
    "cleanup": {"patterns": defaults.PATTERNS, "grace": defaults.GRACE_S, "port": defaults.PORT},
    "kill-docker": {"patterns": defaults.PATTERNS, "grace": defaults.GRACE_S},
    "preflight": {
        "patterns": defaults.PATTERNS,
        "master_port": defaults.PORT,
        "min_free_gb": defaults.MIN_FREE_GB,
    },
    "launch": {
        "master_port": defaults.PORT,
        "launcher": defaults.LAUNCHER,
        "gpus": defaults.NPROC_PER_NODE,
    },
    "status": {"patterns": defaults.PATTERNS},
    "stop": {"grace": defaults.STOP_GRACE_S},
    "logs": {"lines": defaults.LOG_LINES},
    "janitor": {
        "interval": defaults.JANITOR_INTERVAL_S,
        "min_age": defaults.JANITOR_MIN_AGE_S,
    },
}


def test_every_shipped_playbook_is_checked() -> None:
    assert set(PLAYBOOK_DEFAULTS) == set(builtin_names())


@pytest.mark.parametrize("name", sorted(PLAYBOOK_DEFAULTS))
def test_playbook_vars_equal_the_defaults(name: str) -> None:
    variables = load_playbook(name).vars
    for var, want in PLAYBOOK_DEFAULTS[name].items():
        assert var in variables, f"playbooks/{name}.yaml: no var {var}"
        have = variables[var]
        if isinstance(want, tuple):
            assert list(have) == list(want), f"playbooks/{name}.yaml: {var}"
        else:
            assert type(have) is type(want), f"playbooks/{name}.yaml: {var} is {have!r}"
            assert have == want, f"playbooks/{name}.yaml: {var} is {have!r}, not {want!r}"


def test_the_engine_reads_the_same_defaults() -> None:
    run = RunSettings()
    assert run.forks == defaults.FORKS
    ssh = SshSettings()
    assert (ssh.banner_timeout_s, ssh.auth_timeout_s) == (
        defaults.BANNER_TIMEOUT_S,
        defaults.AUTH_TIMEOUT_S,
    )
    assert run.ssh == ssh


def test_fleet_config_shows_the_defaults() -> None:
    built_in = config.BUILT_IN
    assert built_in["forks"] == str(defaults.FORKS)
    assert built_in["port"] == str(defaults.PORT)
    assert built_in["grace"] == str(defaults.GRACE_S)
    assert built_in["patterns"] == r"torchrun, train\.py"
    assert built_in["inventory"] == defaults.INVENTORY


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["cleanup"], f"[default: {defaults.PORT}]"),
        (["cleanup"], "[default: torchrun, train.py]"),
        (["preflight"], f"[default: {defaults.PORT}]"),
        (["launch"], f"[default: {defaults.PORT}]"),
        (["stop"], f"[default: {defaults.STOP_GRACE_S}]"),
        (["exec"], f"[default: {defaults.FORKS};"),
    ],
)
def test_help_texts_show_the_defaults(command: list[str], shown: str) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert shown in " ".join(result.output.split())


def test_shown_patterns_drop_regex_escapes() -> None:
    assert defaults.shown() == "torchrun, train.py"
    assert defaults.shown(("a\\.b", "c")) == "a.b, c"
