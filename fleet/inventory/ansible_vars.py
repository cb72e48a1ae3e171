"""Ansible's connection variables: which fleet honours, which it ignores, which it refuses.

Honoured: where and as whom to connect (`ansible_host`, `ansible_port`, `ansible_user`,
`ansible_ssh_private_key_file` and their `ansible_ssh_*` / `ansible_private_key_file` aliases,
the last alias winning as in Ansible's ssh plugin; fleet's short `host`, `port`, `user`, `key`
come last), and the ssh options in `ansible_ssh_args`, `ansible_ssh_common_args` and
`ansible_ssh_extra_args`, read like ssh's command line (`-o Key=Value`, `-o 'Key Value'`, `-i`,
`-p`, `-l`, `-J`, `-4`, ...): each is honoured, ignored or refused exactly as the same option in
an ssh config (sshconfig.OPTIONS, the one table), and wins over the ssh config as ssh's -o does.

Refused, for the hosts a run selects (one line naming the file and line, never the value):

* passwords (`ansible_password`, `ansible_ssh_pass`, `ansible_become_password`, ...): fleet
  takes no secret from a file; `-K` asks once for the sudo password, logins use keys;
* ssh options in those args that fleet would refuse in an ssh config, flags that change what
  ssh does rather than how it connects (`-F`, `-W`, `-N`, ...), and %-tokens outside
  ProxyCommand/ProxyJump (fleet does not expand them there);
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

from fleet.core.digits import is_digits
from fleet.core.hosts import Refusal

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
HARMLESS_FLAGS = frozenset("AaCqvTtxXYkKgM")
ASK_ONCE_HINT = (
    "remove it from the inventory: -K/--ask-become-pass asks once for the sudo password "
    "(never stored), and logins use keys or ssh-agent"
)
JINJA_HINT = "set the value itself (fleet does not evaluate Jinja)"
SSH_OPTION_HINT = (
    "remove it from the inventory's ssh args (fleet honours there what it honours in an ssh "
    "config: docs/reference/ssh.md)"
)


@dataclass(slots=True)
class Connection:
    """How to reach one host, from its merged vars."""

    address: Any = None
    port: Any = None
    user: Any = None
    key_file: Any = None
    # ssh options from ansible_ssh_*_args, in order: (lowercase keyword, value).
    ssh_options: tuple[tuple[str, str], ...] = ()
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
    ssh_options: tuple[tuple[str, str], ...] = ()
    if not _CHECKED.isdisjoint(merged):
        for name in _CHECKED:
            if _templated(merged.get(name)):
                refusals.append(Refusal(where(name), "is a Jinja template", JINJA_HINT))
        refusals += _checked_settings(merged, where)
        ssh_options, ssh_refusals = _ssh_args(merged, where)
        refusals += ssh_refusals
    if isinstance(values.get("key_file"), str):
        values["key_file"] = os.path.expanduser(values["key_file"])
    return Connection(
        **values,
        ssh_options=ssh_options,
        refusals=tuple(refusals),
        keys=keys,
        secrets=tuple(secrets),
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
) -> tuple[tuple[tuple[str, str], ...], list[Refusal]]:
    """The ssh options in the ssh args, in order (Ansible passes ansible_ssh_args, then the
    common, then the extra args, and ssh's first value wins): each one is honoured, ignored or
    refused exactly as the same option in an ssh config (sshconfig.OPTIONS)."""
    options: list[tuple[str, str]] = []
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
        for flag, arg in _flags(words):
            found, problem = _option(flag, arg)
            if problem is not None:
                refusals.append(Refusal(here, problem, SSH_OPTION_HINT))
            elif found is not None:
                options.append(found)
    return tuple(options), refusals


# ssh's flags that take an argument, as the ssh_config option each one sets (ssh(1)); None:
# the flag changes what ssh does, not how it connects, and fleet cannot take it.
FLAG_OPTIONS: dict[str, str | None] = {
    "o": "",  # the option itself
    "i": "IdentityFile",
    "p": "Port",
    "l": "User",
    "J": "ProxyJump",
    "b": "BindAddress",
    "B": "BindInterface",
    "c": "Ciphers",
    "m": "MACs",
    "e": "EscapeChar",
    "S": "ControlPath",
    "L": "LocalForward",
    "R": "RemoteForward",
    "D": "DynamicForward",
    "I": "PKCS11Provider",
    "w": "TunnelDevice",
    "P": "Tag",
    "E": "LogLevel",  # a log file: logging only
    "F": None,
    "W": None,
    "O": None,
    "Q": None,
}
# Flags without an argument that set an ssh_config option.
FLAG_SWITCHES = {"4": ("AddressFamily", "inet"), "6": ("AddressFamily", "inet6")}


def _flags(words: list[str]) -> list[tuple[str, str | None]]:
    """(flag letter, its argument) pairs from ssh's argv, `-oX=Y` and `-o X=Y` alike; a flag
    without an argument that changes nothing fleet does is dropped; a word that is not a flag
    is kept as ("", word), refused below."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if len(word) < 2 or not word.startswith("-"):
            out.append(("", word))
            continue
        letters = word[1:]
        while letters:
            flag, letters = letters[0], letters[1:]
            if flag in FLAG_OPTIONS:
                if letters:
                    out.append((flag, letters))
                elif i < len(words):
                    out.append((flag, words[i]))
                    i += 1
                else:
                    out.append((flag, None))
                break
            if flag in FLAG_SWITCHES:
                out.append((flag, None))
            elif flag not in HARMLESS_FLAGS:
                out.append((f"-{flag}", None))
    return out


_OPTION_LINE = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.+)$", re.S)
# Keywords of an ssh config's structure: not options ssh takes with -o.
_NOT_FOR_DASH_O = frozenset({"host", "match", "include", "ignoreunknown"})


