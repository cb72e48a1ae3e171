"""Shell text, built in one place: quoting, `${var}` templates and the remote wrapper.

Every value substituted into a command is quoted with `shlex.quote` unless the template says
`|raw`; the wrapper gives each remote command a deadline and a process group fleet can kill,
because closing an SSH channel does not stop the remote process (PITFALLS 11).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# `${name}`, `${name|raw}`, `${name|words}`, `${name|opt:--flag}`, `${name|default:x}`;
# `$${` writes a literal `${`.
_TEMPLATE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)((?:\|[^}|]*)*)\}")
_ANY_PLACEHOLDER = re.compile(r"\$\$\{|\$\{[^}]*\}?")
_FLAG = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_\-]*$")
PID_MARKER = "fleet-remote-pid "
HELPER_ENV = "FLEET_NODE_HELPER"  # marks fleet's own node-side processes (wrap(helper=True))
# With -K, a sudo step's stdin is: password line, this line, the script if any (see wrap()).
STDIN_FOLLOWS = "fleet-stdin-follows"
KILL_AFTER_S = 5


class UndefinedVariable(KeyError):
    """A template names a variable that is not defined."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


# sshd hands the command to the login shell as a C string: a NUL would cut it short there.
NO_NUL = "a shell command cannot carry one (it would end the command there)"


class BadTemplate(ValueError):
    """A template uses a filter fleet does not know, or a filter with a bad argument."""


def quote(value: Any) -> str:
    """Quote one value for POSIX sh; lists become space-separated quoted words."""
    if isinstance(value, (list, tuple)):
        return " ".join(quote(v) for v in value)
    return shlex.quote(to_text(value))


