"""What one remote command did (CommandResult) and how node text is cut to size: the part of a
run's values that the SSH layer and the keepers need, light to import (fleet/core/events.py
holds the rest)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.core.frame import Noise

# How much node output one event may carry. A line longer than LINE_MAX_BYTES (as received, before
# decoding) is cut there and says so: `... [cut: 18.2 MB more]`. Docker's log drivers split lines
# at the same 16 KiB. Without a cap, one 20 MB line was held several times over (the reader's
# buffer, the event, every tail) and copied into every record file.
LINE_MAX_BYTES = 16 * 1024
# Lines kept after their step ended (stdout/stderr tails, a host's last line, the summary's stderr
# tail) are cut shorter: they live until the run ends, one set per host.
TAIL_LINE_MAX_BYTES = 1024
CUT_MARK = " ... [cut: "


def size_text(count: int) -> str:
    """A byte count for people: 512 bytes, 16.4 kB, 18.2 MB, 1.1 GB (powers of 1000, like df -H)."""
    if count < 1000:
        return f"{count} byte{'' if count == 1 else 's'}"
    value = float(count)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def cut_note(more_bytes: int) -> str:
    """What a cut line ends with: how much of it was left out."""
    return f"{CUT_MARK}{size_text(more_bytes)} more]"


def char_boundary(raw: bytes, limit: int) -> int:
    """The largest cut point <= limit that does not split a UTF-8 character."""
    if len(raw) <= limit:
        return len(raw)
    cut = limit
    # Step back over continuation bytes (0b10xxxxxx), at most 3: a character has at most 4 bytes.
    while cut > 0 and limit - cut < 3 and raw[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def cut_bytes(raw: bytes, limit: int, more: int = 0) -> str:
    """Decode `raw` (of which `more` further bytes were already dropped), cut to `limit` bytes on a
    character boundary; a cut line ends with a note saying how many bytes it lost."""
    cut = char_boundary(raw, limit)
    more += len(raw) - cut
    text = raw[:cut].decode("utf-8", "replace")
    return text + cut_note(more) if more else text


@dataclass(frozen=True)
class CleanupDone:
    """What `op: cleanup` did on one node (fleet/node/cleanup.py), as numbers: the same as the
    node's last output line says in words. Only fleet's own words and numbers, never node text, so
    it may go where output does not (summary.json, events.jsonl)."""

    killed: int = 0  # processes this cleanup ended, port holders and GPU holders included
    by_term: int = 0  # of them, ended by TERM within the grace period
    by_kill: int = 0  # ended by KILL after it
    removed: int = 0  # state paths removed
    remove_failed: int = 0  # state paths rm could not remove
    port_freed: int | None = None  # the port, when this cleanup freed it by ending its holders
    port_holders: tuple[int, ...] = ()  # their pids
    gpu_reset: bool = False  # nvidia-smi --gpu-reset ran and succeeded
    gpus: int | None = None  # how many GPUs it said it reset (None: it did not say)
    clean: bool = False  # nothing left behind, no part failed
    failed: tuple[str, ...] = ()  # the parts that failed: kill, state, port, gpu-reset, facts
    refused: bool = False  # the node was left alone (see its last line)


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did."""

    exit_code: int | None
    stdout_tail: tuple[str, ...] = ()
    stderr_tail: tuple[str, ...] = ()
    duration_s: float = 0.0
    timed_out: bool = False
    cancelled: bool = False
    signal: str | None = None  # the signal it died of ("KILL"), when sshd said so (exit-signal)
    core_dumped: bool = False
    stop_failed: str | None = None  # a cancelled or timed-out command that may still run: why
    done: CleanupDone | None = None  # an `op: cleanup` step's account of what it did
    # Its output was not framed from start to end (fleet/core/frame.py): why, and it failed.
    broken: str | None = None
    noise: Noise = field(default_factory=Noise)  # what the login shell printed around it
