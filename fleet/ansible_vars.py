"""Ansible's connection variables: which fleet honours, which it ignores, which it refuses.

Honoured: where and as whom to connect (`ansible_host`, `ansible_port`, `ansible_user`,
`ansible_ssh_private_key_file` and their `ansible_ssh_*` / `ansible_private_key_file` aliases,
the last alias winning as in Ansible's ssh plugin; fleet's short `host`, `port`, `user`, `key`
come last), and `-o ProxyJump=`, `-J`, `-o ProxyCommand=` in `ansible_ssh_args`,
`ansible_ssh_common_args` and `ansible_ssh_extra_args`.

Refused, for the hosts a run selects (one line naming the file and line, never the value):

* passwords (`ansible_password`, `ansible_ssh_pass`, `ansible_become_password`, ...): fleet
  takes no secret from a file; `-K` asks once for the sudo password, logins use keys;
* other ssh options in those args that change where or how fleet connects (they belong in the
  ssh config, where fleet honours or refuses each one); options that do not are ignored;
* `ansible_connection` other than ssh (fleet only speaks SSH); `ansible_become_method` other
  than sudo, `ansible_become_user` other than root (fleet's privileged steps run as root);
* a Jinja template (`{{ ... }}`) in any of these: fleet does not evaluate templates.

Everything else (`ansible_become`, `ansible_python_interpreter`, ...) is an ordinary variable.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Alias lists in the order Ansible's ssh plugin reads them (the last one set wins), then
# fleet's short form, which loses to both.
ADDRESS_KEYS = ("ansible_host", "ansible_ssh_host", "host")
PORT_KEYS = ("ansible_port", "ansible_ssh_port", "port")
USER_KEYS = ("ansible_user", "ansible_ssh_user", "user")
KEY_KEYS = ("ansible_private_key_file", "ansible_ssh_private_key_file", "key")
SHORT_KEYS = frozenset({"host", "port", "user", "key"})
SSH_ARGS_KEYS = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")
SECRET = re.compile(r"^ansible_(?:\w+_)?pass(?:word)?$")
SSH_CONNECTIONS = frozenset(
    {
        "ssh",
        "smart",
        "paramiko",
        "paramiko_ssh",
        "ansible.builtin.ssh",
        "ansible.builtin.paramiko_ssh",
    }
)
SUDO = frozenset({"sudo", "ansible.builtin.sudo"})
# ssh flags without an argument that change nothing fleet does (verbosity, compression, tty,
# forwarding of agent/X11, GSSAPI delegation).
HARMLESS_FLAGS = frozenset("AaCqvTtxXYkKg")
ASK_ONCE_HINT = (
    "remove it from the inventory: -K/--ask-become-pass asks once for the sudo password "
    "(never stored), and logins use keys or ssh-agent"
)
JINJA_HINT = "set the value itself (fleet does not evaluate Jinja)"
SSH_OPTION_HINT = (
    "set it in the ssh config (~/.ssh/config or -F), where fleet honours or refuses each option; "
    "from the inventory fleet takes only -o ProxyJump=, -J and -o ProxyCommand="
)


@dataclass(frozen=True)
class Refusal:
    """A setting fleet will not act on, said when a run selects a host that has it."""

    where: str  # `FILE:LINE: place`, the place ending with the variable's name
    reason: str
    hint: str


@dataclass(slots=True)
class Connection:
    """How to reach one host, from its merged vars."""

    address: Any = None
    port: Any = None
    user: Any = None
    key_file: Any = None
    proxy: tuple[str, str] | None = None  # ("proxyjump", "a,b") or ("proxycommand", "...")
    refusals: tuple[Refusal, ...] = ()
    # Which alias supplied each setting, for type errors that point at it.
    keys: Mapping[str, str] | None = None
    # Password variables present (dropped from the host's vars, whatever their value).
    secrets: tuple[str, ...] = ()


def is_secret(name: str) -> bool:
    """Variables that hold passwords: never kept, shown or used."""
    return bool(SECRET.match(name))


def _last(merged: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    """Ansible's rule: of the long aliases, the last one set wins; the short form comes last."""
    found: tuple[str | None, Any] = (None, None)
    for key in keys[:-1]:
        if merged.get(key) is not None:
            found = (key, merged[key])
    if found[0] is None and merged.get(keys[-1]) is not None:
        found = (keys[-1], merged[keys[-1]])
    return found


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def connection(merged: Mapping[str, Any], where: Callable[[str], str]) -> Connection:
    """Connection settings and refusals from a host's merged vars; `where(key)` says where the
    winning value of `key` was written. Runs once per host: kept lean for 100k-host inventories."""
    refusals: list[Refusal] = []
    keys: dict[str, str] = {}
    values: dict[str, Any] = {}
    for setting, aliases in _SETTINGS:
        key, value = _last(merged, aliases)
        if key is None:
            continue
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            refusals.append(Refusal(where(key), "is a Jinja template", JINJA_HINT))
            continue
        keys[setting] = key
        values[setting] = value
    secrets: list[str] = []
    for name in merged:
        if "pass" in name and is_secret(name):
            secrets.append(name)
            if merged[name] is not None and merged[name] != "":
                refusals.append(
                    Refusal(
                        where(name), "fleet takes no passwords from the inventory", ASK_ONCE_HINT
                    )
                )
    proxy = None
    if not _CHECKED.isdisjoint(merged):
        for name in _CHECKED:
            if _templated(merged.get(name)):
                refusals.append(Refusal(where(name), "is a Jinja template", JINJA_HINT))
        refusals += _checked_settings(merged, where)
        proxy, ssh_refusals = _ssh_args(merged, where)
        refusals += ssh_refusals
    if isinstance(values.get("key_file"), str):
        values["key_file"] = os.path.expanduser(values["key_file"])
    return Connection(
        **values, proxy=proxy, refusals=tuple(refusals), keys=keys, secrets=tuple(secrets)
    )


