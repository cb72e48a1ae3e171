"""One run, wired end to end: inventory -> plan -> executor -> reporters -> RunSummary.

Every verb (cleanup, launch, status, ...) is one or more playbook runs through here, each
started by fleet.ops.jobs.perform, the one execution path; a verb that chains runs (launch:
preflight, start, roll back) yields one plan after another to it.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.core import defaults, nodeset
from fleet.core.errors import ExitCode
from fleet.core.events import (
    Event,
    LateOutputIgnored,
    OutputLine,
    RunSummary,
    ShellNoiseIgnored,
)
from fleet.core.flushing import Flusher
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook
from fleet.core.redact import Redactor, shown_names
from fleet.engine.executor import Run
from fleet.engine.plan import Plan, build_plan
from fleet.engine.workers import Stay, Workers
from fleet.inventory.loader import Inventory, Selection, load_inventory
from fleet.output import pipes
from fleet.output.aside import aside
from fleet.output.gather import Gatherer
from fleet.output.settings import OutputSettings
from fleet.records.runlog import RecordSettings
from fleet.ssh.settings import SshSettings

Handler = Any  # has handle(event) and close()
TRIM_EVERY_BYTES = 8 * 1024 * 1024  # of output, between two malloc_trim calls (HeapTrim)
CANCEL_WAIT_S = 25.0  # after the first Ctrl-C: the remote kill takes up to ~20 s on a dead node


@dataclass(frozen=True)
class RunSettings:
    """What running a plan needs, each part for the layer that reads it, built once by fleet.cli:
    how to reach the hosts (fleet.ssh), what the operator sees (fleet.output), where the run is
    recorded (fleet.records), how many hosts at once and in how many processes, and how steps
    are wrapped (--sudo, -K)."""

    ssh: SshSettings = field(default_factory=SshSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    record: RecordSettings = field(default_factory=RecordSettings)
    forks: int = defaults.FORKS
    workers: int | None = None  # --workers: processes to split the hosts over; None: per core
    sudo: bool | None = None  # --sudo / --no-sudo over every step; None: as the playbook says
    password_on_stdin: bool = False  # -K: the sudo password goes to each host on stdin


def select_hosts(
    selection: Selection, record: RecordSettings, *, dry_run: bool
) -> tuple[Inventory, list[Host]]:
    """Read the hosts and apply --limit; check the run-record dir (a run writes one, a dry run
    does not) so that a bad --log-dir fails here, before any question or connection."""
    inventory, selected = choose_hosts(selection, record)
    if not dry_run:
        from fleet.records import runlog

        runlog.check_base(record.base())
    return inventory, selected


def choose_hosts(selection: Selection, record: RecordSettings) -> tuple[Inventory, list[Host]]:
    """The hosts (-w's node set, else the inventory's; fleet.inventory.loader.load_inventory), then
    --limit, its @failed / @unreachable / @FILE read from the run records first
    (fleet.records.retry)."""
    from fleet.inventory import hostlist
    from fleet.records import retry

    nodes = hostlist.parse_nodeset(",".join(selection.nodes)) if selection.nodes else None
    inventory = load_inventory(
        selection.inventory or None, selection.playbook_dir, nodes=nodes, found=selection.found
    )
    inventory.print_warnings()
    limit = selection.limit
    if limit is not None and retry.has_tokens(limit):
        notes: list[str] = []
        limit = retry.expand(
            limit, record.base(), inventory.host_index, verb=record.verb, notes=notes
        )
        say_notes(notes)
    return inventory, inventory.select(limit)


def say_notes(notes: Sequence[str]) -> None:
    """`fleet: NOTE` lines on stderr (what fleet chose for the operator, e.g. the run record
    -l @failed read), controls escaped: record names are file names."""
    from fleet.core.safetext import clean

    for note in notes:
        print(f"fleet: {clean(note)}", file=sys.stderr)


def prepare(
    run: RunSettings, playbook: Playbook, overrides: dict[str, Any], hosts: Sequence[Host]
) -> Plan:
    """Apply --sudo/--no-sudo and render every command for every host."""
    if run.sudo is not None:
        steps = tuple(dataclasses.replace(s, sudo=run.sudo) for s in playbook.steps)
        playbook = dataclasses.replace(playbook, steps=steps)
    return build_plan(hosts, playbook, overrides, password_on_stdin=run.password_on_stdin)


def dry_run_lines(plan: Plan, inventory: Inventory, as_json: bool) -> Iterator[str]:
    """Every command for every host, exactly as it would be sent, but for the job environment's
    values (fleet/core/redact.py: a dry run's output gets pasted into tickets); nothing connects."""
    shown = shown_names()
    if as_json:
        for hp in plan.hosts:
            redact = Redactor(hp.env, shown)
            steps = [
                {
                    "name": ps.step.name,
                    "command": redact(ps.cmd.display),
                    "sent": redact(ps.cmd.command),
                    "stdin": ps.op.stdin_name if ps.op else ps.step.script_name,
                    "sudo": ps.cmd.sudo,
                    "timeout_s": ps.step.timeout_s if ps.op else ps.cmd.timeout_s,
                    **({"op": ps.step.op, "then": ps.op.describe()} if ps.op else {}),
                }
                for ps in hp.steps
            ]
            yield json.dumps({"host": hp.host.name, "target": hp.host.target, "steps": steps})
        return
    from fleet.core.safetext import clean

    # Every line but a command's is one line: a newline in a name, an address or a path is data
    # (shown `\n`, as the run's own output shows it), never a line that seems to be fleet's.
    header = (
        f"dry run: {plan.playbook.name} on {len(plan.hosts)} "
        f"host{'' if len(plan.hosts) == 1 else 's'} "
        f"{nodeset.fold(plan.host_names)} (from {inventory.path}); nothing connects"
    )
    yield clean(header) + "\n"
    for hp in plan.hosts:
        redact = Redactor(hp.env, shown)
        yield clean(f"{hp.host.name}  ({hp.host.target})")
        for i, ps in enumerate(hp.steps, 1):
            extras = [
                x
                for x in (
                    "sudo" if ps.cmd.sudo else "",
                    f"timeout {ps.step.timeout_s:g}s" if ps.step.timeout_s else "",
                    "continue on error" if ps.step.on_error.value == "continue" else "",
                )
                if x
            ]
            yield clean(f"  {i}. {ps.step.name}" + (f"  [{', '.join(extras)}]" if extras else ""))
            yield f"     $ {redact(ps.cmd.display)}"
            if ps.op is not None:
                yield clean(f"     {ps.op.describe()}")
        yield ""


def default_reporters(
    out: OutputSettings, plan: Plan, summary: bool = True, transient: bool = False
) -> list[Handler]:
    """Live table on a terminal; plain lines off one (or --plain); JSON lines with --json.

    After the summary, what the hosts printed: gathered (identical outputs once under their
    folded host set) unless --no-gather, which prints it host by host; verbs whose output is a
    report of their own (cleanup, kill-docker, ...) set `out.output` to "last": their hosts are
    folded by last line.
    """
    from fleet.output.printer import off_terminal

    output = out.shown
    plain = off_terminal(out, summary=summary, output=output)
    if plain is not None:
        return plain
    from fleet.output.console import Console
    from fleet.output.reporters import LiveReporter

    console = Console(highlight=False)
    steps = len(plan.playbook.steps)
    return [
        LiveReporter(console, step_count=steps, summary=summary, transient=transient, output=output)
    ]


@dataclass(frozen=True)
class Secrets:
    """What the operator typed at a prompt: fed to hosts, never printed, logged or recorded."""

    sudo_password: str | None = field(default=None, repr=False)
    key_passphrase: str | None = field(default=None, repr=False)


def make_transport(
    ssh: SshSettings,
    secrets: Secrets | None,
    hosts: Sequence[Host],
    *,
    warm: bool = False,
    hand_off: int = 0,
) -> Any:
    """The SSH transport for a run, with the secrets the operator typed. ssh config refusals and
    unusable identity files stop the run here, before any connection. `warm`: a run of steps
    (Session.run only) may use warm connections (fleet/ssh/warm.py) when --persist allows;
    verbs that need the SSH session itself (files, checkpoints, watch) connect afresh.
    `hand_off`: into how many worker processes the run may be split at most (0: none), which
    then become the keepers of the connections they made when no keeper runs yet
    (fleet/ssh/handoff.py)."""
    opts = dataclasses.replace(
        ssh,
        sudo_password=secrets.sudo_password if secrets else None,
        key_passphrase=secrets.key_passphrase if secrets else None,
    )
    transport: Any = None
    if warm and ssh.persist_s > 0:
        from fleet.ssh import rundir
        from fleet.ssh.choose import transport_for

        try:
            transport = transport_for(opts, hosts, hand_off=hand_off)
        except rundir.Unusable as exc:
            # Anyone can make /tmp/fleet-UID before us: that must cost the operator the warm
            # connections (said), never the command.
            _say_cold(exc.message)
    if transport is None and warm and ssh.engine != "paramiko":
        from fleet.ssh.native import NativeTransport

        transport = NativeTransport(opts)
    elif transport is None:
        from fleet.ssh.transport import SSHTransport

        transport = SSHTransport(opts)
    transport.check(hosts)
    return transport


def _say_cold(why: str) -> None:
    from fleet.core.safetext import clean

    print(
        clean(f"fleet: warning: no warm connections for this command: {why}"),
        file=sys.stderr,
    )
    print(
        "  hint: remove that directory if it is not yours, set XDG_RUNTIME_DIR to a 0700 "
        "directory of yours, or pass --persist 0",
        file=sys.stderr,
    )


def run_plan(
    plan: Plan,
    run_settings: RunSettings,
    secrets: Secrets | None,
    *,
    reporters: Sequence[Handler] | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> RunSummary:
    """Execute the plan with Ctrl-C semantics: the first cancels (no new steps, in-flight remote
    commands stopped, hosts marked cancelled); the second exits at once with 130."""
    from fleet.core.events import RunFinished, RunStarted
    from fleet.engine.workers import Workers
    from fleet.records import runlog

    hosts = [hp.host for hp in plan.hosts]
    transport = make_transport(
        run_settings.ssh,
        secrets,
        hosts,
        warm=True,
        # One host at a time per worker at least: --forks 1 splits nothing (a rolling run).
        hand_off=0 if keeps_findings(plan) else run_settings.forks,
    )
    recording = run_settings.record
    record = runlog.RunRecord(
        recording.base(),
        runlog.new_record_id(plan.playbook.name),
        verb=recording.verb,
        invocation=recording.invocation,
    )
    record_id = record.record_id  # the directory's name: with a suffix when the id was taken
    run = _engine(plan, run_settings, secrets, transport)
    # Worker processes fork first: before RunStarted, on which the live table starts its thread,
    # and before the reporters are made (rich's import, ~20 ms), so that their hosts are being
    # connected to meanwhile. Their events wait in the pipes until the run is drained.
    forked = run.start() if isinstance(run, Workers) else None
    started = time.monotonic()
    gatherer = Gatherer()
    handlers: list[Handler] = [record, gatherer]
    flusher = Flusher(handlers)  # the record's and reporters' lines, written together

    def dispatch(event: Event) -> None:
        # A worker's event is recorded as the JSON line it came in (RunRecord.handle's `line`).
        record.handle(event, run.frame if isinstance(run, Workers) else None)
        for h in handlers[1:]:
            h.handle(event)
        flusher.handled()

    try:
        shown = (
            list(reporters)
            if reporters is not None
            else default_reporters(run_settings.output, plan)
        )
        # A reporter whose reader left (`| head`) cancels the run as Ctrl-C: fleet/output/pipes.py
        handlers += [*map(pipes.Guarded, shown), HeapTrim(), NoiseWarnings()]
        dispatch(
            RunStarted(
                run_id=record_id,
                playbook=plan.playbook.name,
                hosts=tuple(plan.host_names),
                forks=run_settings.forks,
                run_dir=str(record.dir),
            )
        )
    except BaseException:
        if isinstance(run, Workers):
            run.close()
        raise
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    whole = False  # the run ended on its own, not cancelled (its connections may be kept)
    try:
        threads = run.start() if forked is None else forked
        _freeze_once()
        interrupted = _drain(run, threads, dispatch, handlers, on_interrupt, flusher.wait_s)
        if isinstance(run, Workers):
            run.close()  # every worker has ended (or is ended now, past the cancel deadline)
            record.note_workers([f.to_dict() for f in run.figures()])
        summary = dataclasses.replace(
            run.summary(record_id, started, interrupted, str(record.dir)),
            output=gatherer.result(),
            silent=gatherer.silent_hosts(),
        )
        dispatch(RunFinished(summary=summary))
        whole = not interrupted
    finally:
        if isinstance(run, Workers):
            run.close()
        signal.signal(signal.SIGTERM, previous)
        for h in handlers:
            h.close()
        if hasattr(transport, "stay") and not isinstance(run, Workers):
            from fleet.engine.keepafter import keep_after_run

            keep_after_run(transport, whole)
        transport.close()
    return summary


_FROZEN: list[bool] = []


def _freeze_once() -> None:
    """What exists when a command's first run starts (modules, classes, its plan) lives to the
    end: out of the collector's sight, its passes over a big run's events no longer visit it
    all again. Once a process: whatever garbage is frozen with it is never freed, so a second
    run (a verb's next phase) must not freeze its predecessor's."""
    if not _FROZEN:
        _FROZEN.append(True)
        gc.freeze()


def _drain(
    run: Run | Workers,
    threads: list[Any],
    dispatch: Callable[[Event], None],
    handlers: Sequence[Handler],
    on_interrupt: Callable[[], None] | None,
    wait_s: Callable[[float], float] | None = None,
) -> bool:
    """Hand every event to the handlers; the first Ctrl-C (or the reader of the output leaving:
    fleet/output/pipes.py) cancels and waits CANCEL_WAIT_S at most, the second exits 130 at once.
    True: interrupted. `wait_s`: how long the engine may wait for an event
    (fleet/core/flushing.py)."""
    try:
        for event in run.drain(threads, wait_s=wait_s):
            dispatch(event)
    except KeyboardInterrupt as exc:
        run.cancel.set()
        try:  # a second Ctrl-C, even while "cancelling" is being said, aborts at once
            if on_interrupt and not isinstance(exc, pipes.ReaderLeft):  # no one to read it
                with aside(handlers):  # above the live table, which would erase it
                    on_interrupt()
            # In-flight steps are being stopped on their nodes; give that a bounded time.
            cancel_by = time.monotonic() + CANCEL_WAIT_S
            for event in run.drain(threads, deadline=cancel_by, wait_s=wait_s):
                dispatch(event)
        except KeyboardInterrupt:
            if isinstance(run, Workers):
                run.close()
            for h in handlers:
                h.close()
            os._exit(int(ExitCode.INTERRUPTED))
        return True
    return False


def _engine(
    plan: Plan, settings: RunSettings, secrets: Secrets | None, transport: Any
) -> Run | Workers:
    """The run's engine: threads in this process (fleet.engine.executor), or worker processes
    each running its share of the hosts with such threads (fleet.engine.workers) when the run
    is big enough (--workers) and this process is single-threaded, as fork needs."""
    from fleet.core import redact
    from fleet.engine import workers
    from fleet.engine.executor import OUTPUT_IN_FLIGHT_BYTES, OutputBudget
    from fleet.ssh.failure import ConnectFailed  # light: a warm run never loads paramiko
    from fleet.ssh.warm import WarmTransport

    shares: list[Plan] | None = None
    stay: Stay | None = None
    if hasattr(transport, "stay"):  # fleet/ssh/handoff.py's: a first command makes the keepers
        if _kept_after(plan, settings, transport):
            count = 1  # here; keepers forked at its end take its connections (keep_after_run)
        else:  # its workers become the keepers
            shares, stay = _by_shard(plan, transport)
            count = len(shares)
    elif keeps_findings(plan) or isinstance(transport, WarmTransport):
        # Through keepers the SSH work already runs in their processes (one per core, up to
        # eight: fleet/ssh/warm.py's KEEPERS_MAX); this process only routes events (and its
        # keeper links' reader threads forbid a fork).
        count = 1
    else:
        # How many of the hosts connect through paramiko, which costs this process ~4x the CPU
        # of libssh2 per host (asked only when --workers leaves it to fleet; a transport that
        # cannot say: none).
        paramiko_hosts = getattr(transport, "paramiko_hosts", None)
        count = workers.worker_count(
            settings.workers,
            len(plan.hosts),
            settings.forks,
            workers.usable_cores(),
            paramiko_hosts([hp.host for hp in plan.hosts])
            if paramiko_hosts and settings.workers is None
            else 0,
        )

    def make_run(share: Plan, forks: int) -> Run:
        return Run(
            plan=share,
            transport=transport,
            forks=forks,
            sudo_password=secrets.sudo_password if secrets else None,
            connect_errors=(ConnectFailed,),
            show_env=redact.shown_names(),
            budget=OutputBudget(OUTPUT_IN_FLIGHT_BYTES // count),
        )

    if (count > 1 or stay is not None) and workers.fork_safe():
        return workers.Workers(
            plan, count, settings.forks, make_run, CANCEL_WAIT_S, shares=shares, stay=stay
        )
    count = 1  # in this process: its output budget whole
    return make_run(plan, settings.forks)


def _kept_after(plan: Plan, settings: RunSettings, transport: Any) -> bool:
    """Whether a first command's run with warm connections runs in this process, keepers forked
    at its end taking its connections (fleet/engine/keepafter.py), rather than split over
    workers that become them: when it would be one process's work (workers.worker_count) and
    every host connects through libssh2 (a paramiko connection runs a thread: no fork then)."""
    from fleet.engine import workers

    hosts = [hp.host for hp in plan.hosts]
    paramiko = transport.paramiko_hosts(hosts)
    count = workers.worker_count(
        settings.workers, len(hosts), settings.forks, workers.usable_cores(), paramiko
    )
    return count == 1 and paramiko == 0


def _by_shard(plan: Plan, transport: Any) -> tuple[list[Plan], Stay]:
    """The plan's hosts by the keeper shard they belong to (plan order kept in each), and what
    each share's worker becomes after its run: that shard's keeper."""
    groups: dict[int, list[Any]] = {}
    for hp in plan.hosts:
        groups.setdefault(transport.shard_of(hp.host), []).append(hp)
    shards = sorted(groups)

    def stay(index: int, whole: bool) -> Callable[[], None] | None:
        result: Callable[[], None] | None = transport.stay(shards[index], whole)
        return result

    return [dataclasses.replace(plan, hosts=tuple(groups[s])) for s in shards], stay


def keeps_findings(plan: Plan) -> bool:
    """True when an op step of the plan keeps what it finds in its own object for the verb to
    read after the run (cleanup's preview): a worker process's copy would be lost."""
    return any(getattr(ps.op, "keeps_findings", False) for hp in plan.hosts for ps in hp.steps)


NOISE_SHOWN_LINES = 3  # of a login shell's lines, in its warning
_NOISY_HOSTS: set[str] = set()  # hosts already warned about, for the whole fleet invocation
_LATE_HOSTS: set[str] = set()  # the same, for output after the command ended


class NoiseWarnings:
    """A handler that says on stderr what a host's login shell printed around fleet's commands
    (fleet/core/frame.py: ignored, never parsed), once per host for the whole invocation: a verb
    that chains runs (launch: preflight, start) meets the same banner in each. Said when the run is
    over, under its summary, so it never tears the live table; as data (controls escaped),
    bounded (a few lines, cut). Output that came after a command had ended (a background process
    it left, still writing) is said the same way, as what it is: no rc file's."""

    def __init__(
        self, warned: set[str] = _NOISY_HOSTS, warned_late: set[str] = _LATE_HOSTS
    ) -> None:
        self.warned = {ShellNoiseIgnored: warned, LateOutputIgnored: warned_late}
        self.pending: list[ShellNoiseIgnored | LateOutputIgnored] = []

    def handle(self, event: Event) -> None:
        if isinstance(event, (ShellNoiseIgnored, LateOutputIgnored)):
            warned = self.warned[type(event)]
            if event.host not in warned:
                warned.add(event.host)
                self.pending.append(event)

    def close(self) -> None:
        from fleet.core.safetext import clean

        for event in self.pending:
            shown = " | ".join(event.lines[:NOISE_SHOWN_LINES])
            more = event.count - min(len(event.lines), NOISE_SHOWN_LINES)
            tail = f" (and {more} more)" if more > 0 else ""
            lines = "line" if event.count == 1 else "lines"
            if isinstance(event, LateOutputIgnored):
                said = (
                    f"{event.count} {lines} came after fleet's command had ended (ignored; "
                    "a background process it left, still writing?)"
                )
            else:
                said = (
                    f"the login shell printed {event.count} {lines} around fleet's command "
                    "(ignored; an rc file such as ~/.bashrc that talks when not interactive?)"
                )
            print(
                clean(f"fleet: warning: {event.host}: {said}: {shown}{tail}"),
                file=sys.stderr,
            )
        self.pending.clear()


class HeapTrim:
    """A handler that hands freed heap memory back to the OS every TRIM_EVERY_BYTES of output.

    Chunks read from SSH channels (up to 64 KiB each, below glibc's mmap threshold) are allocated
    by many worker threads and freed by others; glibc's heaps fragment, and freed memory inside
    them is not returned: with 128 hosts flooding at once (-f 128), fleet's RSS would grow with
    the volume of output though no Python object outlives its line. malloc_trim releases those
    free pages (a few ms per call), which keeps the peak nearly flat however much the hosts
    print; serving the chunks with mmap instead (mallopt) costs far more system time. A no-op
    without glibc.
    """

    def __init__(self) -> None:
        self.since = 0
        # Looked up at the first trim: most runs print too little to need one, and loading
        # ctypes costs ~3 ms.
        self._trim: Callable[[int], int] | None = None

    def handle(self, event: Event) -> None:
        if isinstance(event, OutputLine):
            self.since += len(event.line)
            if self.since >= TRIM_EVERY_BYTES:
                self.since = 0
                if self._trim is None:
                    self._trim = malloc_trim() or _no_trim
                self._trim(0)

    def close(self) -> None:
        return None


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None."""
    import ctypes

    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    return trim


def _no_trim(pad: int) -> int:
    return 0


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (a scheduler or `timeout` stopping fleet) cancels like Ctrl-C."""
    raise KeyboardInterrupt


class OutputCollector:
    """Keeps the last stdout lines of every host, per step, for verbs that read results (status,
    launch): a step's facts are its last line, the `log: ` lines before it its run's log tail.

    Bounded: KEEP_LINES lines per step (each already cut to LINE_MAX_BYTES by the reader), so a
    node that floods a status step cannot grow fleet's memory with it.
    """

    KEEP_LINES = 8  # the run step needs 6: up to 5 `log: ` lines, then its facts line

    def __init__(self) -> None:
        self.lines: dict[str, dict[str, list[str]]] = {}

    def handle(self, event: Event) -> None:
        if isinstance(event, OutputLine) and event.stream == "stdout":
            lines = self.lines.setdefault(event.host, {}).setdefault(event.step, [])
            lines.append(event.line)
            if len(lines) > 2 * self.KEEP_LINES:  # trimmed in batches: amortised O(1) per line
                del lines[: -self.KEEP_LINES]

    def close(self) -> None:
        return None

    def facts(self, host: str, step: str) -> dict[str, str]:
        """`key=value` words from the last stdout line of one step (its summary line).

        Only the last line: earlier ones may quote raw command lines (`proc 12 train.py pid=3`);
        and per step, since several steps report a `pid`.
        """
        lines = self.lines.get(host, {}).get(step, [])
        return parse_facts(lines[-1]) if lines else {}


def parse_facts(line: str) -> dict[str, str]:
    """`run=r1 state=running pid=12` -> {"run": "r1", ...}; words without `=` are ignored."""
    out: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key.replace("_", "").isalnum():
            out[key] = value
    return out
