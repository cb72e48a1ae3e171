"""Settings for tests that call the ops layer directly: the flat flag names a test reads best
(`yes=True`, `json=True`, `verb="launch"`), put where fleet.cli puts them."""

from __future__ import annotations

from typing import Any

from fleet.engine.runner import RunSettings
from fleet.inventory.loader import Selection
from fleet.ops.jobs import AskSettings, Settings
from fleet.output.settings import OutputSettings
from fleet.records.runlog import RecordSettings
from fleet.ssh.settings import SshSettings

_PARTS: dict[str, tuple[str, ...]] = {
    "hosts": ("inventory", "found", "nodes", "playbook_dir", "limit"),
    "ssh": ("ssh_config", "host_keys", "connect_timeout_s", "banner_timeout_s", "auth_timeout_s"),
    "output": ("json", "plain", "output", "gather"),
    "record": ("log_dir", "verb", "invocation"),
    "run": ("forks", "workers", "sudo", "password_on_stdin"),
    "ask": ("dry_run", "yes", "ask_key_pass", "ask_become_pass", "confirm"),
}


def settings(**flat: Any) -> Settings:
    """Settings from flat names; -K (`ask_become_pass`) also sends the password on stdin, as
    the CLI does."""
    part = {name: {k: flat.pop(k) for k in keys if k in flat} for name, keys in _PARTS.items()}
    if part["ask"].get("ask_become_pass"):
        part["run"].setdefault("password_on_stdin", True)
    if flat.keys() - {"vars"}:
        raise TypeError(f"unknown settings: {sorted(flat)}")
    return Settings(
        hosts=Selection(**part["hosts"]),
        run=RunSettings(
            ssh=SshSettings(**part["ssh"]),
            output=OutputSettings(**part["output"]),
            record=RecordSettings(**part["record"]),
            **part["run"],
        ),
        ask=AskSettings(**part["ask"]),
        vars=tuple(flat.get("vars", ())),
    )
