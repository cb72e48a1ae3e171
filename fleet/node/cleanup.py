"""One node's cleanup as rounds of facts -> decide -> act, and what it tells the operator.

`Cleanup` holds what happened so far on one node: `plan(snapshot)` decides the next round from
fresh facts (None: nothing left to do), `record(outcome)` takes act.sh's answers one at a time
(so lines stream as the node reports them), `finish(snapshot)` says what each part did and what
is left, and returns the step's exit code. A torchrun that restarts workers during teardown is
caught by the next round; a process or path that resisted once is not tried again. `preview`
says what a cleanup would do from one snapshot. No I/O here: fleet/node/ops.py runs this against
a node; the tests run it against synthetic snapshots.

The node's last line is its result: what this cleanup did, then what is left and which part
failed, if anything (`finish` also keeps it in numbers, `done`, for --json):

    killed 3 processes (TERM 2, KILL 1), removed 4 paths, port 39500 freed (stopped python3)
    killed 1 process (TERM 1), removed 2 paths; left: 1 path; failed: state
    already clean

It names no pid and no path, so that nodes where the same was done say the same line, and the
end of the run folds them under one host set (`node[01-03,05]: killed 2 processes (TERM 2),
...`); the lines before it name each process and path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core.result import CleanupDone
from fleet.node.act import Actions, Outcome
from fleet.node.decide import (
    CleanupSpec,
    Paths,
    decide_gpus,
    decide_kill,
    decide_paths,
    decide_port,
    gpu_holders,
    is_gpu_daemon,
    who,
)
from fleet.node.facts import PathMatch, Record, Snapshot, decode

MAX_ROUNDS = 4  # act.sh runs at most this often per node; facts.sh once more
PROGRAM_MAX = 40  # characters of a port holder's program name in the result line
# What nvidia-smi --gpu-reset says per GPU: `GPU 00000000:3B:00.0 was successfully reset.`
_GPU_WAS_RESET = re.compile(
    rb"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]) "
    rb"was (?:successfully )?reset",
    re.MULTILINE,
)


def plural(count: int, word: str) -> str:
    """1 process, 2 processes, 3 paths."""
    if count == 1:
        return f"{count} {word}"
    return f"{count} {word}es" if word.endswith("s") else f"{count} {word}s"


def seconds(value: float) -> str:
    """10.0 -> 10, 0.5 -> 0.5."""
    return f"{value:g}"


def shown(match: PathMatch) -> str:
    return decode(match.path)


def program(record: Record) -> str:
    """A process's program for the result line: the base name of argv[0] (`python3`), its comm
    when it has no command line, `?` when neither is known."""
    first = record.cmdline.split(b"\0", 1)[0].split(b" ", 1)[0].rsplit(b"/", 1)[-1]
    return decode(first or record.comm)[:PROGRAM_MAX] or "?"


def stranger(snap: Snapshot, pid: int) -> str:
    """Why a port holder of another user's is left alone."""
    record = snap.record(pid)
    user = record.user or (str(record.uid) if record.uid >= 0 else "?")
    return (
        f"not stopping {pid} (user {user}'s, not fleet's, and it matches no pattern; stop it "
        f"yourself or pick another port): {record.shown()}"
    )


def users_text(snap: Snapshot, pids: Sequence[int]) -> str:
    """`PID CMD[, +N more]` for the processes holding a path."""
    more = f", +{len(pids) - 1} more" if len(pids) > 1 else ""
    return f"{pids[0]} {snap.record(pids[0]).shown(60)}{more}"


