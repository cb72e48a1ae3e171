"""Defaults an operator would otherwise type every time, from a user and a project config file.

    ~/.config/fleet/config.yaml   the user's ($XDG_CONFIG_HOME, or the file $FLEET_CONFIG names)
    ./fleet.yaml                  the project's: the nearest one in this directory or a parent

Precedence, highest first: a command-line flag > an environment variable (FLEET_INVENTORY,
FLEET_SSH_CONFIG, FLEET_LOG_DIR, FLEET_WORKERS) > the project file > the user file > fleet's
built-in default. Click applies the first two itself; the files become the commands'
`default_map`, which click consults only after both. `fleet config` shows every key's effective
value and where it came from.

A file is a flat mapping of the keys in KEYS. Paths (inventory, ssh_config, log_dir) are relative
to the file that names them. Unknown keys and bad values are errors naming file:line, values
checked by the rule of the option they set: a command takes them as defaults, so one it refused
later would be blamed on the command line. `fleet config` also flags an environment variable's
value its option would refuse.

Both files are found, not named, so fleet.core.trust's rule applies: a fleet.yaml someone else could
have written is passed over with a warning, and so is a path a found file names; the user file
is checked as OpenSSH checks ~/.ssh/config. A file named with $FLEET_CONFIG is read as named.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from fleet.cli.lazy import Defaults
from fleet.core import defaults, trust, userpath
from fleet.core.digits import is_digits
from fleet.core.errors import ConfigError

if TYPE_CHECKING:
    from fleet.core.yamlfile import YamlDoc

PROJECT_FILE = "fleet.yaml"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _path(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a path")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value


def _words(value: Any) -> list[str]:
    """A string or a list of non-empty strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
        raise ValueError("expected a string or a list of strings")
    return list(items)


def _directory(value: Any) -> str:
    """A directory on the nodes: one line, as the ops that use it require (fleet/node)."""
    text = _text(value)
    if "\n" in text or "\0" in text:
        raise ValueError("expected a directory name on one line")
    return text


def _launcher(value: Any) -> str:
    """Shell words with balanced quotes, as `fleet launch --launcher` requires."""
    import shlex

    text = _text(value)
    try:
        shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"expected shell words: {exc}") from None
    return text


def _patterns(value: Any) -> list[str]:
    """Kill patterns, each read as the nodes' grep -E reads it (fleet.node.ere): checked here, so
    a bad one is this file's line (exit 1), not a --pattern the operator never typed (exit 2)."""
    from fleet.node.ere import BadPattern, compile_ere

    items = _words(value)
    for item in items:
        try:
            compile_ere(item)
        except BadPattern as exc:
            raise ValueError(f"{item!r}: {exc}") from None
    return items


def _number(kind: type, low: float, high: float) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number from {low:g} to {high:g}")  # noqa: TRY004
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"expected a whole number from {low:g} to {high:g}")
        if not low <= value <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return kind(value)

    return check


def _workers(value: Any) -> Any:
    """`auto` or a whole number of worker processes."""
    if value == "auto":
        return value
    try:
        return _number(int, 1, 256)(value)
    except ValueError:
        raise ValueError("expected auto or a whole number from 1 to 256") from None


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(value)

    return check


def _env_number(text: str) -> Any:
    """An environment variable's text as the number it spells, else as is (for check to refuse)."""
    try:
        return float(text)
    except ValueError:
        return text


def _env_whole(text: str) -> Any:
    """Digits as a whole number (as --workers reads them), anything else as is."""
    return int(text) if is_digits(text.strip()) else text


@dataclass(frozen=True)
class Key:
    """A config key: the command options it sets (by parameter name), how it is checked."""

    params: tuple[str, ...]
    check: Callable[[Any], Any]
    help: str
    env: str | None = None
    relative: bool = False  # a local path, taken relative to the file that sets it
    from_env: Callable[[str], Any] = str  # how `env`'s text is read before `check`