_SETTINGS = (
    ("address", ADDRESS_KEYS),
    ("port", PORT_KEYS),
    ("user", USER_KEYS),
    ("key_file", KEY_KEYS),
)
_CHECKED = frozenset(
    {"ansible_connection", "ansible_become_method", "ansible_become_user", *SSH_ARGS_KEYS}
)


def _checked_settings(merged: Mapping[str, Any], where: Callable[[str], str]) -> list[Refusal]:
    """ansible_connection, ansible_become_method, ansible_become_user."""
    out: list[Refusal] = []
    rules = (
        (
            "ansible_connection",
            SSH_CONNECTIONS,
            "fleet connects over SSH only",
            "remove it, or leave this host out with --limit",
        ),
        (
            "ansible_become_method",
            SUDO,
            "fleet becomes root with sudo only",
            "remove it (fleet runs sudo where a step needs root)",
        ),
        (
            "ansible_become_user",
            frozenset({"root"}),
            "fleet's privileged steps run as root",
            "remove it, or set it to root",
        ),
    )
    for name, allowed, why, hint in rules:
        value = merged.get(name)
        if value is None or value == "" or _templated(value):
            continue
        if not isinstance(value, str) or value.strip() not in allowed:
            out.append(Refusal(where(name), f"is {_shown(value)}: {why}", hint))
    return out


def _shown(value: Any) -> str:
    """A short setting value for a message, only when it is a plain word (`docker`)."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.\-]{1,40}", value):
        return f"'{value}'"
    return "(this value)"


def _ssh_args(
    merged: Mapping[str, Any], where: Callable[[str], str]
) -> tuple[tuple[str, str] | None, list[Refusal]]:
    """ProxyJump/ProxyCommand from the ssh args (the first one given wins, as in OpenSSH);
    every other option either changes nothing fleet does or is refused."""
    proxy: tuple[str, str] | None = None
    refusals: list[Refusal] = []
    for name in SSH_ARGS_KEYS:
        value = merged.get(name)
        if value is None or value == "" or _templated(value):
            continue
        here = where(name)
        if not isinstance(value, str):
            refusals.append(Refusal(here, "expected ssh arguments as text", SSH_OPTION_HINT))
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            refusals.append(Refusal(here, "unbalanced quotes", SSH_OPTION_HINT))
            continue
        for option, arg in _options(words):
            found, problem = _option(option, arg)
            if problem is not None:
                refusals.append(Refusal(here, problem, SSH_OPTION_HINT))
            elif found is not None and proxy is None:
                proxy = found
    return proxy, refusals


def _options(words: list[str]) -> list[tuple[str, str | None]]:
    """(`-o`/`-J`/flag, its argument) pairs from ssh's argv."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if len(word) < 2 or not word.startswith("-"):
            out.append(("", word))  # not an option: refused below
            continue
        flag = word[1]
        if flag in "oJ":
            if len(word) > 2:
                out.append((flag, word[2:]))
            elif i < len(words):
                out.append((flag, words[i]))
                i += 1
            else:
                out.append((flag, None))
        elif all(c in HARMLESS_FLAGS for c in word[1:]):
            continue
        else:
            out.append((word, None))
    return out


_OPTION_LINE = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.+)$", re.S)


def _option(flag: str, arg: str | None) -> tuple[tuple[str, str] | None, str | None]:
    """What one option means: (proxy setting, None), (None, None) when harmless, or
    (None, problem)."""
    from fleet import sshconfig, sshproxy

    if flag == "J":
        flag, arg = "o", f"ProxyJump={arg}" if arg is not None else None
    if flag != "o":
        name = flag if re.fullmatch(r"-\w", flag) else "an argument"
        return None, f"ssh option {name}: fleet cannot take it from the inventory"
    match = _OPTION_LINE.match(arg or "")
    if match is None:
        return None, "-o without 'Option=value'"
    key, value = match.group(1).lower(), match.group(2).strip()
    option = sshconfig.OPTIONS.get(key)
    if option is None:
        return None, "-o: not an OpenSSH client option"
    if key == "proxyjump":
        if value.lower() != "none":
            for hop in value.split(","):
                try:
                    sshproxy.parse_hop(hop)
                except ValueError as exc:
                    return None, f"ProxyJump: {exc}"
        return ("proxyjump", value), None
    if key == "proxycommand":
        bad = [t for t in re.findall(r"%(.)", value) if t not in sshconfig.PROXY_TOKENS]
        if bad:
            token = bad[0] if bad[0].isalnum() else "?"
            return None, f"ProxyCommand: unknown token %{token} (fleet expands %h %p %r %n %%)"
        return ("proxycommand", value), None
    if option.handling == sshconfig.HARMLESS or (
        option.handling == sshconfig.REFUSED and not option.refuses(value)
    ):
        return None, None
    return None, f"-o {option.name}: fleet cannot take it from the inventory"