def to_text(value: Any) -> str:
    """Render a YAML scalar as the text an operator expects (true, not True)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, Mapping):
        # A mapping (a DeepSpeed config in the inventory) as JSON, which a node's tools read, not
        # as Python's repr ({'a': 1}, with quotes no parser takes).
        import json

        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=to_text)
        except (TypeError, ValueError):  # a key no JSON has (a YAML complex key)
            return str(value)
    if isinstance(value, float):
        # Never scientific notation (1e-05): node-side tools want plain decimals.
        import decimal  # here: a float in a playbook is rare, the module costs ~1.5 ms

        text = format(decimal.Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


def split_words(name: str, value: Any) -> list[str]:
    """A string's shell words (`a 'b c'` -> ["a", "b c"]); a list's items are its words."""
    if isinstance(value, (list, tuple)):
        return [to_text(v) for v in value]
    try:
        return shlex.split(to_text(value))
    except ValueError as exc:
        raise BadTemplate(f"'{name}' = {value!r} is not valid shell words: {exc}") from None


def _truthy(value: Any) -> bool:
    """YAML and --var booleans: true/yes/1/on are true."""
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "1", "on", "y"}
    return bool(value)


def _check_filters(name: str, filters: Sequence[str]) -> str | None:
    """Validate every filter of a placeholder; return its output filter (raw/opt/flag), if any."""
    output: str | None = None
    for f in filters:
        kind, _, arg = f.partition(":")
        if kind in ("opt", "flag") and not _FLAG.match(arg):
            raise BadTemplate(f"'${{{name}|{f}}}': '{arg}' is not a plain --flag")
        if f in ("raw", "words") or kind in ("opt", "flag"):
            if output is not None:
                raise BadTemplate(f"'${{{name}}}': '{output}' and '{f}' cannot be combined")
            output = f
        elif kind != "default":
            raise BadTemplate(
                f"'${{{name}|{f}}}': unknown filter '{f}' "
                "(known: raw, words, opt:FLAG, flag:FLAG, default:X)"
            )
    return output


def _apply(name: str, value: Any, filters: Sequence[str]) -> str:
    """Apply the filters of one `${name|...}` occurrence; quoting is the default."""
    output = _check_filters(name, filters)
    if isinstance(value, Mapping):  # inventory `env: {NCCL_DEBUG: INFO}` -> NCCL_DEBUG=INFO
        value = [f"{k}={to_text(v)}" for k, v in value.items()]
    items = value if isinstance(value, (list, tuple)) else [value]
    if output == "raw":
        return " ".join(to_text(v) for v in items)
    if output == "words":
        # A command given as one string (`python -m torch.distributed.run`) or as a list: split
        # like the shell would, then every word quoted again.
        return " ".join(quote(w) for w in split_words(name, value))
    if output is not None and output.startswith("opt:"):
        # An empty or missing value means "option not given": `${container|opt:--container}`.
        given = [v for v in items if v is not None and v != ""]
        return " ".join(f"{output[4:]} {quote(v)}" for v in given)
    if output is not None and output.startswith("flag:"):
        return output[5:] if _truthy(value) else ""
    return quote(value)


def render(template: str, variables: Mapping[str, Any]) -> str:
    """Fill `${var}` placeholders, quoting each value; raise UndefinedVariable for the first gap.

    A `${` that is not a well-formed placeholder is refused rather than passed to the node's shell
    (where `${port:-1}` would silently expand from the remote environment); `$${` is a literal.
    """
    if "\0" in template:
        raise BadTemplate(f"the command holds a NUL byte: {NO_NUL}")
    for match in _ANY_PLACEHOLDER.finditer(template):
        if match.group(0) != "$${" and not _TEMPLATE.fullmatch(match.group(0)):
            raise BadTemplate(
                f"malformed placeholder '{match.group(0)}': write ${{name}}, ${{name|filter}}, "
                "or $${ for a literal ${"
            )

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        filters = [f for f in match.group(2).split("|") if f]
        if name not in variables:
            defaults = [f[8:] for f in filters if f.startswith("default:")]
            if not defaults:
                _check_filters(name, filters)
                raise UndefinedVariable(name)
            return _apply(name, defaults[0], filters)
        text = _apply(name, variables[name], filters)
        if "\0" in text:
            raise BadTemplate(f"'{name}' holds a NUL byte: {NO_NUL}")
        return text

    return _TEMPLATE.sub(sub, template)


_HEREDOC = re.compile(r"<<(-?)[ \t]*([^\s;&|<>()]+)")


def _exposed(match: re.Match[str]) -> bool:
    """A placeholder whose text is quoted for a plain shell word (all but |raw and |flag)."""
    if not match.group(1):  # $${
        return False
    filters = [f for f in match.group(2).split("|") if f]
    return not any(f == "raw" or f.startswith("flag:") for f in filters)


def quoted_placeholder(template: str) -> str | None:
    """The first placeholder written where fleet's quoting does not hold, else None: inside
    double quotes (`"${x}"` gives `"'...'"`, and a `$(...)` in the value runs) or in the body of
    a here-document that expands (`<<EOF`, where quotes mean nothing and `$(...)` runs too).

    A small scan of POSIX sh quoting: '...', "...", backslashes, `$(...)` and backquotes (which
    start a fresh context, even inside double quotes), comments and here-documents."""
    stack = [""]  # "": plain words; '"': double quotes; "(" / "`": a command substitution
    pending: list[tuple[str, bool, bool]] = []  # here-documents: (delimiter, strip tabs, expands)
    i, n = 0, len(template)
    while i < n:
        c, top = template[i], stack[-1]
        placeholder = _TEMPLATE.match(template, i)
        if placeholder is not None:
            if top == '"' and _exposed(placeholder):
                return placeholder.group(1)
            i = placeholder.end()
            continue
        if c == "\\":
            i += 2
            continue
        if template.startswith("$(", i):
            stack.append("(")
            i += 2
            continue
        if c == "`":
            stack.pop() if top == "`" else stack.append("`")
        elif top == '"':
            if c == '"':
                stack.pop()
        elif c == "'":
            end = template.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        elif c == '"':
            stack.append('"')
        elif c == ")" and top == "(":
            stack.pop()
        elif c == "#" and (i == 0 or template[i - 1] in " \t\n;&|("):
            end = template.find("\n", i)
            i = n if end < 0 else end
            continue
        elif (heredoc := _HEREDOC.match(template, i)) is not None:
            word = heredoc.group(2)
            plain = not any(q in word for q in "'\"\\")
            pending.append((re.sub(r"['\"\\]", "", word), heredoc.group(1) == "-", plain))
            i = heredoc.end()
            continue
        elif c == "\n" and pending:
            i, name = _bodies(template, i + 1, pending)
            if name is not None:
                return name
            pending = []
            continue
        i += 1
    return None


def _bodies(template: str, i: int, pending: list[tuple[str, bool, bool]]) -> tuple[int, str | None]:
    """Skip the here-document bodies that start at `i`; the first exposed placeholder in one
    that expands, if any, and where the text goes on."""
    for delimiter, strip, expands in pending:
        while i < len(template):
            end = template.find("\n", i)
            end = len(template) if end < 0 else end
            line = template[i:end]
            i = end + 1
            if (line.lstrip("\t") if strip else line) == delimiter:
                break
            for found in _TEMPLATE.finditer(line) if expands else ():
                if _exposed(found):
                    return i, found.group(1)
    return i, None


def names_in(template: str) -> list[str]:
    """Variable names a template refers to, in order (for validation before any connection)."""
    return [m.group(1) for m in _TEMPLATE.finditer(template) if m.group(1)]


@dataclass(frozen=True)
class Cmd:
    """One remote command, fully rendered: what is sent, what is fed on stdin, what is shown."""

    command: str  # the exact text given to the remote shell
    display: str  # what --dry-run and logs show (the same command; scripts named, not inlined)
    stdin: str | None = None  # script text fed on stdin (for `script:` steps)
    timeout_s: float | None = None
    sudo: bool = False
    helper: bool = False  # wrapped with wrap(helper=True): its frame is marked too (framed)


def wrap(
    body: str,
    *,
    sudo: bool,
    timeout_s: float | None,
    script: bool,
    password_on_stdin: bool = False,
    helper: bool = False,
) -> str:
    """The remote wrapper around a rendered step.

    It prints its own pid first (so fleet can stop the whole process group on cancel), then execs
    `timeout`, which runs the step in its own process group and kills that group on expiry: a
    step's deadline is enforced on the node, not only by closing the channel.

    `helper`: mark every process of the command, the wrapper, timeout, sudo and the shell, with
    HELPER_ENV in its environment (exported before the exec, and set again after sudo, which
    resets the environment). A cleanup on the node then knows them as fleet's own, though their
    argv holds its patterns (fleet/node/decide.py). Never for a step that starts a job.
    """
    inner = f"sh -s -- {body}".rstrip() if script else f"sh -c {shlex.quote(body)}"
    if sudo and password_on_stdin:
        # With -K the transport sends the password line, then STDIN_FOLLOWS, then the script (if
        # any). sudo reads the password line only when it asks for one: with NOPASSWD, or when
        # already root, the line is still there and must never reach the step (a script's shell
        # would run it as a command and print it). So skip up to the STDIN_FOLLOWS line.
        skip = f'IFS= read -r l || :; [ "$l" = {STDIN_FOLLOWS} ] || IFS= read -r l || :; exec "$@"'
        inner = f"sh -c {shlex.quote(skip)} sh {inner}"
    if timeout_s:
        inner = f"timeout -k {KILL_AFTER_S} {_seconds(timeout_s)} {inner}"
    marker = f"printf '{PID_MARKER}%s\\n' \"$$\" >&2"
    if helper:
        inner = f"env {HELPER_ENV}=1 {inner}"
        marker = f"{HELPER_ENV}=1; export {HELPER_ENV}; {marker}"
    if not sudo:
        return f"{marker}; exec {inner}"
    # Already root (common in containers, where sudo may not even exist): run it directly.
    as_user = f"{_SUDO_ONCE} {inner}" if password_on_stdin else f"exec sudo -n -- {inner}"
    return f'{marker}; if [ "$(id -u)" = 0 ]; then exec {inner}; else {as_user}; fi'


# With -K, as a non-root user: sudo -S reads a password line again after a wrong one (up to
# passwd_tries), and on the step's stdin the next lines are STDIN_FOLLOWS and the script: a
# mistyped password would be tried three times on every node (pam_faillock's usual deny=3 locks
# the account) with a script line among them. So the password is checked once first, by a sudo
# whose stdin holds that line alone; then the step's sudo gets the usual stdin again (password
# line, STDIN_FOLLOWS, the rest through cat), which it reads from only when it still asks.
# printf is a builtin: the password is in no argv.
_SUDO_ONCE = (
    "IFS= read -r p || p=; IFS= read -r l || :; "
    "printf '%s\\n' \"$p\" | sudo -S -p '' -v || exit; "
    f"{{ printf '%s\\n%s\\n' \"$p\" {STDIN_FOLLOWS}; exec cat; }} | exec sudo -S -p '' --"
)


# The first line of a framed command's stdin, when it has one (see framed).
STDIN_MARK = "fleet-stdin"
# Exit statuses 128+N of the signals that end a process by default (Linux numbering): the frame
# dies of the same one, so sshd reports the signal as the step's own death would have.
FATAL_STATUSES = "129|13[0-9]|14[0-4]|15[2-5]|15[7-9]"


def framed(command: str, token: str, *, helper: bool, stdin_mark: bool) -> str:
    """`command` (a wrap() result) as sent: framed so that only its output is read as such.

    The login shell (whatever it is: bash, zsh, dash, busybox sh) only parses one `exec`; the
    frame runs in a plain `sh -c`, which reads no rc file. It prints fleet.core.frame's start line
    on both streams, runs `command` in a subshell (its `$$` is still the frame's, the session
    leader the wrapper reports and fleet's kill finds), prints the end lines and exits as the
    command did (dying of its signal, so sshd reports that). `helper` marks the frame like the
    command (wrap(helper=True)): it outlives the exec, and its argv holds the same patterns.

    `stdin_mark`: the transport sends `fleet-stdin TOKEN` as the first line of stdin; a login
    shell whose rc file read stdin ate it (and with it the start of a script fed there), so the
    frame says so (fleet.core.frame.STDIN_LOST) and runs nothing.
    """
    from fleet.core.frame import BEGIN, END, STDIN_LOST, marker

    begin, end = quote(marker(token, BEGIN)), quote(marker(token, END))
    lines = [f"printf '\\n%s\\n' {begin}; printf '\\n%s\\n' {begin} >&2"]
    if stdin_mark:
        lines.append(
            f'IFS= read -r l || l=; if [ "$l" != {quote(f"{STDIN_MARK} {token}")} ]; then '
            f"printf '\\n%s\\n' {quote(marker(token, STDIN_LOST))}; "
            f"printf '\\n%s\\n' {end}; printf '\\n%s\\n' {end} >&2; exit 125; fi"
        )
    lines += [
        "(",
        command,
        ")",
        "s=$?",
        f"printf '\\n%s %s\\n' {end} \"$s\"; printf '\\n%s\\n' {end} >&2",
        f"case $s in {FATAL_STATUSES}) ulimit -c 0 2>/dev/null; kill -$((s - 128)) $$ ;; esac",
        'exit "$s"',
    ]
    mark = f"env {HELPER_ENV}=1 " if helper else ""
    return f"exec {mark}sh -c {shlex.quote(chr(10).join(lines))}"


# sshd hands a command to the login shell as one argument (`$SHELL -c COMMAND`), and Linux
# takes none longer than MAX_ARG_STRLEN (128 KiB with its NUL): a longer one never starts.
COMMAND_MAX_BYTES = 131071
ONE_ARGUMENT = "a node's shell takes at most {limit} in one argument"


class CommandTooLong(ValueError):
    """A framed command longer than what can carry it to the node: never sent, the step fails."""


def check_length(command: str, limit: int, carrier: str) -> str:
    """`command` (a framed() result) if it is at most `limit` bytes, else CommandTooLong saying
    what takes no more (`carrier`, with `{limit}`). Sent, it would fail as a lost connection
    (libssh2 refuses the request) or as a login shell that ran nothing (E2BIG): neither is
    what happened."""
    size = len(command.encode())
    if size <= limit:
        return command
    raise CommandTooLong(
        f"the command is {size} bytes as sent; {carrier.format(limit=limit)}: put it in a "
        "playbook step's `script:` file, which goes to the node on stdin"
    )


# The shortest deadline written for `timeout`: its text has millisecond places, and `timeout 0`
# (what 0.0001 printed as) means no limit at all. A shorter one is still enforced, as 1 ms.
TIMEOUT_MIN_S = 0.001


def _seconds(value: float) -> str:
    """`timeout` accepts fractional seconds; keep integers clean; never write a positive one
    as 0, which `timeout` reads as none."""
    if float(value).is_integer():
        return str(int(value))
    return f"{max(value, TIMEOUT_MIN_S):.3f}"


# What the kill script prints last: how it ended (see kill_command).
KILL_REPORT = "fleet-kill: "
KILL_GONE = "gone"  # nothing of the command was left to signal
KILL_STOPPED = "stopped"  # TERM or KILL ended all of it


def kill_command(pid: int, grace_s: float = 5.0) -> str:
    """A script that stops a wrapped command and everything it started: TERM, a grace period,
    KILL; it exits 0 only when none of them is left, and says why not otherwise.

    Run it with the privileges of the step it stops (`wrap(..., sudo=...)`, fed the sudo password
    the same way): a plain user's kill cannot reach a step that sudo made root, and `sudo -n`
    cannot either when sudo wants a password. The targets are the processes of the wrapper's
    session: sshd makes the wrapper (`pid`) a session leader, and everything the step starts stays
    in that session unless it detaches on purpose (setsid: a launched run); `timeout` and sudo
    each move the step into a process group of its own, which a group kill of `pid` would miss.
    Zombies count as gone. The last line is `fleet-kill: gone`, `fleet-kill: stopped by TERM|KILL`
    or `fleet-kill: left pids ... (the kill's error)`.
    """
    polls = max(1, int(grace_s / 0.2))
    return f"""LC_ALL=C; export LC_ALL; s={int(pid)}; nl='
'
members() {{
    all=$(cat /proc/[0-9]*/stat 2>/dev/null); out=; set -f; IFS=$nl
    for l in $all; do
        IFS=' '; set -- ${{l##*) }}; IFS=$nl
        if [ "$4" = "$s" ] && [ "$1" != Z ]; then out="$out ${{l%% *}}"; fi
    done
    IFS=' '; set +f; printf '%s' "$out"
}}
m=$(members)
if [ -z "$m" ]; then echo '{KILL_REPORT}{KILL_GONE}'; exit 0; fi
kill -TERM $m 2>/dev/null; kill -CONT $m 2>/dev/null
i=0; while [ $i -lt {polls} ]; do
    sleep 0.2; m=$(members)
    if [ -z "$m" ]; then echo '{KILL_REPORT}{KILL_STOPPED} by TERM'; exit 0; fi
    i=$((i+1))
done
err=$(kill -KILL $m 2>&1 | head -n 1)
i=0; while [ $i -lt 25 ]; do
    sleep 0.2; m=$(members)
    if [ -z "$m" ]; then echo '{KILL_REPORT}{KILL_STOPPED} by KILL'; exit 0; fi
    i=$((i+1))
done
echo "{KILL_REPORT}left pids$m${{err:+ ($err)}}"; exit 1
"""
