"""The frame around what fleet's own command prints on a node, and its parser.

sshd runs every command through the login user's shell (`$SHELL -c COMMAND`), and that shell may
talk before fleet's command starts: bash sources ~/.bashrc over ssh, zsh ~/.zshenv, sshd runs
~/.ssh/rc through it; a banner, a `conda activate` message, an `echo Welcome`, on either stream.
So the command fleet sends (fleet.core.shell.framed) prints a start line and an end line on both
streams, each holding a random token fleet made for that one command: only what comes between
them is the command's output. What comes before the start is the login shell's noise, kept as a
bounded sample for one warning per host and never parsed. What comes after the end is no login
shell's: the command ended, and something it left running in the background still writes to its
output; that is kept apart (Noise.late_lines), bounded and never parsed too. A report that never
started (the login shell exited first, or is no shell at all) or never ended (cut short) is a
per-host failure, not a success with missing lines.

A frame line is the token's line with a newline printed before it, so it starts a line of its
own whether or not the output before it ended with one; that one extra empty line before the end
line is the frame's, not the command's, and is dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TAG = "fleet-frame"
BEGIN = "begin"
END = "end"
STDIN_LOST = "stdin-lost"  # the command's stdin did not start with fleet's mark (see shell.framed)
NOISE_KEEP_LINES = 5  # of the login shell's lines, kept for the warning
NOISE_LINE_MAX_CHARS = 200
STREAMS = ("stdout", "stderr")


def new_token() -> str:
    """A fresh token for one command: 128 random bits, so no banner prints it by chance."""
    return os.urandom(16).hex()  # what secrets.token_hex does, without its imports


def marker(token: str, word: str) -> str:
    """A frame line: `fleet-frame TOKEN begin`."""
    return f"{TAG} {token} {word}"


@dataclass(frozen=True)
class Noise:
    """What came outside the frame: a few lines and how many there were. `lines`/`count`: the
    login shell's, before the start; `late_lines`/`late_count`: after the end, from something
    the command left running (a background child still writing)."""

    lines: tuple[str, ...] = ()
    count: int = 0
    late_lines: tuple[str, ...] = ()
    late_count: int = 0


class _Sample:
    """Lines outside the frame: how many (blank ones not counted), and the first few, cut."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def add(self, line: str) -> None:
        if not line.strip():
            return
        self.count += 1
        if len(self.lines) < NOISE_KEEP_LINES:
            self.lines.append(line[:NOISE_LINE_MAX_CHARS])


class _Stream:
    """One stream's place in the frame: before it, inside, or after it."""

    def __init__(self) -> None:
        self.state = "before"
        self.held_empty = False  # an empty line inside: the frame's own, if the end comes next


class Frame:
    """Splits one command's lines into its own output and the login shell's noise.

    Line by line, as they arrive: `take` returns the lines that are the command's (in order, so
    output still streams live). Memory is bounded: NOISE_KEEP_LINES lines of noise are kept.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.begin = marker(token, BEGIN)
        self.end = marker(token, END)
        self.lost = marker(token, STDIN_LOST)
        self.streams = {name: _Stream() for name in STREAMS}
        self.before = _Sample()  # the login shell's noise, before the start line
        self.late = _Sample()  # what came after the end lines (Noise.late_lines)
        self.end_lines = 0  # end lines seen, on both streams: a new one is news of the end
        self.stdin_lost = False
        # The command's exit status, as the frame's stdout end line gave it (fleet.core.shell
        # framed): None until then, or when the line came without one. The last such line wins:
        # the frame prints its own after the command's last output, so a command that printed
        # one itself (it can find the token in its parent's argv) does not decide its status.
        self.status: int | None = None

    def take(self, stream: str, line: str) -> list[str]:
        """The command's own lines among this one line of `stream` (none, one, or a held-back
        empty line and this one)."""
        s = self.streams[stream]
        if s.state == "before":
            if line.endswith(self.begin):
                s.state = "inside"
                self.before.add(line[: -len(self.begin)])
            else:
                self.before.add(line)
            return []
        if s.state == "after":
            if line == self.end or (stream == "stdout" and self._status_line(line)):
                self.end_lines += 1
            else:
                self.late.add(line)
            return []
        if line == self.end or (stream == "stdout" and self._status_line(line)):
            s.state = "after"
            s.held_empty = False
            self.end_lines += 1
            return []
        if line == self.lost:
            self.stdin_lost = True
            s.held_empty = False  # the frame's own, like the one before the end line
            return []
        out = [""] if s.held_empty else []
        s.held_empty = line == ""
        if not s.held_empty:
            out.append(line)
        return out

    def _status_line(self, line: str) -> bool:
        """`fleet-frame TOKEN end STATUS`: the end line, with the command's exit status."""
        value = line[len(self.end) + 1 :] if line.startswith(self.end + " ") else ""
        if not (value.isascii() and value.isdigit() and len(value) <= 3):
            return False
        self.status = int(value)
        return True

    def flush(self) -> list[tuple[str, str]]:
        """(stream, line) still held back when the output ended without an end line."""
        out = []
        for name, s in self.streams.items():
            if s.held_empty and s.state == "inside":
                out.append((name, ""))
                s.held_empty = False
        return out

    @property
    def started(self) -> bool:
        """The command's start line came: the login shell ran it."""
        return self.streams["stdout"].state != "before"

    @property
    def ended(self) -> bool:
        """The end line came on both streams: the command has ended (its frame exits next)."""
        return all(s.state == "after" for s in self.streams.values())

    @property
    def noise(self) -> Noise:
        return Noise(
            tuple(self.before.lines), self.before.count, tuple(self.late.lines), self.late.count
        )

    def problem(self) -> str | None:
        """Why the command's output cannot be trusted to be whole, once the command ended;
        None when both streams were framed from start to end."""
        if self.stdin_lost:
            return (
                "the login shell read fleet's stdin before fleet's command ran "
                "(a `read` or `cat` in an rc file such as ~/.bashrc?); nothing was run"
            )
        states = {s.state for s in self.streams.values()}
        if "before" in states:
            return (
                "the login shell did not run fleet's command: no start frame "
                "(does an rc file such as ~/.bashrc exit, or is the login shell no POSIX shell?)"
            )
        if "inside" in states:
            return "fleet's command ended without its end frame: its output may be cut short"
        return None