class Cleanup:
    """One node's cleanup in flight (see the module docstring)."""

    def __init__(self, spec: CleanupSpec, say: Callable[[str], None]) -> None:
        self.spec = spec
        self._say = say
        self._said: set[str] = set()
        self.rounds = 0
        self.refusal: str | None = None
        self.records: dict[int, Record] = {}
        self.role: dict[int, str] = {}  # signalled pid -> "kill" or "port"
        self.tried: set[tuple[int, int]] = set()  # (pid, start) signalled
        self.ended: dict[int, str] = {}  # pid -> TERM or KILL
        self.left: list[int] = []
        self.port_seen = False
        self.port_pids: set[int] = set()  # every process seen holding the port
        self.port_freed: tuple[int, ...] = ()  # the holders it ended, once the port is free
        self.paths_tried: set[tuple[bytes, str, bytes]] = set()
        self.removing: tuple[PathMatch, ...] = ()
        self.removed = 0
        self.failed = 0
        self.refused: set[bytes] = set()
        self.outside = 0
        self.gpu_line: str | None = None  # the GPU part's summary, once decided
        self.gpu_detail: list[str] = []  # said before it
        self.gpu_failed = False
        self.gpu_reset = False  # nvidia-smi --gpu-reset succeeded
        self.gpus: int | None = None  # how many GPUs it said it reset
        self.done: CleanupDone | None = None  # what it did, in numbers: set by finish()

    def say(self, line: str) -> None:
        self._say(line)

    def once(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self._say(line)

    # ------------------------------------------------------------------------------ rounds

    def plan(self, snap: Snapshot) -> Actions | None:
        """The next round's actions, or None when there is nothing (more) to do."""
        first = self.rounds == 0
        self.rounds += 1
        if snap.grep_failed:
            return self._refuse(["refused: the node's grep -E rejects the patterns"])
        whom = who(snap)
        kill = decide_kill(snap, self.spec, whom)
        if kill.refusal:
            return self._refuse(kill.refusal)
        paths = (
            decide_paths(snap, self.spec, whom, kill.targets) if self.spec.state_paths else Paths()
        )
        if paths.refused_globs and first:
            lines = [f"refused --path '{glob}': {why}" for glob, why in paths.refused_globs]
            lines.append(
                f"refused: {plural(len(paths.refused_globs), 'state path')} outside the places "
                "training state lives; did nothing on this node "
                "(--var allow_any_state_path=true to allow)"
            )
            return self._refuse(lines)
        for glob in paths.no_home:
            self.once(f"skipped (HOME is not set): {glob}")
        for pid in kill.spared_gpu:
            cmd = snap.record(pid).shown()
            self.once(f"gpu holder {pid} not killed (pass kill_gpu_holders=true): {cmd}")
        for pid in kill.gpu_daemons:
            self.once(f"gpu holder {pid} not killed (system daemon): {snap.record(pid).shown()}")
        signal = self._signal(snap, kill.targets, "kill")
        if signal:
            self.say(
                f"kill: sending TERM to {plural(len(signal), 'process')}, "
                f"KILL after {seconds(self.spec.grace_s)}s"
            )
        if self.spec.port is not None:
            signal += self._port(snap, whom, set(kill.targets))
        remove = self._paths(snap, paths)
        # Held only by what this round kills: removed by the same act.sh run once they ended.
        after = self._fresh(paths.after_kill) if signal and not paths.outside else ()
        gpu_reset = self._gpus(snap, busy_with_kills=bool(signal))
        actions = Actions(
            signal=tuple(sorted((pid, snap.procs[pid].start) for pid in signal)),
            grace_ds=round(self.spec.grace_s * 10),
            remove=remove,
            after_kill=after,
            gpu_reset=gpu_reset,
        )
        self.removing = actions.removals
        return actions or None

    def _refuse(self, lines: Sequence[str]) -> Actions | None:
        """Say why this node is left alone; nothing more is done here."""
        for line in lines:
            self.say(line)
        self.refusal = lines[-1]
        return None

    def _signal(self, snap: Snapshot, pids: Sequence[int], role: str) -> list[int]:
        out = []
        for pid in pids:
            key = (pid, snap.procs[pid].start)
            if key in self.tried:
                continue
            self.tried.add(key)
            self.role[pid] = role
            self.records[pid] = snap.record(pid)
            out.append(pid)
        return out

    def _port(self, snap: Snapshot, whom: Any, killing: set[int]) -> list[int]:
        port = decide_port(snap, self.spec.port or 0, whom)
        self.port_seen = self.port_seen or port.held
        self.port_pids.update(port.holders)
        for pid in port.holders:
            self.once(f"port {port.port}: held by {pid} ({snap.record(pid).shown()})")
        for pid in port.own:
            self.once(f"port {port.port}: not killing {pid}: it is this cleanup's own caller")
        for pid, reason in port.protected:
            self.once(
                f"port {port.port}: not stopping {pid} ({reason}): {snap.record(pid).shown()}"
            )
        for pid in port.strangers:
            if pid not in killing:
                self.once(f"port {port.port}: {stranger(snap, pid)}")
        return self._signal(snap, [pid for pid in port.stop if pid not in killing], "port")

    def _paths(self, snap: Snapshot, paths: Paths) -> tuple[PathMatch, ...]:
        if paths.outside:
            for match in paths.outside:
                self.once(f"refused (resolves to {decode(match.real)}): {shown(match)}")
            self.outside = max(self.outside, len(paths.outside))
            return ()
        for match in paths.refused:
            self.once(f"refused (resolves to {decode(match.real)}): {shown(match)}")
            self.refused.add(match.path)
        return self._fresh(paths.remove)

    def _fresh(self, matches: Sequence[PathMatch]) -> tuple[PathMatch, ...]:
        """The matches not handed to act.sh before (one that resisted is not tried again)."""
        out = []
        for match in matches:
            key = (match.path, match.kind, match.real)
            if key not in self.paths_tried:
                self.paths_tried.add(key)
                out.append(match)
        return tuple(out)

    def _gpus(self, snap: Snapshot, busy_with_kills: bool) -> bool:
        if self.gpu_line is not None:
            return False
        gpus = decide_gpus(snap)
        if gpus.status == "absent":
            self.gpu_line = "gpu-reset: skipped: no nvidia-smi"
        elif gpus.status == "failed":
            self.gpu_detail = decode(snap.smi_output).splitlines()[-5:]
            self.gpu_line = f"gpu-reset: failed: nvidia-smi --query-compute-apps (exit {gpus.rc})"
            self.gpu_failed = True
        elif busy_with_kills:
            return False
        elif gpus.status == "busy":
            self.gpu_detail = [
                f"gpu holder {pid}: {snap.record(pid).shown()}" for pid in gpu_holders(snap)
            ]
            self.gpu_line = f"gpu-reset: skipped: GPU busy (pids {' '.join(map(str, gpus.busy))})"
        else:
            self.gpu_line = ""  # asked for; act.sh's answer fills it in
            return True
        return False

    # ---------------------------------------------------------------------- act.sh's answers

    def record(self, outcome: Outcome) -> None:
        """One line of act.sh's answer, said as the operator reads it."""
        if outcome.kind == "signal":
            self._signalled(outcome.key, outcome.result)
        elif outcome.kind == "remove" and outcome.key < len(self.removing):
            match = self.removing[outcome.key]
            if outcome.result == "removed":
                self.removed += 1
                self.say(f"removed: {shown(match)}")
            elif outcome.result == "failed":
                self.failed += 1
                error = decode(outcome.text).strip().splitlines() or ["still there"]
                self.say(f"failed: {shown(match)}: {error[-1][:200]}")
            elif outcome.result == "changed":
                self.say(f"skipped (changed since cleanup looked at it): {shown(match)}")
            elif outcome.result == "held":
                self.paths_tried.discard((match.path, match.kind, match.real))
        elif outcome.kind == "gpu-reset":
            for line in decode(outcome.text).strip().splitlines()[-20:]:
                self.say(line)
            if outcome.key == 0:
                self.gpu_line = "gpu-reset: done"
                self.gpu_reset = True
                self.gpus = len(set(_GPU_WAS_RESET.findall(outcome.text))) or None
            else:
                if outcome.key == 124:
                    self.say("nvidia-smi --gpu-reset timed out")
                self.gpu_line = f"gpu-reset: failed (exit {outcome.key})"
                self.gpu_failed = True
        elif outcome.kind == "lock":
            wait = round(self.spec.grace_s) + 30
            self.say(
                {
                    "wait": "kill: another cleanup is killing on this node; "
                    f"waiting for it (up to {wait}s)",
                    "late": f"kill: the other cleanup still holds the kill lock after {wait}s; "
                    "going ahead",
                    "none": "kill: no lock (flock(1) missing or fleet's node state dir refused): "
                    "not serialised with other cleanups on this node",
                }[outcome.result]
            )

    def _signalled(self, pid: int, result: str) -> None:
        record = self.records.get(pid)
        if record is None:
            return
        if result in ("term", "kill"):
            self.ended[pid] = result.upper()
            self.say(f"killed {pid} ({result.upper()}): {record.shown()}")
        elif result == "denied":
            self.say(f"not permitted to signal {pid} (not root?): {record.shown()}")
            self.say(f"left {pid}: {record.shown()}")
            self.left.append(pid)
        elif result == "left":
            self.say(f"left {pid}: {record.shown()}")
            self.left.append(pid)

    # ------------------------------------------------------------------------------ the end

    def finish(self, snap: Snapshot | None) -> int:
        """Each part's summary, what is left, and the result as the last line (what was done,
        then what is left and what failed: see the module docstring); the exit code. Sets
        `done`."""
        if self.refusal is not None:
            self.done = CleanupDone(refused=True)
            return 1
        failed: list[str] = []
        ended = [pid for pid in self.ended if self.role[pid] == "kill"]
        by_term = sum(1 for pid in ended if self.ended[pid] == "TERM")
        left = [pid for pid in self.left if self.role[pid] == "kill"]
        detail = f"{len(ended)} ended ({by_term} by TERM, {len(ended) - by_term} by KILL)"
        if left:
            self.say(f"kill: {len(left)} left (pids {' '.join(map(str, left))}); {detail}")
            failed.append("kill")
        else:
            self.say(f"kill: {detail}" if ended else "kill: nothing matched")
        if self.gpu_line is None and snap is not None:
            self._gpus(snap, busy_with_kills=False)
        if self.gpu_line is None:
            self.say("gpu-reset: skipped: processes were still being killed")
        elif self.gpu_line == "":
            self.say("gpu-reset: failed (act.sh did not answer)")
            self.gpu_failed = True
        else:
            for line in self.gpu_detail:
                self.say(line)
            self.say(self.gpu_line)
        if self.gpu_failed:
            failed.append("gpu-reset")
        if snap is None:
            parts = ", ".join(failed) or "facts"
            self._conclude(f"failed: {parts} (could not look again)", [*failed, "facts"])
            return 1
        whom = who(snap)
        kill = decide_kill(snap, self.spec, whom)
        paths = decide_paths(snap, self.spec, whom) if self.spec.state_paths else Paths()
        if self.spec.state_paths and self._state_summary(snap, paths):
            failed.append("state")
        if self.spec.port is not None and self._port_summary(snap, whom):
            failed.append("port")
        procs = [pid for pid in kill.targets if kill.why.get(pid) != "holds a GPU"]
        lefts = self._verify(snap, procs, paths, whom)
        verdict = [f"left: {', '.join(lefts)}"] if lefts else []
        if failed:
            verdict.append(f"failed: {', '.join(failed)}")
            verdict[-1] += "" if lefts else " (nothing left behind)"
        self._conclude("; ".join(verdict), failed)
        return 1 if verdict else 0

    def _conclude(self, verdict: str, failed: Sequence[str]) -> None:
        """Say the result line: what was done, then `verdict` (what is left and what failed, ""
        for nothing); keep it in numbers as `done`."""
        did = ", ".join(self.did())
        if not verdict:
            self.say(did or "already clean")
        else:
            self.say(f"{did}; {verdict}" if did else verdict)
        signals = list(self.ended.values())
        self.done = CleanupDone(
            killed=len(signals),
            by_term=signals.count("TERM"),
            by_kill=signals.count("KILL"),
            removed=self.removed,
            remove_failed=self.failed,
            port_freed=self.spec.port if self.port_freed else None,
            port_holders=self.port_freed,
            gpu_reset=self.gpu_reset,
            gpus=self.gpus,
            clean=not verdict,
            failed=tuple(failed),
        )

    def did(self) -> list[str]:
        """What this cleanup did on the node, in words, without pids or paths (nodes that did the
        same say the same): `killed 3 processes (TERM 2, KILL 1)`, `removed 4 paths`, `could not
        remove 1 path`, `port 39500 freed (stopped python3)`, `2 GPUs reset`."""
        out = []
        signals = list(self.ended.values())
        if signals:
            by = ", ".join(f"{sig} {n}" for sig in ("TERM", "KILL") if (n := signals.count(sig)))
            # `processes`: never to be read as a `killed PID (TERM): CMD` line
            out.append(f"killed {plural(len(signals), 'process')} ({by})")
        if self.removed:
            out.append(f"removed {plural(self.removed, 'path')}")
        if self.failed:
            out.append(f"could not remove {plural(self.failed, 'path')}")
        if self.port_freed:
            names = dict.fromkeys(program(self.records[pid]) for pid in self.port_freed)
            out.append(f"port {self.spec.port} freed (stopped {', '.join(names)})")
        if self.gpu_reset:
            out.append(f"{plural(self.gpus, 'GPU')} reset" if self.gpus else "GPUs reset")
        return out

    def _state_summary(self, snap: Snapshot, paths: Paths) -> bool:
        """The state part's lines; True when it failed."""
        if self.outside:
            self.say(
                f"state: removed 0, kept 0, refused {self.outside} "
                "(outside the places training state lives)"
            )
            return True
        kept = paths.kept
        for match, users in kept:
            self.say(f"kept (in use by {users_text(snap, users)}): {shown(match)}")
        refused = len(self.refused)
        summary = f"state: removed {self.removed}, kept {len(kept)}"
        summary += f", refused {refused}" if refused else ""
        summary += f", failed {self.failed}" if self.failed else ""
        self.say(summary)
        return bool(refused or self.failed)

    def _port_summary(self, snap: Snapshot, whom: Any) -> bool:
        """The port part's lines; True when the port is still held."""
        port = decide_port(snap, self.spec.port or 0, whom)
        name = f"port {port.port}"
        if not port.held:
            # Ended by this cleanup: a holder it stopped for the port, or one it killed anyway.
            killed = [pid for pid in self.ended if pid in self.port_pids]
            self.port_freed = tuple(killed)
            if killed:
                shown_ = ", ".join(f"{pid} {self.records[pid].shown(60)}" for pid in killed)
                self.say(f"{name}: freed (killed {shown_})")
            elif self.port_seen:
                self.say(f"{name}: freed (its holder ended before this cleanup signalled it)")
            else:
                self.say(f"{name}: free")
            return False
        if port.holders:
            self.say(f"{name}: still held by {' '.join(map(str, port.holders))}")
        else:
            inodes = " ".join(map(str, port.inodes))
            self.say(
                f"{name}: held by a listening socket that no visible process owns "
                f"(inode {inodes}; another PID namespace?)"
            )
            self.say(f"{name}: still held (no visible process)")
        return True

    def _verify(self, snap: Snapshot, procs: Sequence[int], paths: Paths, whom: Any) -> list[str]:
        """A `left ...` line per leftover; the summary's words."""
        words = []
        for pid in procs:
            self.say(f"left process {pid}: {snap.record(pid).shown()}")
        if procs:
            words.append(plural(len(procs), "process"))
        if self.spec.port is not None:
            port = decide_port(snap, self.spec.port, whom)
            if port.held:
                words.append(f"port {port.port}")
                if not port.holders:
                    self.say(f"left port {port.port}: held by a socket no visible process owns")
                for pid in port.holders:
                    self.say(f"left port {port.port}: held by {pid} ({snap.record(pid).shown()})")
        if self.spec.state_paths:
            held = {m.path: users for m, users in paths.kept}
            for match in {m.path: m for m in snap.matches}.values():
                users = held.get(match.path)
                use = f" (in use by {users_text(snap, users)})" if users else ""
                self.say(f"left path: {shown(match)}{use}")
            count = len({m.path for m in snap.matches})
            if count:
                words.append(plural(count, "path"))
        if self.spec.kill_gpu_holders:
            holders = [
                pid
                for pid in gpu_holders(snap)
                if pid not in whom.own and not is_gpu_daemon(snap, pid)
            ]
            for pid in holders:
                self.say(f"left gpu holder {pid}: {snap.record(pid).shown()}")
            if holders:
                words.append(plural(len(holders), "gpu holder"))
        return words


# ------------------------------------------------------------------------------------ preview


@dataclass(frozen=True)
class Touched:
    """A process a cleanup would signal."""

    pid: int
    user: str
    command: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command, "why": self.why}


