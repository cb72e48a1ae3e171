"""Playbooks: named lists of steps as data (`playbooks/*.yaml`), parsed and validated up front."""

from __future__ import annotations

import enum
import functools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.core import userpath
from fleet.core.errors import PlaybookError
from fleet.core.shell import BadTemplate, quoted_placeholder, render
from fleet.core.yamlfile import YamlDoc, YamlFileError, load, shown

_PLAYBOOK_KEYS = frozenset({"name", "description", "vars", "steps", "confirm"})
_STEP_KEYS = frozenset({"name", "run", "script", "op", "sudo", "timeout", "on_error", "helper"})
OPS = frozenset({"cleanup", "preflight", "kill-docker"})  # Python per host (fleet/node/ops.py)
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9_.\-/]+$")


class OnError(enum.StrEnum):
    """What a host does after one of its steps fails."""

    STOP = "stop"
    CONTINUE = "continue"


@dataclass(frozen=True)
class Step:
    """One step: a shell template (or a shipped script and its argument template)."""

    name: str
    run: str
    script: str | None = None  # script text fed on stdin; `run` is then its argument list
    script_name: str | None = None
    op: str | None = None  # an op run per host instead of a command (`run` is then empty)
    helper: bool = False  # marked as fleet's own on the node (shell.wrap(helper=True))
    sudo: bool = False
    timeout_s: float | None = None
    on_error: OnError = OnError.STOP
    line: int | None = None  # of its `run` (else of the step) in the file, for plan-time errors


@dataclass(frozen=True)
class Playbook:
    """A parsed playbook: where it came from, its default vars and steps."""

    name: str
    path: Path
    description: str = ""
    vars: Mapping[str, Any] = field(default_factory=dict)
    steps: tuple[Step, ...] = ()
    confirm: bool = False  # destructive: ask before running on more than one host


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # fleet/ (this is fleet/core/playbook.py)


def builtin_dir() -> Path:
    """Where the shipped playbooks live: fleet/playbooks when installed (package data mapped
    from the top-level playbooks/), ./playbooks in a source checkout or editable install."""
    here = PACKAGE_DIR
    installed = here / "playbooks"
    return installed if installed.is_dir() else here.parent / "playbooks"


def remote_dir() -> Path:
    """Where the shipped node-side scripts live."""
    return PACKAGE_DIR / "remote"


def builtin_names() -> list[str]:
    """Names of the shipped playbooks, for hints and `fleet playbooks`."""
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def is_path(argument: str) -> bool:
    """A playbook argument names a file when the operator wrote a path: it has a `/` (`./status`,
    `books/x`, `~/x`) or ends in .yaml/.yml. A bare name (`status`) is a shipped playbook, never a
    file of that name in the current directory, which anyone who can write there could plant."""
    return "/" in argument or argument.endswith((".yaml", ".yml"))


def shipped_path(name: str) -> Path | None:
    """A shipped playbook's file by its name, if fleet ships one of that name."""
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        return None
    path = builtin_dir() / f"{name}.yaml"
    return path if path.is_file() else None


def resolve(name_or_path: str) -> Path:
    """The file a playbook argument names (fleet.core.playbook.is_path), else the shipped one."""
    if is_path(name_or_path):
        candidate = userpath.expand(name_or_path, "playbook ")
        if candidate.is_file():
            return candidate
        raise PlaybookError(
            f"playbook '{name_or_path}': no such file",
            hint="check the path; a shipped playbook is named without a path: "
            + ", ".join(builtin_names()),
        )
    shipped = shipped_path(name_or_path)
    if shipped is not None:
        return shipped
    raise PlaybookError(
        f"playbook '{name_or_path}': no shipped playbook of that name",
        hint=f"shipped: {', '.join(builtin_names())}; a file of yours: ./{name_or_path}",
    )


def _shown(value: Any) -> str:
    """A value for a message: itself when it looks like a name or number, else only its kind
    (the file may not be a playbook at all: `fleet run /etc/shadow` must not print a hash)."""
    if isinstance(value, float):  # a number is no secret: as YAML spells it (`.nan`, `.inf`)
        if math.isnan(value):
            return ".nan"
        return (".inf" if value > 0 else "-.inf") if math.isinf(value) else f"{value:g}"
    text = shown(value)
    if text is not None:
        return repr(value) if isinstance(value, str) else text
    kinds = {str: "a string", list: "a list", dict: "a mapping", type(None): "nothing"}
    return kinds.get(type(value), type(value).__name__)


