"""`fleet kill-docker`: cleanup's kill, inside Docker containers.

Killing a `docker exec` client leaves what it started running in the container (docker/cli#5309,
moby#35703; PITFALLS 6), so `op: kill-docker` (playbooks/kill-docker.yaml) kills from inside,
on the node's one SSH connection:

1. docker.sh lists the node's containers (id, name, image, state, PID mode, labels, from
   `docker inspect`); `select` picks the ones asked for. Selectors of one kind are alternatives,
   of different kinds must all hold; only running containers are acted on; a named container
   that is missing or not running is reported and fails the host. With no selector, every
   running container is looked into first and kept only when something in it matches.
2. In each selected container (several at once): facts.sh runs inside it (`docker exec -i -u 0
   -e FLEET_NODE_HELPER=1 ID sh -s -- ARGS`, the script on stdin), fleet decides with cleanup's
   own rounds, decisions and guards (fleet/node/cleanup.py, decide.py), and act.sh signals by
   pid inside it and looks again. The container's pid 1 (its main process) is never a match:
   killing it ends the container, and every process in it descends from it. A matching pid 1
   that is still there after the kill is reported as left: `--stop` is the way to end it.
3. With `--stop`, `docker stop -t GRACE` (rounded up to whole seconds) afterwards.

A container that shares the host's PID namespace (`docker run --pid host`) is refused on the
daemon's word (HostConfig.PidMode) before anything runs in it, and also when facts.sh finds its
own parent visible there (a private PID namespace hides the exec's parent): a kill inside it
would reach every process of the host. Each container's lines are prefixed with `[NAME] `; the
last line sums it up (`kill-docker: 2 containers: a killed 3, b nothing matched`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fleet.core import defaults
from fleet.core.digits import is_digits
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd, to_text
from fleet.node import act as acting
from fleet.node.cleanup import MAX_ROUNDS, Cleanup, plural, seconds
from fleet.node.commands import script_cmd
from fleet.node.decide import CleanupSpec, ancestors, decide_kill, who
from fleet.node.ere import BadPattern, Pattern, compile_ere
from fleet.node.facts import MAX_LINES, FactsError, Snapshot, facts_args, parse
from fleet.node.step import FACTS_TIMEOUT_S, HostIO, OpVarError, patterns

_T = TypeVar("_T")
_R = TypeVar("_R")
WORKERS = 8  # containers worked on at once on one node
MAX_CONTAINERS = 10_000  # docker.sh's listing is cut here
HEX = frozenset("0123456789abcdef")
HOST_PID = (
    "refused: the container shares the host's PID namespace (docker run --pid host): a kill "
    "there would hit the host and every container; use fleet cleanup"
)


class _Stopped(Exception):
    """A command was cancelled or timed out: the op ends with its result."""

    def __init__(self, result: CommandResult) -> None:
        super().__init__("stopped")
        self.result = result


class _NoAnswer(Exception):
    """A docker command outlived its own cap (the step's deadline still ahead): the daemon hangs
    or is overloaded. The container (or, for the listing, the node) fails, saying so."""

    def __init__(self, script: str, args: Sequence[str], cap: float) -> None:
        docker = {"list": "docker ps", "state": "docker inspect", "stop": "docker stop"}
        what = docker.get(args[0], "docker") if script == "docker.sh" else f"docker exec {script}"
        super().__init__(
            f"{what} did not answer within {cap:g}s: the docker daemon hangs or is overloaded"
        )


# ------------------------------------------------------------------------------ the listing


@dataclass(frozen=True)
class Container:
    """One container, as `docker inspect` describes it."""

    id: str
    name: str
    image: str
    state: str
    pid_mode: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    restarts: int = 0  # docker's RestartCount: more of them later means its restart policy acted
    restart_policy: str = ""  # "no" (or ""), "always", "unless-stopped", "on-failure"


def parse_containers(lines: Iterable[str]) -> list[Container]:
    """docker.sh list's JSON arrays; a line that is not one is skipped."""
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not (
            isinstance(row, list)
            and len(row) == 8
            and all(isinstance(x, str) for x in [*row[:5], row[7]])
            and isinstance(row[6], int)
        ):
            continue
        labels = row[5] if isinstance(row[5], dict) else {}
        out.append(
            Container(
                id=row[0],
                name=row[1].removeprefix("/"),
                image=row[2],
                state=row[3],
                pid_mode=row[4],
                labels={str(k): str(v) for k, v in labels.items()},
                restarts=row[6],
                restart_policy=row[7],
            )
        )
        if len(out) >= MAX_CONTAINERS:
            break
    return out


# ------------------------------------------------------------------------------ selection


@dataclass(frozen=True)
class DockerSpec:
    """What the operator asked kill-docker to do on every node."""

    kill: CleanupSpec
    containers: tuple[str, ...] = ()  # names, anchored EREs or id prefixes
    labels: tuple[str, ...] = ()  # KEY or KEY=VALUE
    images: tuple[str, ...] = ()  # repository[:tag]
    stop: bool = False

    @property
    def selectors(self) -> bool:
        return bool(self.containers or self.labels or self.images)

    @property
    def stop_s(self) -> int:
        """docker stop takes whole seconds: the grace rounded up."""
        return math.ceil(self.kill.grace_s)


@dataclass(frozen=True)
class Selection:
    chosen: tuple[Container, ...]
    problems: tuple[str, ...] = ()  # selected containers that are missing, not running, paused
    # Paused ones: docker exec refuses them, so nothing can look inside; docker stop ends them.
    # With a selector and --stop they are stopped; with no selector they are skipped, said so.
    paused: tuple[Container, ...] = ()


def _name_regex(value: str) -> Pattern:
    try:
        return compile_ere(value)
    except BadPattern as exc:
        if "empty string" in str(exc):
            raise OpVarError(
                "containers",
                f"--container '{value}' matches every name",
                "leave --container out: kill-docker then looks into every running container",
            ) from None
        raise OpVarError(
            "containers", f"--container '{value}' is neither a name nor a regex: {exc}", exc.hint
        ) from None


def _named(containers: Sequence[Container], value: str) -> tuple[list[Container], bool]:
    """The containers `value` names: by name or anchored ERE, else by id prefix; and whether
    it is an id prefix of several (as docker, fleet then takes none: `--container 3` would pick
    a sixteenth of the node's containers, anyone's)."""
    regex = _name_regex(value).regex
    hits = [c for c in containers if c.name == value or regex.fullmatch(c.name.encode())]
    if not hits and value and set(value) <= HEX:
        hits = [c for c in containers if c.id.startswith(value)]
        return hits, len(hits) > 1
    return hits, False


def _split_image(ref: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; no digest, docker.io/library/ dropped."""
    ref = ref.split("@", 1)[0].removeprefix("docker.io/").removeprefix("library/")
    head, _, last = ref.rpartition("/")
    if ":" in last:
        last, tag = last.rsplit(":", 1)
        return (f"{head}/{last}" if head else last), tag
    return ref, ""


def image_matches(actual: str, wanted: Sequence[str]) -> bool:
    """`actual` is one of `wanted`: repository:tag exactly ("latest" when it has no tag), or any
    tag of a repository given without one."""
    repo, tag = _split_image(actual)
    for want in wanted:
        want_repo, want_tag = _split_image(want)
        if want == actual or (want_repo == repo and want_tag in ("", tag or "latest")):
            return True
    return False


def labels_match(labels: Mapping[str, str], wanted: Sequence[str]) -> bool:
    """The container carries one of `wanted`: KEY (any value) or KEY=VALUE."""
    for want in wanted:
        key, sep, value = want.partition("=")
        if key in labels and (not sep or labels[key] == value):
            return True
    return False


def select(containers: Sequence[Container], spec: DockerSpec) -> Selection:
    problems: list[str] = []
    named: set[str] | None = None
    if spec.containers:
        named = set()
        for value in spec.containers:
            hits, ambiguous = _named(containers, value)
            running = [c.id for c in hits if c.state in ("running", "paused")]
            if not hits:
                problems.append(f"no such container: {value}")
            elif ambiguous:
                some = ", ".join(c.name for c in hits[:5])
                problems.append(
                    f"ambiguous container id prefix: {value} is the start of {len(hits)} ids "
                    f"({some}{', ...' if len(hits) > 5 else ''}): give more of it, or a name"
                )
                continue
            elif not running:
                problems += [f"container not running: {c.name} ({c.state})" for c in hits]
            named.update(running)
    picked = [
        c
        for c in containers
        if (named is None or c.id in named)
        and (not spec.labels or labels_match(c.labels, spec.labels))
        and (not spec.images or image_matches(c.image, spec.images))
    ]
    paused = tuple(c for c in picked if c.state == "paused")
    if spec.selectors and not spec.stop:
        problems += [
            f"container paused: {c.name} (docker exec cannot look inside; unpause it, or stop it "
            "with --stop)"
            for c in paused
        ]
    chosen = tuple(c for c in picked if c.state == "running")
    return Selection(chosen, tuple(problems), paused)


def pid1_matches(snap: Snapshot, spec: CleanupSpec) -> str | None:
    """The container's pid 1 command line, when it matches a pattern."""
    record = snap.records.get(1)
    if record is None or not any(p.search(record.text) for p in spec.patterns):
        return None
    return record.shown()


def without_pid1(snap: Snapshot) -> Snapshot:
    """The snapshot as the kill decides on it: pid 1 is no match, so neither are all the
    container's processes as its descendants."""
    return dataclasses.replace(snap, records={k: v for k, v in snap.records.items() if k != 1})


def shares_host_pids(snap: Snapshot) -> bool:
    """The first of fleet's processes in the container (the exec's shell) has a visible parent:
    the exec did not land in a PID namespace of its own (there, its parent is outside: ppid 0)."""
    first = snap.procs.get([snap.self_pid, *ancestors(snap, snap.self_pid)][-1])
    return first is not None and first.ppid != 0


# ------------------------------------------------------------------------------------ the op


@dataclass(frozen=True)
class ContainerResult:
    """How one container ended up, for the summary line."""

    name: str
    text: str
    failed: bool = False
    ended: bool = False  # the container ended on its own (docker stop has nothing to do)


class _Node:
    """One run of the op on one node: its commands, its output, its deadline."""

    def __init__(self, op: KillDockerOp, io: HostIO) -> None:
        self.op = op
        self.io = io
        self.spec = op.spec
        self.lock = threading.Lock()
        self.said: list[str] = []
        self.stderr: tuple[str, ...] = ()  # the listing's, when it failed (sudo's word, say)
        self.deadline = time.monotonic() + op.timeout_s if op.timeout_s else None

    def say(self, line: str) -> None:
        with self.lock:
            self.said.append(line)
            del self.said[:-20]
        self.io.emit("stdout", line)

    def _left(self, cap: float) -> float:
        if self.deadline is None:
            return cap
        return min(cap, max(1.0, self.deadline - time.monotonic()))

    def run(
        self,
        script: str,
        args: Sequence[str],
        cap: float,
        container: str | None = None,
        answer: Callable[[str], bool] | None = None,
    ) -> tuple[CommandResult, list[str], list[str]]:
        """One command; (result, stdout lines, stderr lines). Each stdout line goes to `answer`
        first, as it comes, and is kept only when that says False. _Stopped when cancelled or
        at the step's deadline; _NoAnswer when the command's own cap ran out first."""
        out: list[str] = []
        err: list[str] = []

        def on_line(stream: str, line: str) -> None:
            if stream != "stdout":
                err.append(line)
                del err[:-50]
            elif answer is None or not answer(line):
                out.append(line)
                del out[:-MAX_LINES]

        left = self._left(cap)
        cmd = script_cmd(
            script,
            args,
            sudo=self.op.sudo,
            timeout_s=left,
            password_on_stdin=self.op.password_on_stdin,
            container=container,
        )
        result = self.io.run(cmd, on_line)
        if result.timed_out and left >= cap and not result.cancelled:
            raise _NoAnswer(script, args, cap)
        if result.cancelled or result.timed_out:
            raise _Stopped(result)
        return result, out, err

    # ------------------------------------------------------------------------ in a container

    def look(
        self,
        c: Container,
        actions: acting.Actions | None = None,
        record: Callable[[acting.Outcome], None] | None = None,
    ) -> tuple[Snapshot | None, int, str]:
        """facts.sh inside `c`, after act.sh doing `actions` when given (its answers go to
        `record`); (snapshot, exit status, last error line). No snapshot: the exec failed."""
        facts = facts_args([p.source for p in self.spec.kill.patterns])
        if actions is None:
            result, report, err = self.run("facts.sh", facts, FACTS_TIMEOUT_S, c.id)
        else:
            acting_done = False

            def answer(line: str) -> bool:
                """act.sh's answers, said as they come; True until its `done`."""
                nonlocal acting_done
                if acting_done:
                    return False
                try:
                    outcome = acting.parse_line(line)
                except acting.ActError:
                    return True
                acting_done = outcome is not None and outcome.kind == "done"
                if outcome is not None and not acting_done and record is not None:
                    record(outcome)
                return True

            cap = FACTS_TIMEOUT_S + 2 * self.spec.kill.grace_s + 60
            args = actions.args(then_facts=facts)
            result, report, err = self.run("act.sh", args, cap, c.id, answer)
        # docker ends its message with a blank line: the last line that says something. When it
        # cannot start sh at all (126, 127), docker exec -i says why on stdout.
        said = err if err or result.exit_code not in (126, 127) else report
        last = next((line.strip() for line in reversed(said) if line.strip()), "")[:200]
        if result.exit_code != 0:
            return None, result.exit_code or 1, last
        try:
            return parse(report), 0, last
        except FactsError as exc:
            return None, 1, f"facts.sh said something fleet cannot read: {exc}"

    def state(self, c: Container, polls: int) -> str:
        """The container's state, asked again every 0.2 s (at most `polls` times) while it says
        running: the daemon learns that a container ended only once all in it is reaped.
        `restarted` when its restart policy started it again (or is about to) since the listing:
        its main process ended, but the container did not."""
        _, out, _ = self.run("docker.sh", ["state", c.id, str(polls)], polls * 0.3 + 30)
        state, _, restarts = (out[-1] if out else "unknown").partition(" ")
        if state == "restarting" or (is_digits(restarts) and int(restarts) > c.restarts):
            return "restarted"
        return state

    def _restarted(self, c: Container, done: str, say: Callable[[str], None]) -> ContainerResult:
        """The container's main process ended and docker started it again: whatever it runs is
        back. --stop (which runs next) ends it for good; without it the container failed."""
        if self.spec.stop:
            say("container restarted by its restart policy: its main process ended; stopping it")
            return ContainerResult(c.name, f"{done}restarted")
        say(
            "container restarted by its restart policy: its main process ended and docker "
            "started it again; stop the container with --stop"
        )
        return ContainerResult(c.name, f"{done}restarted", failed=True)

    def probe(self, c: Container) -> tuple[str, Snapshot | None]:
        """Whether the default selection keeps `c`: ("yes", its facts), ("no", None),
        ("skip WHY: detail", None) or ("hung WHAT", None) when docker did not answer."""
        try:
            return self._probe(c)
        except _NoAnswer as exc:
            return f"hung {exc}", None

    def _probe(self, c: Container) -> tuple[str, Snapshot | None]:
        if c.pid_mode == "host":
            return (
                "skip host PID namespace: it shares the host's (docker run --pid host), so its "
                "processes are the host's: see fleet cleanup"
            ), None
        snap, code, last = self.look(c)
        if snap is None:
            return f"skip cannot run sh: docker exec exit {code}: {last}", None
        if shares_host_pids(snap):
            return "skip host PID namespace: its processes are the host's: see fleet cleanup", None
        kill = decide_kill(without_pid1(snap), self.spec.kill, who(snap))
        if kill.targets or kill.refusal or pid1_matches(snap, self.spec.kill):
            return "yes", snap
        return "no", None

    def work(self, c: Container, snap: Snapshot | None) -> ContainerResult:
        """Kill in `c` (from `snap`, its facts, when already known), check its pid 1, stop it
        with --stop."""
        try:
            return self._work(c, snap)
        except _NoAnswer as exc:
            self.say(f"[{c.name}] {exc}")
            return ContainerResult(c.name, "no answer from docker", failed=True)

    def _work(self, c: Container, snap: Snapshot | None) -> ContainerResult:

        def say(line: str) -> None:
            if not line.startswith("gpu-reset: "):  # kill-docker never asks about GPUs
                self.say(f"[{c.name}] {line}")

        if c.pid_mode == "host":
            say(HOST_PID)
            return ContainerResult(c.name, "refused (host PID namespace)", failed=True)
        cleanup = Cleanup(self.spec.kill, say)
        code, last = 0, ""
        if snap is None:
            snap, code, last = self.look(c)
        for _ in range(MAX_ROUNDS):
            if snap is None or shares_host_pids(snap):
                break
            actions = cleanup.plan(without_pid1(snap))
            if actions is None:
                break
            snap, code, last = self.look(c, actions, cleanup.record)
        if snap is not None and shares_host_pids(snap):
            say(HOST_PID)
            return ContainerResult(c.name, "refused (host PID namespace)", failed=True)
        if snap is None:
            done = self._exec_failed(c, code, last, say)
        elif cleanup.refusal is not None:
            done = ContainerResult(c.name, "refused (the patterns match what it never kills)", True)
        else:
            done = self._finish(c, snap, cleanup, say)
        if self.spec.stop and not done.ended:
            return self.stop(c, f"{done.text}, ")
        return done

    def stop(self, c: Container, done: str) -> ContainerResult:
        """docker stop (which also ends a paused container); `done` prefixes the result."""
        result, _, err = self.run(
            "docker.sh", ["stop", str(self.spec.stop_s), c.id], 60 + self.spec.stop_s
        )
        if result.exit_code == 0:
            self.say(f"[{c.name}] stopped")
            return ContainerResult(c.name, f"{done}stopped")  # nothing is left in it
        why = err[0][:200] if err else f"exit {result.exit_code}"
        self.say(f"[{c.name}] stop failed: {why}")
        return ContainerResult(c.name, f"{done}stop failed", failed=True)

    def _exec_failed(
        self, c: Container, code: int, last: str, say: Callable[[str], None]
    ) -> ContainerResult:
        # A docker exec killed by a signal is what the container's end does to it: wait up to
        # 5 s (act.sh's own wait for a KILL to take effect) to be told.
        state = self.state(c, 25 if 128 < code < 200 else 0)
        if state == "restarted":
            return self._restarted(c, "", say)
        if state == "running":
            said = f": {last}" if last else ""
            say(
                f"kill did not run to the end (exit {code}): no sh in the container, or "
                f"docker exec failed{said}"
            )
            return ContainerResult(c.name, f"kill failed (exit {code})", failed=True)
        say(f"container {state} during the kill: its main process ended")
        return ContainerResult(c.name, f"container {state}", ended=True)

    def _finish(
        self, c: Container, snap: Snapshot, cleanup: Cleanup, say: Callable[[str], None]
    ) -> ContainerResult:
        code = cleanup.finish(without_pid1(snap))
        killed = [p for p in cleanup.ended if cleanup.role.get(p) == "kill"]
        left = [p for p in cleanup.left if cleanup.role.get(p) == "kill"]
        text = f"left {len(left)}" if left else f"killed {len(killed)}" if killed else ""
        done = ContainerResult(c.name, text or "nothing matched", failed=code != 0)
        pid1 = pid1_matches(snap, self.spec.kill)
        # A main process that ends once its training child is gone (an entrypoint script's
        # shell) ends the container, which a restart policy starts again: look then too.
        may_restart = bool(killed) and c.restart_policy not in ("", "no")
        if self.spec.stop or (pid1 is None and not may_restart):
            return done
        # A parent such as docker-init or `sh -c` exits by itself once its training child is
        # gone, which ends the container: give it 2 s.
        state = self.state(c, 10)
        if state == "restarted":
            restarted = self._restarted(c, f"{done.text}, ", say)
            return dataclasses.replace(restarted, failed=restarted.failed or done.failed)
        if state == "running" and pid1 is None:
            return done
        if state == "running":
            say(
                f"left: pid 1 (the container's main process) matches and is never killed here: "
                f"{pid1}; stop the container with --stop"
            )
            return ContainerResult(c.name, f"{done.text}, pid 1 left", failed=True)
        say(f"container {state}: its main process ended")
        return ContainerResult(c.name, f"{done.text}, container {state}", done.failed, ended=True)

    # ----------------------------------------------------------------------------- the node

    def each(self, items: Sequence[_T], task: Callable[[_T], _R]) -> list[_R]:
        """task(item) for every item, at most WORKERS at once, results in order."""
        if len(items) <= 1:
            return [task(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(WORKERS, len(items))) as pool:
            return list(pool.map(task, items))

    def kill_docker(self) -> int:
        try:
            return self._kill_docker()
        except _NoAnswer as exc:
            self.say(f"kill-docker: {exc}")
            return 1

    def _kill_docker(self) -> int:
        spec = self.spec
        result, out, err = self.run("docker.sh", ["list"], 120)
        if "no-docker" in out:
            if spec.containers:
                names = " ".join(spec.containers)
                self.say(f"kill-docker: docker not installed, but containers were named: {names}")
                return 1
            self.say("kill-docker: skipped: docker not installed")
            return 0
        if result.exit_code != 0:
            # The last line is the error: sudo and docker may warn first ("sudo: unable to
            # resolve host ...").
            self.stderr = tuple(err[-10:])
            message = next((line for line in reversed(err) if line.strip()), "")[:300]
            if message:
                self.say(f"docker ps: {message}")
            low = message.lower()
            if low.startswith("sudo:"):
                self.say(
                    "kill-docker: sudo failed, docker ps did not run (a password: pass -K; a "
                    "login in the docker group: --no-sudo)"
                )
            elif "permission denied" in low:
                self.say(
                    "kill-docker: permission denied on the docker socket (run with sudo or join "
                    "the docker group)"
                )
            elif "cannot connect to the docker daemon" in low or "docker daemon running" in low:
                self.say("kill-docker: cannot reach the docker daemon (is it running?)")
            else:
                self.say(f"kill-docker: docker ps failed (exit {result.exit_code})")
            return 1
        selection = select(parse_containers(out), spec)
        for problem in selection.problems:
            self.say(problem)
        chosen: Sequence[tuple[Container, Snapshot | None]] = [(c, None) for c in selection.chosen]
        skipped: list[str] = []
        # paused ones stopped, containers whose probe got no answer from docker
        settled: list[ContainerResult] = []
        if spec.selectors and spec.stop:
            settled = self.each(selection.paused, lambda c: self.stop(c, "paused, "))
        if not spec.selectors:
            for c in selection.paused:
                self.say(f"[{c.name}] skipped: paused: docker exec cannot look inside")
                skipped.append(f"{c.name} (paused)")
            kept = []
            probes = self.each(selection.chosen, self.probe)
            for c, (verdict, snap) in zip(selection.chosen, probes, strict=True):
                if verdict == "yes":
                    kept.append((c, snap))
                elif verdict == "no":
                    self.say(f"[{c.name}] no matching process")
                elif verdict.startswith("hung "):
                    self.say(f"[{c.name}] {verdict.removeprefix('hung ')}")
                    settled.append(ContainerResult(c.name, "no answer from docker", failed=True))
                else:
                    why = verdict.removeprefix("skip ")
                    self.say(f"[{c.name}] skipped: {why}")
                    skipped.append(f"{c.name} ({why.split(':', 1)[0]})")
            chosen = kept
        done = settled + self.each(chosen, lambda item: self.work(*item))
        self.say(summary(done, selection, spec, skipped))
        return 1 if selection.problems or any(d.failed for d in done) else 0


def summary(
    done: Sequence[ContainerResult], selection: Selection, spec: DockerSpec, skipped: Sequence[str]
) -> str:
    """The node's last line."""
    if done:
        parts = ", ".join(f"{d.name} {d.text}" for d in done)
        line = f"kill-docker: {plural(len(done), 'container')}: {parts}"
    elif selection.problems:
        line = "kill-docker: nothing killed"
    elif not spec.selectors:
        line = (
            f"kill-docker: no running container has a matching process "
            f"({len(selection.chosen)} running)"
        )
    else:
        line = "kill-docker: no running container matches the selection"
    if skipped:
        line += "; skipped " + ", ".join(skipped)
    for problem in selection.problems:
        line += f"; {problem}"
    return line


@dataclass(frozen=True)
class KillDockerOp:
    """`op: kill-docker` for one host."""

    spec: DockerSpec
    cmd: Cmd
    sudo: bool
    timeout_s: float | None
    password_on_stdin: bool
    stdin_name: str = "docker.sh"

    def describe(self) -> str:
        s = self.spec
        chosen = [f"--container {c}" for c in s.containers] + [f"--label {x}" for x in s.labels]
        chosen += [f"--image {x}" for x in s.images]
        which = " ".join(chosen) or "any running one with a matching process"
        stop = f"; then docker stop -t {s.stop_s}" if s.stop else ""
        return (
            f"then in each selected container ({which}), by docker exec, at most {MAX_ROUNDS} "
            f"rounds of: facts.sh, act.sh signal PID:START... (TERM, --grace "
            f"{seconds(s.kill.grace_s)} s, KILL){stop}"
        )

    def run(self, io: HostIO) -> CommandResult:
        started = time.monotonic()
        node = _Node(self, io)
        try:
            code = node.kill_docker()
        except _Stopped as stop:
            return dataclasses.replace(
                stop.result, stdout_tail=tuple(node.said), duration_s=time.monotonic() - started
            )
        return CommandResult(code, tuple(node.said), node.stderr, time.monotonic() - started)


def _items(var: str, value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = tuple(to_text(v) for v in items if v is not None and to_text(v) != "")
    for item in out:
        if "\n" in item or "\0" in item:
            raise OpVarError(var, f"{var}: '{item}' holds a newline", "one value per item")
    return out


def spec_of(variables: Mapping[str, Any]) -> DockerSpec:
    """The kill-docker vars, checked; OpVarError names the first bad one."""
    try:
        grace = float(to_text(variables.get("grace", defaults.GRACE_S)))
    except ValueError:
        grace = -1.0
    if not 0 <= grace <= 600:
        raise OpVarError(
            "grace",
            f"grace: '{to_text(variables.get('grace'))}' is not 0-600",
            f"--grace {defaults.GRACE_S:g}",
        )
    containers = _items("containers", variables.get("containers"))
    for value in containers:
        _name_regex(value)
    labels = _items("labels", variables.get("labels"))
    for label in labels:
        if label.startswith("="):
            raise OpVarError("labels", f"--label '{label}': no KEY", "--label KEY or KEY=VALUE")
    images = _items("images", variables.get("images"))
    for image in images:
        if any(ch.isspace() for ch in image):
            raise OpVarError("images", f"--image '{image}' holds a blank", "--image pytorch:2.4")
    stop = to_text(variables.get("stop", False)).strip().lower() in ("true", "yes", "1", "on")
    # A training container's processes are mostly the job's: no share of them is too many.
    kill = CleanupSpec(
        patterns=patterns(variables.get("patterns")), grace_s=grace, max_kill_share=1
    )
    return DockerSpec(kill, containers, labels, images, stop)


def build(
    variables: Mapping[str, Any],
    *,
    sudo: bool,
    timeout_s: float | None,
    password_on_stdin: bool,
) -> KillDockerOp:
    """The planned op for one host; OpVarError for a var it cannot use."""
    spec = spec_of(variables)
    cmd = script_cmd(
        "docker.sh", ["list"], sudo=sudo, timeout_s=120, password_on_stdin=password_on_stdin
    )
    cmd = dataclasses.replace(cmd, timeout_s=timeout_s)
    return KillDockerOp(spec, cmd, sudo, timeout_s, password_on_stdin)