KEYS: dict[str, Key] = {
    "inventory": Key(("inventory",), _path, "inventory file", "FLEET_INVENTORY", True),
    "ssh_config": Key(("ssh_config",), _path, "OpenSSH client config", "FLEET_SSH_CONFIG", True),
    "log_dir": Key(("log_dir",), _path, "where run records go", "FLEET_LOG_DIR", True),
    "host_keys": Key(("host_keys",), _choice("strict", "accept-new"), "unknown host keys"),
    "forks": Key(("forks",), _number(int, 1, 1024), "hosts worked on at once"),
    "workers": Key(
        ("workers",),
        _workers,
        "processes a run's hosts are split over",
        "FLEET_WORKERS",
        from_env=_env_whole,
    ),
    "connect_timeout": Key(("connect_timeout",), _number(float, 0.1, 600), "TCP connect, s"),
    "persist": Key(
        ("persist",),
        _number(float, 0, 86400),
        "warm connections kept, s",
        "FLEET_PERSIST",
        from_env=_env_number,
    ),
    "ssh_engine": Key(
        ("ssh_engine",),
        _choice(*defaults.SSH_ENGINES),
        "SSH library of fresh connections",
        "FLEET_SSH_ENGINE",
    ),
    "output_dir": Key(("directory",), _directory, "the training output dir on the nodes"),
    "launcher": Key(("launcher",), _launcher, "what `fleet launch` starts the job with"),
    "patterns": Key(("patterns",), _patterns, "training process patterns (cleanup, status)"),
    "port": Key(("port", "master_port"), _number(int, 1, 65535), "rendezvous port"),
    "grace": Key(("grace",), _number(float, 0, 600), "seconds between TERM and KILL"),
}
BUILT_IN: dict[str, str] = {
    "inventory": defaults.INVENTORY,
    "ssh_config": defaults.SSH_CONFIG,
    "log_dir": defaults.LOG_DIR,
    "host_keys": defaults.HOST_KEYS,
    "forks": str(defaults.FORKS),
    "workers": f"auto: one per core, each with at least {defaults.WORKER_MIN_HOSTS} hosts "
    f"({defaults.WORKER_MIN_HOSTS_PARAMIKO} through paramiko)",
    "connect_timeout": f"ssh config ConnectTimeout, else {defaults.CONNECT_TIMEOUT_S:g}",
    "persist": f"{defaults.PERSIST_S:g}",
    "ssh_engine": defaults.SSH_ENGINES[0],
    "output_dir": "inventory var output_dir",
    "launcher": f"inventory var launcher, else {defaults.LAUNCHER}",
    "patterns": ", ".join(defaults.PATTERNS),
    "port": str(defaults.PORT),
    "grace": f"{defaults.GRACE_S:g}",
}


@dataclass(frozen=True)
class Setting:
    """A key's effective value and where it came from ("env FLEET_X", "file:line", built-in)."""

    key: str
    value: Any
    source: str
    problem: str | None = None  # why the value is refused (one from the environment)


def user_file(env: Mapping[str, str]) -> Path:
    """$FLEET_CONFIG, else $XDG_CONFIG_HOME/fleet/config.yaml, else ~/.config/fleet/config.yaml."""
    if env.get("FLEET_CONFIG"):
        return userpath.expand(env["FLEET_CONFIG"], "FLEET_CONFIG=")
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "fleet" / "config.yaml"


def project_file(cwd: Path) -> Path | None:
    """The nearest fleet.yaml in `cwd` or one of its parents that passes fleet.core.trust's rule;
    one that does not is said on stderr and passed over, as if it were not there."""
    for directory in (cwd, *cwd.parents):
        candidate = directory / PROJECT_FILE
        if candidate.is_file():
            try:
                trust.check(candidate)
            except trust.Untrusted as exc:
                trust.warn(exc)
                continue
            return candidate
    return None


def _open_project(path: Path) -> BinaryIO:
    return trust.open_checked(path)


def _open_user(path: Path) -> BinaryIO:
    """The user file, checked as OpenSSH checks ~/.ssh/config: refused, not skipped."""
    try:
        return trust.open_checked(path, directories=False)
    except trust.Untrusted as exc:
        raise ConfigError(
            f"{path}: bad owner or permissions: {exc.reason}",
            hint=f"chown it to yourself and chmod go-w {path}, as ssh requires of ~/.ssh/config",
        ) from None


def _read(path: Path, found: Callable[[Path], BinaryIO] | None = None) -> dict[str, Setting]:
    """A config file's settings. `found`: how to open a file fleet found on its own (checked by
    fleet.core.trust); the paths such a file names must pass the rule too, or are left out.
    The YAML loader is imported here, not at the top: with no config file, no yaml is loaded."""
    from fleet.core.yamlfile import YamlFileError, load

    try:
        doc: YamlDoc = load(path, found)
    except trust.Untrusted as exc:
        trust.warn(exc)
        return {}
    except YamlFileError as exc:
        raise ConfigError(
            f"config {exc}", hint=exc.hint or "fix the file or move it away"
        ) from None
    if doc.data is None:
        return {}
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"{doc.at(())}: expected a mapping of settings",
            hint="e.g. `forks: 64` and `inventory: ./inventory.yaml`, one per line",
        )
    out: dict[str, Setting] = {}
    for raw_key, value in doc.data.items():
        line = f"{path}:{doc.lines.get((raw_key,), '?')}"
        if raw_key not in KEYS:
            # Only a name-like key is echoed: a stray line of another file may be a secret.
            name = raw_key if isinstance(raw_key, str) and _NAME.fullmatch(raw_key) else None
            raise ConfigError(
                f"{line}: unknown setting {repr(name) if name else '(not shown)'}",
                hint=f"known settings: {', '.join(KEYS)} (`fleet config` lists them)",
            )
        key = KEYS[raw_key]
        try:
            checked = key.check(value)
        except ValueError as exc:
            raise ConfigError(f"{line}: {raw_key}: {exc}", hint=f"{raw_key}: {key.help}") from None
        if key.relative:
            named = userpath.expand(checked, f"{line}: {raw_key}: ")
            checked = str((path.parent / named).resolve())
            if found is not None and not _named_path_trusted(raw_key, Path(checked)):
                continue
        out[raw_key] = Setting(raw_key, checked, line)
    return out