def _fail(doc: YamlDoc, where: tuple[str | int, ...], message: str, hint: str) -> PlaybookError:
    """An error pointing at a place in the playbook file."""
    return PlaybookError(f"{doc.at(where)}: {message}", hint=hint)


class ScriptOutside(ValueError):
    """A script (or a script it includes) that would be read from outside its directory."""


class ScriptUnreadable(ValueError):
    """A script (or a script it includes) that cannot be read as UTF-8 text."""


def _script(doc: YamlDoc, where: tuple[str | int, ...], name: Any) -> tuple[str, str]:
    """Find a step's script beside the playbook, else among fleet's own; return (name, text)."""
    if not isinstance(name, str) or not _SCRIPT_NAME.match(name):
        raise _fail(
            doc, where, f"script must be a file name, got {_shown(name)}", "e.g. script: my-step.sh"
        )
    try:
        path = _find_script(doc.path.parent, name)
        if path is not None:
            return name, _with_includes(path, doc.path.parent, ())
    except ScriptOutside as exc:
        raise _fail(
            doc,
            where,
            str(exc),
            "a playbook sends only scripts in its own directory (no absolute path, `..` or "
            "symlink leading out): copy the script there",
        ) from None
    except ScriptUnreadable as exc:
        raise _fail(
            doc, where, str(exc), "a script is a text file (UTF-8) that fleet can read"
        ) from None
    except ValueError as exc:
        raise _fail(
            doc, where, str(exc), "see `# fleet:include NAME as VAR` in docs/reference/playbooks.md"
        ) from None
    raise _fail(
        doc,
        where,
        f"script '{name}' not found beside the playbook or among fleet's own",
        "put the script next to the playbook file",
    )


_INCLUDE = re.compile(r"^# fleet:include ([A-Za-z0-9_.\-]+) as ([A-Z_][A-Z0-9_]*)\s*$")
_SOURCE = re.compile(r"^# fleet:source ([A-Za-z0-9_.\-]+)\s*$")
_INCLUDE_END = "FLEET_INCLUDE_END_7f3a"


def _find_script(base: Path, name: str) -> Path | None:
    """A script beside the playbook wins over fleet's shipped one of the same name. Either is
    taken only when its resolved path stays inside its directory: `script:` must not send
    /root/.ssh/id_rsa (or a symlink to it) to every node and into the run record."""
    for directory in (base, remote_dir()):
        path = directory / name
        if not os.path.lexists(path):
            continue
        real, inside = os.path.realpath(path), os.path.realpath(directory)
        if os.path.commonpath([real, inside]) != inside or real == inside:
            raise ScriptOutside(f"script '{name}' leads outside {directory}")
        if os.path.isfile(real):
            return Path(real)
    return None


def _with_includes(path: Path, base: Path, seen: tuple[str, ...]) -> str:
    """Expand a script's two include forms, recursively:

    `# fleet:source lib.sh` puts lib.sh's text in place of the line, as if the script had sourced
    it: shared shell helpers are written once (fleet/remote/lib.sh) and every script that needs
    them still travels as one stdin stream. A file is put in at most once per script.

    `# fleet:include other.sh as VAR` becomes `VAR=<text of other.sh>`: a node-side script
    sometimes has to hand another script to a shell it cannot reach by file, such as
    `docker exec -i CONTAINER sh -s`.
    """
    return _expand(path, base, seen, set())