@dataclass(frozen=True)
class Preview:
    """What a cleanup would do on one node, decided from one look, changing nothing."""

    refused: tuple[str, ...] = ()
    processes: tuple[Touched, ...] = ()
    port: int | None = None
    port_holders: tuple[Touched, ...] = ()  # the ones it would stop
    port_held: bool = False
    paths: tuple[tuple[str, str], ...] = ()  # (action, path): remove, remove after the kill,
    # keep (in use by ...), refuse
    gpus: str = ""
    spared: tuple[Touched, ...] = field(default=())  # GPU holders it would leave alone
    port_strangers: tuple[Touched, ...] = ()  # another user's port holders it would leave

    @property
    def removals(self) -> int:
        return sum(1 for action, _ in self.paths if action.startswith("remove"))

    def summary(self) -> str:
        if self.refused:
            return self.refused[-1]
        parts = [
            f"would kill {plural(len(self.processes), 'process')}",
            f"remove {plural(self.removals, 'path')}",
        ]
        kept = sum(1 for action, _ in self.paths if action.startswith("keep"))
        if kept:
            parts.append(f"keep {kept} in use")
        if self.port_held and (self.port_holders or not self.port_strangers):
            holders = ", ".join(str(t.pid) for t in self.port_holders) or "no visible process"
            parts.append(f"stop the holder of port {self.port} ({holders})")
        if self.port_strangers:
            holders = ", ".join(str(t.pid) for t in self.port_strangers)
            parts.append(f"leave port {self.port} to another user's process ({holders})")
        parts.append(self.gpus)
        return "preview: " + "; ".join(parts) + "; nothing changed"

    def lines(self) -> list[str]:
        out = list(self.refused[:-1])
        for t in self.processes:
            out.append(f"would kill {t.pid} ({t.user}, {t.why}): {t.command}")
        for t in self.port_holders:
            out.append(f"would stop {t.pid} ({t.user}), holder of port {self.port}: {t.command}")
        for t in self.port_strangers:
            out.append(
                f"would leave {t.pid} ({t.user}), holder of port {self.port}: another user's, "
                f"matching no pattern: {t.command}"
            )
        for t in self.spared:
            out.append(f"would leave gpu holder {t.pid} ({t.user}): {t.command}")
        for action, path in self.paths:
            out.append(f"would {action}: {path}")
        out.append(self.summary())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "refused": list(self.refused),
            "processes": [t.to_dict() for t in self.processes],
            "port": self.port,
            "port_held": self.port_held,
            "port_holders": [t.to_dict() for t in self.port_holders],
            "port_strangers": [t.to_dict() for t in self.port_strangers],
            "paths": [{"action": action, "path": path} for action, path in self.paths],
            "gpus": self.gpus,
            "spared_gpu_holders": [t.to_dict() for t in self.spared],
        }