def _named_path_trusted(key: str, path: Path) -> bool:
    """A path a found config file names (an inventory, an ssh config with ProxyCommand, the
    run records -l @failed reads) obeys the same rule: else it is said and left out."""
    try:
        trust.check(path, label=f"{key}: {path}")
    except trust.Untrusted as exc:
        trust.warn(exc)
        return False
    return True


def load_settings(env: Mapping[str, str], cwd: Path) -> dict[str, Setting]:
    """The file-level settings: the project file's over the user file's."""
    settings: dict[str, Setting] = {}
    user = user_file(env)
    named = bool(env.get("FLEET_CONFIG"))
    if user.is_file():
        settings.update(_read(user, None if named else _open_user))
    elif named:
        raise ConfigError(
            f"FLEET_CONFIG names {user}, which is not a file",
            hint="point FLEET_CONFIG at a config file, or unset it",
        )
    project = project_file(cwd)
    if project is not None:
        settings.update(_read(project, _open_project))
    return settings


def effective(settings: Mapping[str, Setting], env: Mapping[str, str]) -> list[Setting]:
    """Every key's value with no flag given: env > project > user > built-in (`fleet config`)."""
    out = []
    for name, key in KEYS.items():
        if key.env and env.get(key.env):
            text = env[key.env]
            out.append(Setting(name, text, f"env {key.env}", _env_problem(key, text)))
        elif name in settings:
            out.append(settings[name])
        else:
            out.append(Setting(name, BUILT_IN[name], "built-in"))
    return out


def _env_problem(key: Key, text: str) -> str | None:
    """What is wrong with an environment variable's value, by the rule its option applies (a
    file's values are checked as they are read; the environment's only when a command uses them,
    so `fleet config` checks them here)."""
    try:
        key.check(key.from_env(text))
    except ValueError as exc:
        return str(exc)
    return None


def env_error(settings: list[Setting]) -> ConfigError | None:
    """The first setting whose environment variable holds a value its option refuses."""
    for s in settings:
        if s.problem is not None:
            name = s.source.removeprefix("env ")
            return ConfigError(
                f"{s.source}: {s.key}: {s.problem}, got {s.value!r}",
                hint=f"fix or unset {name} ({s.key}: {KEYS[s.key].help})",
            )
    return None


def default_map(settings: Mapping[str, Setting], group: Any) -> Defaults:
    """click's default_map for every command under `group` that has a parameter a setting sets.
    A subcommand's entry is worked out when click asks for it: only the verb that runs is
    loaded (fleet/cli/lazy.py)."""

    def walk(command: Any) -> Defaults:
        own: dict[str, Any] = {}
        params = {p.name: p for p in getattr(command, "params", ())}
        for name, setting in settings.items():
            for param in KEYS[name].params:
                if param in params:
                    # An option given several times (-i) takes a list of defaults.
                    multiple = getattr(params[param], "multiple", False)
                    value = setting.value
                    own[param] = [value] if multiple and not isinstance(value, list) else value
        subcommands = getattr(command, "commands", {})
        later = {name: (lambda name=name: walk(subcommands[name])) for name in subcommands}
        return Defaults(own, later)

    return walk(group)


def report(env: Mapping[str, str], cwd: Path, *, as_json: bool) -> tuple[list[str], list[Setting]]:
    """`fleet config`: the files read, then every key's effective value and its source, a value
    its option would refuse flagged (one JSON document with `as_json`); and the settings."""
    import json

    from fleet.core.safetext import clean

    settings = effective(resolve(env, cwd), env)
    user = user_file(env)
    project = project_file(cwd)
    if as_json:
        doc = {
            "user_file": str(user) if user.is_file() else None,
            "project_file": str(project) if project else None,
            "settings": {s.key: _json_setting(s) for s in settings},
        }
        return [json.dumps(doc, indent=2)], settings
    lines = [
        clean(f"user file:    {user}" + ("" if user.is_file() else "  (none)")),
        clean(f"project file: {project or '(none: no fleet.yaml here or above)'}"),
    ]
    width = max(len(s.key) for s in settings)
    for s in settings:
        value = ", ".join(map(str, s.value)) if isinstance(s.value, list) else str(s.value)
        flag = f"  (invalid: {s.problem})" if s.problem else ""
        lines.append(clean(f"{s.key.ljust(width)}  {value}  [{s.source}]{flag}"))
    return lines, settings


def _json_setting(s: Setting) -> dict[str, Any]:
    doc = {"value": s.value, "source": s.source}
    return doc if s.problem is None else {**doc, "problem": s.problem}


def resolve(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict[str, Setting]:
    """load_settings with the process's own environment and working directory; ConfigError
    when that directory was removed under the shell fleet was started from (every command but
    help and version stops there, app._defaults, rather than fail later on a relative path)."""
    if cwd is None:
        try:
            cwd = Path.cwd()
        except FileNotFoundError:
            raise ConfigError(
                "the current directory no longer exists (removed while this shell was in it)",
                hint="cd to a directory that exists, then run fleet again",
            ) from None
    return load_settings(os.environ if env is None else env, cwd)