def _expand(path: Path, base: Path, seen: tuple[str, ...], sourced: set[str]) -> str:
    if path.name in seen:
        raise ValueError(f"script include loop: {' -> '.join((*seen, path.name))}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ScriptUnreadable(
            f"script '{path.name}' is not UTF-8 text (invalid byte at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ScriptUnreadable(
            f"script '{path.name}' cannot be read: {exc.strerror or type(exc).__name__}"
        ) from None
    out: list[str] = []
    for line in text.splitlines():
        source, include = _SOURCE.match(line), _INCLUDE.match(line)
        match = source or include
        if match is None:
            out.append(line)
            continue
        try:
            other = _find_script(base, match.group(1))
        except ScriptOutside as exc:
            raise ScriptOutside(f"{path.name}: included {exc}") from None
        if other is None:
            raise ValueError(f"{path.name}: included script '{match.group(1)}' not found")
        if source is not None:
            if other.name not in sourced:
                sourced.add(other.name)
                out.append(_expand(other, base, (*seen, path.name), sourced).rstrip("\n"))
            continue
        text = _expand(other, base, (*seen, path.name), set())
        if _INCLUDE_END in text:
            raise ValueError(f"{other.name} contains the include delimiter")
        out.append(f"{match.group(2)}=$(cat <<'{_INCLUDE_END}'\n{text}\n{_INCLUDE_END}\n)")
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=16)
def shipped_script(name: str) -> str:
    """The text of one of fleet's own node-side scripts, includes expanded, as fleet sends it."""
    path = remote_dir() / name
    try:
        return _with_includes(path, remote_dir(), ())
    except (OSError, ValueError) as exc:
        raise PlaybookError(
            f"fleet's node-side script {name}: {exc}", hint="reinstall fleet"
        ) from None


def _timeout(doc: YamlDoc, where: tuple[str | int, ...], value: Any) -> float | None:
    """A step timeout in seconds: a positive finite number, or null for none (`.nan` passed a
    `<= 0` test and failed only on the nodes; `.inf` is not "none": null is)."""
    if value is None:
        return None
    seconds = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past a float's range: out of range, as .inf is
            seconds = math.inf
    if not 0 < seconds < math.inf:
        raise _fail(
            doc,
            where,
            f"timeout must be a positive number of seconds, got {_shown(value)}",
            "e.g. timeout: 60 (or 0.5); no timeout: leave it out",
        )
    return seconds