def _touched(snap: Snapshot, pid: int, why: str) -> Touched:
    record = snap.record(pid)
    user = record.user or (str(record.uid) if record.uid >= 0 else "?")
    return Touched(pid, user, record.shown(), why)


def preview(snap: Snapshot, spec: CleanupSpec) -> Preview:
    """What `Cleanup` would do in its first round, and then to what the kill frees."""
    if snap.grep_failed:
        return Preview(refused=("refused: the node's grep -E rejects the patterns",))
    whom = who(snap)
    kill = decide_kill(snap, spec, whom)
    if kill.refusal:
        return Preview(refused=kill.refusal)
    paths = decide_paths(snap, spec, whom, kill.targets) if spec.state_paths else Paths()
    if paths.refused_globs:
        lines = tuple(f"refused --path '{g}': {why}" for g, why in paths.refused_globs)
        return Preview(refused=(*lines, "refused: state paths outside the places state lives"))
    port = decide_port(snap, spec.port, whom) if spec.port is not None else None
    listed: list[tuple[str, str]] = []
    listed += [("remove", shown(m)) for m in paths.remove]
    listed += [("remove after the kill", shown(m)) for m in paths.after_kill]
    listed += [(f"keep (in use by {users_text(snap, u)})", shown(m)) for m, u in paths.kept]
    listed += [(f"refuse (resolves to {decode(m.real)})", shown(m)) for m in paths.refused]
    listed += [
        ("refuse (resolves outside the places state lives)", shown(m)) for m in paths.outside
    ]
    gpus = decide_gpus(snap)
    gpu_text = {
        "absent": "gpu-reset: skipped: no nvidia-smi",
        "failed": f"gpu-reset: failed: nvidia-smi --query-compute-apps (exit {gpus.rc})",
        "busy": f"gpu-reset: skipped: GPU busy (pids {' '.join(map(str, gpus.busy))})",
        "reset": "gpu-reset: would reset the GPUs",
    }[gpus.status]
    if gpus.status != "absent" and kill.targets:
        gpu_text = "gpu-reset: after the kill, if no process uses a GPU then"
    return Preview(
        processes=tuple(_touched(snap, pid, kill.why.get(pid, "")) for pid in kill.targets),
        port=spec.port,
        port_held=bool(port and port.held),
        port_holders=tuple(
            _touched(snap, pid, "holds the port")
            for pid in (port.stop if port else ())
            if pid not in kill.targets
        ),
        paths=tuple(listed),
        gpus=gpu_text,
        spared=tuple(_touched(snap, pid, "holds a GPU") for pid in kill.spared_gpu),
        port_strangers=tuple(
            _touched(snap, pid, "holds the port")
            for pid in (port.strangers if port else ())
            if pid not in kill.targets
        ),
    )