def _option(flag: str, arg: str | None) -> tuple[tuple[str, str] | None, str | None]:
    """What one flag means: ((keyword, value), None) when honoured, (None, None) when harmless,
    (None, problem) when refused."""
    from fleet.ssh import config as sshconfig

    if flag in FLAG_SWITCHES:
        flag, arg = "o", "=".join(FLAG_SWITCHES[flag])
    elif flag and flag != "o" and flag in FLAG_OPTIONS:
        keyword = FLAG_OPTIONS[flag]
        if keyword is None:
            what = "fleet reads one ssh config (-F/--ssh-config)" if flag == "F" else "no"
            return None, f"ssh option -{flag}: fleet cannot take it from the inventory ({what})"
        flag, arg = "o", f"{keyword}={arg}" if arg is not None else None
    if flag != "o":
        name = flag if re.fullmatch(r"-\w", flag) else "an argument"
        return None, f"ssh option {name}: fleet cannot take it from the inventory"
    match = _OPTION_LINE.match(arg or "")
    if match is None:
        return None, "-o without 'Option=value'"
    key, value = match.group(1).lower(), match.group(2).strip()
    option = sshconfig.OPTIONS.get(key)
    if option is None or key in _NOT_FOR_DASH_O:
        return None, "-o: not an OpenSSH client option"
    if key.startswith("canonical"):
        # paramiko canonicalises while it looks the config up, which -o options bypass.
        return None, f"-o {option.name}: fleet applies it only in an ssh config"
    if option.refuses(value):
        return None, f"-o {option.name}: fleet cannot honour it: {option.why}"
    if option.handling == sshconfig.HARMLESS:
        return None, None
    problem = _value_problem(key, value)
    if problem is not None:
        return None, problem
    return (key, value), None


def _value_problem(key: str, value: str) -> str | None:
    """A value fleet would misread: a bad ProxyJump hop or port, an unknown %-token."""
    from fleet.ssh import config as sshconfig
    from fleet.ssh import hops as sshhops

    if key == "proxyjump" and value.lower() != "none":
        for hop in value.split(","):
            try:
                sshhops.parse_hop(hop)
            except ValueError as exc:
                return f"ProxyJump: {exc}"
    if key == "proxycommand":
        bad = [t for t in re.findall(r"%(.)", value) if t not in sshconfig.PROXY_TOKENS]
        if bad:
            token = bad[0] if bad[0].isalnum() else "?"
            return f"ProxyCommand: unknown token %{token} (fleet expands %h %p %r %n %%)"
    elif "%" in value:
        return "-o: fleet does not expand %-tokens in the inventory's ssh options"
    if key == "port" and not (is_digits(value) and 1 <= int(value) <= 65535):
        return "Port: expected a number 1-65535"
    if key == "connecttimeout" and not is_digits(value):
        return "ConnectTimeout: expected a number of seconds"
    return None