def _step(doc: YamlDoc, index: int, raw: Any) -> Step:
    """Validate one step mapping."""
    where: tuple[str | int, ...] = ("steps", index)
    if not isinstance(raw, dict):
        raise _fail(
            doc,
            where,
            "a step must be a mapping with at least 'name' and 'run'",
            "e.g. - {name: show gpus, run: nvidia-smi}",
        )
    unknown = sorted(str(k) for k in raw if k not in _STEP_KEYS)
    if unknown:
        raise _fail(
            doc,
            (*where, unknown[0]),
            "unknown key" + (f" {_shown(unknown[0])}" if shown(unknown[0]) else ""),
            "a step may have: " + ", ".join(sorted(_STEP_KEYS)),
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _fail(doc, where, "every step needs a 'name' (a non-empty string)", "add name: ...")
    script_name, script_text = (None, None)
    op = raw.get("op")
    # isinstance first: a list or mapping is not hashable, and `in` a set would raise on it.
    if "op" in raw and (
        not isinstance(op, str) or op not in OPS or "run" in raw or "script" in raw
    ):
        raise _fail(
            doc,
            (*where, "op"),
            f"op must be one of {', '.join(sorted(OPS))}, without run or script; got {_shown(op)}",
            "op: cleanup (its vars: see playbooks/cleanup.yaml)",
        )
    if "script" in raw:
        script_name, script_text = _script(doc, (*where, "script"), raw["script"])
    run = raw.get("run", "" if script_name or op else None)
    if not isinstance(run, str) or (not run.strip() and not script_name and not op):
        raise _fail(
            doc,
            (*where, "run"),
            f"step '{name}' needs 'run': a shell command string",
            "e.g. run: nvidia-smi",
        )
    try:
        render(run, _Probe())
    except BadTemplate as exc:
        raise _fail(
            doc, (*where, "run"), str(exc), "see docs/reference/playbooks.md: templates"
        ) from None
    exposed = quoted_placeholder(run)
    if exposed is not None:
        raise _fail(
            doc,
            (*where, "run"),
            f"'${{{exposed}}}' is inside double quotes or a here-document: there fleet's quoting "
            "does not hold (a value holding $(...) would run)",
            f"write it as a word of its own (fleet quotes it): echo x=${{{exposed}}}; text "
            "with values for a file: printf or a script: step; trusted shell text: |raw",
        )
    sudo = raw.get("sudo", False)
    if not isinstance(sudo, bool):
        raise _fail(
            doc, (*where, "sudo"), f"sudo must be true or false, got {_shown(sudo)}", "sudo: true"
        )
    helper = raw.get("helper", False)
    if not isinstance(helper, bool):
        raise _fail(
            doc,
            (*where, "helper"),
            f"helper must be true or false, got {_shown(helper)}",
            "helper: true marks a look-only step as fleet's own (never one that starts a job)",
        )
    on_error = raw.get("on_error", "stop")
    if not isinstance(on_error, str) or on_error not in {e.value for e in OnError}:
        raise _fail(
            doc,
            (*where, "on_error"),
            f"on_error must be stop or continue, got {_shown(on_error)}",
            "on_error: continue lets later steps run after this one fails",
        )
    return Step(
        name=name.strip(),
        run=run,
        script=script_text,
        script_name=script_name,
        op=op,
        helper=helper,
        sudo=sudo,
        timeout_s=_timeout(doc, (*where, "timeout"), raw.get("timeout")),
        on_error=OnError(on_error),
        line=doc.lines.get((*where, "run")) or doc.lines.get(where),
    )


class _Probe(dict[str, Any]):
    """A mapping that defines every name, so templates can be syntax-checked without values."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return "x"


def parse(doc: YamlDoc) -> Playbook:
    """Build a Playbook from YAML, failing on the first problem with file, place and hint."""
    data = doc.data
    if not isinstance(data, dict):
        raise PlaybookError(
            f"{doc.path}: a playbook must be a mapping with 'name' and 'steps'",
            hint="see playbooks/cleanup.yaml for the shape",
        )
    unknown = sorted(str(k) for k in data if k not in _PLAYBOOK_KEYS)
    if unknown:
        raise _fail(
            doc,
            (unknown[0],),
            "unknown key" + (f" {_shown(unknown[0])}" if shown(unknown[0]) else ""),
            "a playbook may have: " + ", ".join(sorted(_PLAYBOOK_KEYS)),
        )
    name = data.get("name", doc.path.stem)
    if not isinstance(name, str) or not name.strip():
        raise _fail(doc, ("name",), "name must be a non-empty string", "name: cleanup")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _fail(doc, ("description",), "description must be a string", "quote it")
    defaults = data.get("vars") or {}
    if not isinstance(defaults, dict):
        raise _fail(doc, ("vars",), "vars must be a mapping of name: value", "vars: {port: 39500}")
    for key in defaults:
        if not isinstance(key, str) or not _VAR_NAME.match(key):
            raise _fail(
                doc,
                ("vars", key),
                f"{_shown(key)} is not a valid variable name",
                "use letters, digits and _",
            )
    steps_raw = data.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise _fail(
            doc, ("steps",), "steps must be a non-empty list", "steps: [{name: ..., run: ...}]"
        )
    confirm = data.get("confirm", False)
    if not isinstance(confirm, bool):
        raise _fail(doc, ("confirm",), "confirm must be true or false", "confirm: true")
    steps = tuple(_step(doc, i, raw) for i, raw in enumerate(steps_raw))
    return Playbook(
        name=name.strip(),
        path=doc.path,
        description=description.strip(),
        vars=dict(defaults),
        steps=steps,
        confirm=confirm,
    )


def load_shipped(name: str) -> Playbook:
    """A verb's own playbook: always the shipped one, whatever the working directory holds."""
    path = shipped_path(name)
    if path is None:
        raise PlaybookError(f"fleet's playbook '{name}' is missing", hint="reinstall fleet")
    return _load(path)


def load_playbook(name_or_path: str | Path) -> Playbook:
    """Resolve (a path the operator wrote, else a shipped name), read and validate a playbook.
    A Path is a file, as named."""
    return _load(name_or_path if isinstance(name_or_path, Path) else resolve(name_or_path))


def _load(path: Path) -> Playbook:
    """Read and validate the playbook at `path`."""
    try:
        doc = load(path)
    except YamlFileError as exc:
        raise PlaybookError(str(exc), hint=exc.hint or "fix the YAML at that line") from None
    return parse(doc)


def adhoc(command: str, *, sudo: bool, timeout_s: float | None) -> Playbook:
    """The one-step playbook behind `fleet exec 'CMD'` (the operator's shell text, as is)."""
    return Playbook(
        name="exec",
        path=Path("<exec>"),
        description="ad-hoc command",
        steps=(
            Step(name="exec", run=command.replace("${", "$${"), sudo=sudo, timeout_s=timeout_s),
        ),
    )
