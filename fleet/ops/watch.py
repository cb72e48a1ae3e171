"""`fleet status --watch`: the status table, refreshed in place, one SSH connection per node.

Each node gets the status playbook's steps once, in one script that repeats them every INTERVAL
seconds and marks each round (`@step NAME`, `@tick N`): the scripts travel once per connection,
not once per refresh, and the node does the waiting. Every node is watched at once (a thread per
node, each mostly asleep in its channel), because a watch never ends and a pool of `--forks`
workers would leave the rest unwatched.

A node that stops answering is marked (no round for three intervals: "no answer"; connection
gone: "lost", then reconnected with a backoff), never fatal. Ctrl-C ends the watch (exit 0).
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core.errors import ExitCode
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.core.shell import Cmd, quote, render, wrap
from fleet.engine.runner import parse_facts
from fleet.node import runstate
from fleet.node.runstate import NodeRun
from fleet.ops.jobs import Settings, select

KEEP_LINES = 8  # per step and round, like OutputCollector: a facts line and a short log tail
STALE_ROUNDS = 3  # rounds without a tick before a node is shown as not answering
STALE_SLACK_S = 5.0  # plus the time a slow round may take
RECONNECT_MAX_S = 30.0
STEP_TIMEOUT_S = 30  # each step, each round, on the node (a hung nvidia-smi must not stall it)
# The keys the table shows, per status step (status.STATUS_KEYS, repeated here to keep the
# watch free of the status run's imports).
STEP_KEYS = {
    "processes": ("training",),
    "gpus": ("gpus", "util_avg_pct", "mem_used_mib", "mem_total_mib"),
    "janitor": ("janitor", "deleted"),
    "disk": ("free_bytes", "fs"),
}
LOG_PREFIX = "log: "


def loop_script(playbook: Playbook, variables: Mapping[str, Any], interval_s: float) -> str:
    """The node-side loop: every step's script held in a variable, run every round."""
    tag = f"FLEET_WATCH_{secrets.token_hex(6)}"
    head = ["LC_ALL=C; export LC_ALL", "command -v timeout >/dev/null 2>&1 && t=timeout || t="]
    body = ["n=0", "while :; do", "  n=$((n + 1))"]
    for i, step in enumerate(playbook.steps):
        args = render(step.run, variables)
        name = quote(step.name)
        if step.script is not None:
            if tag in step.script:  # the random tag makes this all but impossible
                raise ValueError(f"step {step.name}: its script contains the watch delimiter")
            head.append(f"S{i}=$(cat <<'{tag}'\n{step.script}\n{tag}\n)")
            run = f'sh -c "$S{i}" {name} {args}'
        else:
            run = f"sh -c {quote(args)}"
        body.append(f"  printf '@step %s\\n' {name}")
        body.append(f"  ${{t:+$t -k 5 {STEP_TIMEOUT_S}}} {run} </dev/null 2>&1")
    body += [
        "  printf '@tick %s\\n' \"$n\"",
        f"  sleep {interval_s:g}",
        "done",
    ]
    return "\n".join([*head, *body]) + "\n"


def loop_command(script: str) -> Cmd:
    """The one remote command of a watched node: the loop, fed on stdin, marked as fleet's own
    (the status steps' argv holds the training patterns: see playbooks/status.yaml)."""
    return Cmd(
        command=wrap("", sudo=False, timeout_s=None, script=True, helper=True),
        display="sh -s  < status loop",
        stdin=script,
        helper=True,
    )


@dataclass
class NodeView:
    """One node as the watch table shows it."""

    name: str
    state: str = "connecting"  # a RunState value, or connecting / no answer / lost / error
    facts: dict[str, str] = field(default_factory=dict)
    run: NodeRun | None = None
    last_log: str = ""
    reason: str = ""
    last_tick: float | None = None
    changed_at: float | None = None
    ticks: int = 0


class Round:
    """One node's lines since its last tick, by step (bounded)."""

    def __init__(self) -> None:
        self.step = ""
        self.lines: dict[str, list[str]] = {}

    def add(self, line: str) -> None:
        if line.startswith("@step "):
            self.step = line[6:]
            self.lines[self.step] = []
            return
        kept = self.lines.setdefault(self.step, [])
        kept.append(line)
        if len(kept) > 2 * KEEP_LINES:
            del kept[:-KEEP_LINES]

    def facts(self, step: str) -> dict[str, str]:
        lines = self.lines.get(step, [])
        return parse_facts(lines[-1]) if lines else {}


