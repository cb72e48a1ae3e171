"""The verbs of the `fleet` group, each loaded when it is first needed.

A verb's module declares its options (click builds an object for each at import) and imports what
its checks need: loading every family of verbs cost ~10 ms at the start of each command, of which
`fleet exec` needs one family. `VERBS` names where each verb is defined; `Verbs` is the group's
command table, which imports a verb's module the first time the verb is looked up (to run it, for
its help, or for `fleet --help`, which lists them all). `Defaults` is click's default_map for a
group, with a verb's own entries worked out only when click asks for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import click

# name -> "module:attribute" (`fleet --help` lists them sorted: click sorts the names).
VERBS = {
    "hosts": "fleet.cli.hosts:hosts",
    "playbooks": "fleet.cli.hosts:playbooks",
    "run": "fleet.cli.run:run",
    "exec": "fleet.cli.run:exec_",
    "cleanup": "fleet.cli.cleanup:cleanup",
    "kill-docker": "fleet.cli.cleanup:kill_docker",
    "janitor": "fleet.cli.janitor:janitor",
    "preflight": "fleet.cli.launch:preflight",
    "launch": "fleet.cli.launch:launch",
    "stop": "fleet.cli.launch:stop",
    "status": "fleet.cli.launch:status",
    "logs": "fleet.cli.launch:logs",
    "push": "fleet.cli.files:push",
    "pull": "fleet.cli.files:pull",
    "checkpoints": "fleet.cli.checkpoints:checkpoints",
    "connections": "fleet.cli.connections:connections",
    "disconnect": "fleet.cli.connections:disconnect",
    "sandbox": "fleet.cli.sandbox:sandbox",
}


def load(where: str) -> click.Command:
    """The command object at "module:attribute"."""
    module, _, attribute = where.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{where} is not a click command")
    return command


class Verbs(MutableMapping[str, click.Command]):
    """A group's command table: names known at once, each command loaded on first lookup.
    Commands added later (add_command) are held as they are."""

    def __init__(self, where: Mapping[str, str]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            command = self._loaded[name] = load(self._where[name])
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._where.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._where and name not in self._loaded:
            raise KeyError(name)
        self._where.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        yield from self._where
        yield from (name for name in self._loaded if name not in self._where)

    def __len__(self) -> int:
        return len(self._where.keys() | self._loaded.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._where or name in self._loaded


class Defaults(dict[str, Any]):
    """click's default_map for one command: its own parameters' defaults, filled in at once, and
    each subcommand's map, built by its entry in `subcommands` when it is first looked up (click
    looks it up as it makes the subcommand's context)."""

    def __init__(
        self, own: Mapping[str, Any], subcommands: Mapping[str, Callable[[], dict[str, Any]]]
    ) -> None:
        super().__init__(own)
        self._subcommands = dict(subcommands)

    def __missing__(self, key: str) -> Any:
        build = self._subcommands.pop(key, None)
        if build is None:
            raise KeyError(key)
        value = self[key] = build()
        return value

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or key in self._subcommands

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default
