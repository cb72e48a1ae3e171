"""act.sh's side of the seam: the exact lists fleet hands it, and what it says became of them.

    sh -s -- [signal GRACE_DS PID:START...] [remove TYPE PATH REAL...] [gpu-reset]
             [facts ARGS...] < act.sh

fleet sends those arguments first on stdin, as a `set -- ARGS` line before the script
(commands.stdin_args): thousands of pids or paths fit no command line or SSH packet.

Its output, one line per item (fleet/remote/act.sh says what each does):

    lock wait|none|late               the kill lock: waited for another cleanup, no flock(1) on
                                      the node, or still held by the other one after the wait
    signal PID term|kill|gone|denied|left
                                      ended by our TERM, by our KILL; ended before we signalled
                                      it (not ours to claim); may not be signalled; survived KILL
    remove N removed|changed|gone|held|failed [ERROR]
                                      the Nth path (from 0); changed: no longer the type and
                                      physical path fleet decided on, left alone; held: one of
                                      the processes signalled before it is still there
    gpu-reset RC OUTPUT               nvidia-smi --gpu-reset's exit status and output
    done                              act.sh finished acting; with `facts ARGS...` last, facts.sh's
                                      report for ARGS follows (fleet/node/facts.py)
ERROR and OUTPUT are hex, "-" for none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.core.digits import is_digits
from fleet.node.facts import PathMatch

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._-+,:@=")
_HEX = re.compile(r"-|(?:[0-9a-f]{2})*")


class ActError(ValueError):
    """act.sh's output is not what it prints."""


def escape(raw: bytes) -> str:
    """A path for act.sh's printf %b: plain ASCII stays, any other byte (and the backslash)
    becomes \\0ooo. The result is ASCII without spaces, so no byte of a node's file name can be
    mangled on its way back, whatever the local encoding."""
    return "".join(chr(b) if b in _SAFE else f"\\0{b:03o}" for b in raw)


@dataclass(frozen=True)
class Actions:
    """One round's work on one node: all of it in one act.sh run, in this order."""

    signal: tuple[tuple[int, int], ...] = ()  # (pid, start)
    grace_ds: int = 100
    remove: tuple[PathMatch, ...] = ()
    after_kill: tuple[PathMatch, ...] = ()  # removed only if every signalled process ended
    gpu_reset: bool = False

    def __bool__(self) -> bool:
        return bool(self.signal or self.remove or self.after_kill or self.gpu_reset)

    @property
    def removals(self) -> tuple[PathMatch, ...]:
        """What `remove N` counts through."""
        return self.remove + self.after_kill

    def args(self, then_facts: Sequence[str] | None = None) -> list[str]:
        """act.sh's arguments; `then_facts`: look again afterwards, with these facts.sh args."""
        out: list[str] = []
        if self.signal:
            out += ["signal", str(self.grace_ds), *(f"{pid}:{start}" for pid, start in self.signal)]
        if self.removals:
            out.append("remove")
            for match in self.remove:
                out += [match.kind, escape(match.path), escape(match.real)]
            for match in self.after_kill:
                out += [match.kind.upper(), escape(match.path), escape(match.real)]
        if self.gpu_reset:
            out.append("gpu-reset")
        if then_facts is not None:
            out += ["facts", *then_facts]
        return out


@dataclass(frozen=True)
class Outcome:
    """One line of act.sh's answer."""

    kind: str  # lock signal remove gpu-reset done
    key: int = 0  # pid, path index or exit status
    result: str = ""  # term kill gone denied left; removed changed gone held failed; lock: wait...
    text: bytes = b""  # an error or nvidia-smi's output


def _unhex(text: str) -> bytes:
    if not _HEX.fullmatch(text):
        raise ActError("expected hex")
    return b"" if text == "-" else bytes.fromhex(text)


_RESULTS = {
    "signal": {"term", "kill", "gone", "denied", "left"},
    "remove": {"removed", "changed", "gone", "held", "failed"},
}


def parse_line(line: str) -> Outcome | None:
    """One act.sh line; None for one it does not print (ActError for a malformed one)."""
    words = line.split(" ")
    kind = words[0]
    if kind == "done":
        return Outcome("done")
    if kind == "lock" and len(words) >= 2 and words[1] in ("wait", "none", "late"):
        return Outcome("lock", result=words[1])
    if kind in _RESULTS:
        if len(words) < 3 or not is_digits(words[1]) or words[2] not in _RESULTS[kind]:
            raise ActError(f"malformed {kind} line")
        text = _unhex(words[3]) if len(words) > 3 else b""
        return Outcome(kind, int(words[1]), words[2], text)
    if kind == "gpu-reset":
        if len(words) < 3 or not is_digits(words[1]):
            raise ActError("malformed gpu-reset line")
        return Outcome(kind, int(words[1]), text=_unhex(words[2]))
    return None


def parse(lines: Sequence[str]) -> list[Outcome]:
    return [outcome for line in lines if (outcome := parse_line(line)) is not None]