class Board:
    """Every node's view, updated by the node threads, read by the renderer (under one lock)."""

    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.views = {h: NodeView(h) for h in hosts}

    def tick(self, host: str, rnd: Round) -> None:
        """A round is complete: decide the node's run state from its facts."""
        run_lines = rnd.lines.get("run", [])
        tail = [ln[len(LOG_PREFIX) :] for ln in run_lines[:-1] if ln.startswith(LOG_PREFIX)]
        run = runstate.decide(rnd.facts("run"), tail, run_lines[-1] if run_lines else "")
        facts: dict[str, str] = {}
        for step, keys in STEP_KEYS.items():
            facts.update({k: v for k, v in rnd.facts(step).items() if k in keys})
        with self.lock:
            view = self.views[host]
            self._set_state(view, run.state.value)
            view.run, view.facts, view.reason = run, facts, ""
            view.last_log = tail[-1] if tail else view.last_log
            view.last_tick = self.clock()
            view.ticks += 1

    def mark(self, host: str, state: str, reason: str = "") -> None:
        with self.lock:
            view = self.views[host]
            self._set_state(view, state)
            view.reason = reason

    def _set_state(self, view: NodeView, state: str) -> None:
        if state != view.state:
            if view.ticks or view.state in ("lost", "no answer"):
                view.changed_at = self.clock()
            view.state = state

    def snapshot(self, interval_s: float) -> list[NodeView]:
        """Copies of every view, with nodes silent for STALE_ROUNDS intervals marked."""
        now = self.clock()
        with self.lock:
            for view in self.views.values():
                if view.last_tick is None or view.state in ("lost", "no answer"):
                    continue
                quiet = now - view.last_tick
                if quiet > STALE_ROUNDS * interval_s + STALE_SLACK_S:
                    self._set_state(view, "no answer")
                    view.reason = f"no report for {quiet:.0f}s"
            return [NodeView(**vars(v)) for v in self.views.values()]


def watch_node(
    host: Host,
    cmd: Cmd,
    connect: Callable[[Host], Any],
    board: Board,
    stop: threading.Event,
    connect_errors: tuple[type[BaseException], ...],
) -> None:
    """Keep one node watched until `stop`: connect, stream rounds, reconnect with a backoff."""
    delay = 1.0
    while not stop.is_set():
        try:
            session = connect(host)
        except connect_errors as exc:
            board.mark(host.name, "lost", str(getattr(exc, "reason", exc)))
            stop.wait(delay)
            delay = min(RECONNECT_MAX_S, delay * 2)
            continue
        delay = 1.0
        rnd = Round()

        def on_line(stream: str, line: str, rnd: Round = rnd) -> None:
            if line.startswith("@tick "):
                board.tick(host.name, rnd)
                rnd.lines.clear()
            else:
                rnd.add(line)

        try:
            result = session.run(cmd, on_line, stop)
            if not stop.is_set():
                why = f"status loop ended (exit {result.exit_code})"
                board.mark(host.name, "lost", why)
        except connect_errors as exc:
            board.mark(host.name, "lost", str(getattr(exc, "reason", exc)))
        finally:
            session.close()
        stop.wait(delay)


def watch(
    hosts: Sequence[Host],
    commands: Mapping[str, Cmd],
    transport: Any,
    connect_errors: tuple[type[BaseException], ...],
    interval_s: float,
    render: Callable[[list[NodeView]], None],
    *,
    until: Callable[[], bool] = lambda: False,
) -> ExitCode:
    """Watch every host until Ctrl-C (or `until()`); `render` is called about twice a second."""
    board = Board([h.name for h in hosts])
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=watch_node,
            args=(h, commands[h.name], transport.connect, board, stop, connect_errors),
            name=f"fleet-watch-{i}",
            daemon=True,
        )
        for i, h in enumerate(hosts)
    ]
    for t in threads:
        t.start()
    try:
        while not until():
            render(board.snapshot(interval_s))
            time.sleep(0.5)
        render(board.snapshot(interval_s))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
    finally:
        stop.set()
        deadline = time.monotonic() + 10
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        transport.close()
    return ExitCode.OK


def run_watch(opts: Settings, overrides: Mapping[str, Any], interval_s: float) -> ExitCode:
    """`fleet status --watch`: select hosts, build each node's loop, watch until Ctrl-C."""
    from fleet.core.playbook import load_shipped
    from fleet.engine.plan import check_patterns, host_variables
    from fleet.engine.runner import make_transport
    from fleet.output.reporters import StatusChanges, WatchScreen
    from fleet.ssh.transport import ConnectFailed

    _, hosts = select(opts)
    playbook = load_shipped("status")
    check_patterns(playbook, hosts, overrides)
    commands = {
        h.name: loop_command(
            loop_script(playbook, host_variables(h, playbook, overrides, i, len(hosts)), interval_s)
        )
        for i, h in enumerate(hosts)
    }
    if opts.ask.dry_run:
        for h in hosts:
            sys.stdout.write(f"{h.name}: every {interval_s:g}s, one loop over: ")
            sys.stdout.write(", ".join(step.name for step in playbook.steps) + "\n")
        return ExitCode.OK
    transport = make_transport(opts.run.ssh, None, hosts)
    if opts.run.output.plain or opts.json or not sys.stdout.isatty():
        changes = StatusChanges(sys.stdout, as_json=opts.json)
        return watch(hosts, commands, transport, (ConnectFailed,), interval_s, changes.handle)
    title = f"fleet status --watch {interval_s:g}s on {len(hosts)} hosts  (Ctrl-C to stop)"
    with WatchScreen(title, interval_s) as screen:
        return watch(hosts, commands, transport, (ConnectFailed,), interval_s, screen.update)
