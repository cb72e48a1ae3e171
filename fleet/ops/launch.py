"""`fleet launch`: one training job started on every selected node, as a chain of playbook runs.

launch = optional cleanup (before preflight: it clears the ghosts preflight would refuse on) ->
preflight (refuse on failure unless --force) -> optional janitor -> start on every node -> if the
start failed on any node or was cancelled (Ctrl-C), stop the run by its launch id on every node
where its start step ran, however that step ended (all or nothing), and the janitor on every
node where this launch started it (never one that was running before: the node says which).
One question covers it all when --cleanup or --janitor makes the launch destructive.

The launch id names the training run on the nodes (`--run-id`, the playbooks' `run_id` var, a
directory under the node's state dir); it is not the id of fleet's run records (runlog.py), one
per playbook run, of which a launch makes several.
"""

from __future__ import annotations

import math
import re
import secrets as tokens
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.core import defaults, nodeset
from fleet.core.digits import is_digits
from fleet.core.errors import ExitCode, InventoryError, PlaybookError, UsageError
from fleet.core.events import Event, Outcome, RunSummary, StepStarted
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, load_shipped
from fleet.core.safetext import clean
from fleet.core.shell import names_in
from fleet.engine.plan import Plan, host_variables
from fleet.engine.runner import OutputCollector, prepare
from fleet.inventory.build import kind
from fleet.node.janitor import RESUME_WARNING
from fleet.ops.jobs import Chain, Job, Phase, Settings, build, say


@dataclass(frozen=True)
class LaunchRequest:
    """Everything `fleet launch` was asked to do."""

    command: list[str]
    launch_id: str
    playbook: Playbook
    master_addr: str | None = None
    master_port: int | None = None
    nproc_per_node: int | None = None
    env_pairs: list[str] = field(default_factory=list)
    container: str | None = None
    launcher: str | None = None
    workdir: str | None = None
    output_dir: str | None = None
    force: bool = False
    cleanup: bool = False
    janitor: bool = False
    extra_vars: dict[str, Any] = field(default_factory=dict)


def new_launch_id() -> str:
    """Sortable, and unique across launches started in the same second (from any bastion):
    run-20261130-041233-3fa2c1d9. 32 random bits: a launch whose start is refused stops its
    launch id everywhere it ran, so an id shared with another launch would stop that launch's
    run."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{tokens.token_hex(4)}"


# A launch id names a directory on every node, next to the node's `current` pointer and lock
# files (which all start with '.'): a plain name, checked here before anything runs (launch.sh
# checks it again on the node).
LAUNCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
RESERVED_LAUNCH_IDS = frozenset({"current"})


def check_launch_id(value: str, option: str = "--run-id") -> str:
    """`value` when it can name a training run; else a UsageError (exit 2) saying why."""
    if value in RESERVED_LAUNCH_IDS:
        raise UsageError(
            f"{option} {value!r} is reserved: the node's pointer to its newest run has that name",
            hint="pick another name, e.g. --run-id llama-sft-3",
        )
    if not LAUNCH_ID.fullmatch(value):
        raise UsageError(
            f"{option} {value!r} is not a run id: use letters, digits, '.', '_', '-' and '+' "
            "(at most 128, starting with a letter or digit)",
            hint="e.g. --run-id llama-sft-3",
        )
    return value


def check_given_launch_id(overrides: dict[str, Any]) -> None:
    """stop and logs: a launch id given (--run-id, or --var run_id) must be one (exit 2)."""
    value = overrides.get("run_id")
    if value is not None and value != "":
        check_launch_id(str(value))


def refuse_launch_id_var(extra_vars: dict[str, Any]) -> None:
    """launch names its run with --run-id only: fleet stops it by that name on a failed start."""
    if "run_id" in extra_vars:
        raise UsageError(
            "launch: --var run_id would rename the run behind fleet's back",
            hint="name the run with --run-id",
        )


# What `launch.sh stop` takes besides its grace: up to 15 s for a start's lock, KILL and 5 s for
# it to land, and each TERM round's look through /proc (so the grace itself counted twice).
STOP_LOCK_AND_KILL_S = 60


def stop_playbook(
    playbook: Playbook, hosts: Sequence[Host], overrides: Mapping[str, Any]
) -> Playbook:
    """The stop playbook with its step timeout long enough for the largest grace any host gets
    (--grace, --var, the inventory, the playbook's default): a step cut short by its own
    timeout never sends the KILL, and leaves what ignores TERM running."""
    longest = 0.0
    for index, host in enumerate(hosts):
        value = host_variables(host, playbook, overrides, index, len(hosts)).get("grace")
        try:
            grace = float(str(value))
        except ValueError:
            continue  # launch.sh refuses it on the node
        if math.isfinite(grace):
            longest = max(longest, grace)
    need = 2 * longest + STOP_LOCK_AND_KILL_S
    steps = tuple(
        replace(step, timeout_s=need)
        if step.timeout_s is not None and step.timeout_s < need
        else step
        for step in playbook.steps
    )
    return replace(playbook, steps=steps)


def command_words(command: Sequence[str], env_pairs: Sequence[str]) -> list[str]:
    """The training command's words (a leading `--` dropped), not empty; every --env NAME=VALUE."""
    words = list(command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError(
            "launch: no training command", hint="fleet launch -- train.py --deepspeed ds.json"
        )
    for pair in env_pairs:
        if "=" not in pair or not pair.split("=", 1)[0].isidentifier():
            raise UsageError(
                f"--env '{pair}': expected NAME=VALUE", hint="e.g. --env NCCL_DEBUG=INFO"
            )
    return words


def check_launcher(text: str | None) -> str | None:
    """--launcher: shell words with balanced quotes, not empty."""
    if text is None:
        return None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(
            f"--launcher {text!r}: {exc}", hint="e.g. --launcher /opt/venv/bin/torchrun"
        ) from None
    if not words:
        raise UsageError("--launcher is empty", hint="e.g. --launcher /opt/venv/bin/torchrun")
    return text


Rule = Callable[[Any], str | None]  # why a value will not do, or None


# The vars the launch playbook takes from the inventory (or --var, or the playbook's defaults),
# judged before anything runs by the rules their options follow: a value the node cannot use
# (`gpus: abc` as --nproc_per_node=abc, `env: abc` as `--env abc`) fails there, or starts a
# broken run. Each rule says why a value will not do, or None; never quoting it (an inventory's
# `env` holds tokens).
def _whole(name: str, option: str, low: int, high: int) -> Rule:
    def problem(value: Any) -> str | None:
        number = int(value) if isinstance(value, str) and is_digits(value) else value
        if isinstance(number, int) and not isinstance(number, bool) and low <= number <= high:
            return None
        return f"{name} must be a whole number {low}-{high} (as {option}), got {kind(value)}"

    return problem


def _env_problem(value: Any) -> str | None:
    """A mapping NAME: value (or a list of NAME=VALUE, as --env takes them); names as --env's."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        pairs = [(k, v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        pairs = []
        for number, item in enumerate(value, 1):
            name, sep, rest = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep:
                return f"env item {number} is not NAME=VALUE"
            pairs.append((name, rest))
    else:
        return f"env must be a mapping NAME: value (as --env NAME=VALUE), got {kind(value)}"
    for name, item in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            return f"env: {_name(name)} is not a variable name (letters, digits, _)"
        if isinstance(item, (Mapping, list, tuple)):
            return f"env: the value of {name} is {kind(item)}, not text"
    return None


def _name(name: Any) -> str:
    """An env name for a message: up to its first '=' (what follows may be a value)."""
    return repr(str(name).partition("=")[0][:64])


def _launcher_problem(value: Any) -> str | None:
    """Shell words in one string, or a list of words, not empty (as --launcher)."""
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(w, str) for w in value):
            return None
        return "launcher must be a non-empty list of words (text)"
    if not isinstance(value, str):
        return f"launcher must be a command (shell words, or a list of words), got {kind(value)}"
    try:
        words = shlex.split(value)
    except ValueError:
        return "launcher is not valid shell words (unbalanced quotes)"
    return None if words else "launcher is empty"


def _text(name: str) -> Rule:
    def problem(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return None
        return f"{name} must be text, got {kind(value)}"

    return problem


# name -> (its rule, the hint of an error about it)
VALUE_RULES: dict[str, tuple[Rule, str]] = {
    "gpus": (_whole("gpus", "--nproc-per-node", 1, 1024), "processes per node, e.g. gpus: 8"),
    "master_port": (
        _whole("master_port", "--master-port", 1, 65535),
        "e.g. master_port: 29500",
    ),
    "env": (_env_problem, "a mapping of environment variables, e.g. env: {NCCL_DEBUG: INFO}"),
    "launcher": (
        _launcher_problem,
        "e.g. launcher: /opt/venv/bin/torchrun, or a list: [/opt/venv/bin/python, -m, "
        "torch.distributed.run]",
    ),
    "container": (_text("container"), "a container name, e.g. container: trainer"),
    "workdir": (_text("workdir"), "a directory on the node, e.g. workdir: /srv/train"),
}


def check_values(req: LaunchRequest, hosts: Sequence[Host]) -> None:
    """Refuse, before anything runs, a value the launch would hand the nodes that its option
    would refuse: from --var (exit 2), the inventory (exit 1, naming where it was written and
    the hosts that have it) or the playbook's defaults (exit 1). Only the vars the playbook's
    steps use and master_addr (fleet's own), each where it is in effect: not under the option
    that overrides it, master_addr only from the first host."""
    used = {n for step in req.playbook.steps for n in names_in(step.run)} | {"master_addr"}
    rules = {**VALUE_RULES, "master_addr": (_master_addr_problem, MASTER_ADDR_HINT)}
    for name, value in req.extra_vars.items():
        rule, hint = rules.get(name, (None, ""))
        problem = rule(value) if rule is not None and name in used else None
        if problem is not None:
            raise UsageError(f"launch: --var {problem}", hint=hint)
    given = _given(req)
    for name, (rule, hint) in rules.items():
        if name in used and name not in given:
            first_only = name in ("master_addr", "master_port")  # the master's: one for all
            _check_value(req, hosts[:1] if first_only else hosts, name, rule, hint)


MASTER_ADDR_HINT = "the rendezvous address, e.g. master_addr: 10.0.0.1 (or pass --master-addr)"


def _master_addr_problem(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    return f"master_addr must be an address (text, as --master-addr), got {kind(value)}"


def _given(req: LaunchRequest) -> set[str]:
    """The vars the launch's own options set (click checked them) or --var sets."""
    options = {
        "gpus": req.nproc_per_node,
        "master_port": req.master_port,
        "master_addr": req.master_addr,
        "launcher": req.launcher,
        "container": req.container,
        "workdir": req.workdir,
    }
    return {n for n, v in options.items() if v} | set(req.extra_vars)


def _check_value(
    req: LaunchRequest, hosts: Sequence[Host], name: str, rule: Rule, hint: str
) -> None:
    """Each host's value of `name` (the inventory's, else the playbook's default) judged by
    `rule`; the first bad one is an error naming where it was written and every host that has
    it from there."""
    bad: dict[tuple[str, str | None], list[str]] = {}
    for host in hosts:
        if name in host.vars:
            value, where = host.vars[name], host.var_origin(name) or ""
        elif name in req.playbook.vars:
            value, where = req.playbook.vars[name], None
        else:
            continue  # undefined: the plan says so, naming the step
        problem = rule(value)
        if problem is not None:
            bad.setdefault((problem, where), []).append(host.name)
    if not bad:
        return
    (problem, where), names = next(iter(bad.items()))
    if where is None:
        raise PlaybookError(f"{req.playbook.path}: vars: launch: {problem}", hint=hint)
    place = f"{where}: " if where else ""
    raise InventoryError(
        f"{place}launch: {problem} (inventory var of {nodeset.fold(names)})", hint=hint
    )


def master_address(req: LaunchRequest, hosts: Sequence[Host]) -> str:
    """Explicit --master-addr (or --var master_addr), else the first host's `master_addr` var,
    else its address.

    Never guessed on the node (`hostname -I` can pick the wrong NIC, PITFALLS 17).
    """
    if req.master_addr:
        return req.master_addr
    if req.extra_vars.get("master_addr"):
        return str(req.extra_vars["master_addr"])
    first = hosts[0]
    return str(first.vars.get("master_addr") or first.address)


def master_port(req: LaunchRequest, hosts: Sequence[Host]) -> Any:
    """Explicit --master-port (or --var master_port), else the first host's `master_port` var,
    else the playbook's.

    Every rank meets the master at the same port: one host's inventory value (the master's)
    must not leave the others on the playbook's default, where they would wait for a master
    that is not there until the rendezvous times out.
    """
    if req.master_port is not None:
        return req.master_port
    if "master_port" in req.extra_vars:
        return req.extra_vars["master_port"]
    first = hosts[0]
    if "master_port" in first.vars:
        return first.vars["master_port"]
    return req.playbook.vars.get("master_port", defaults.PORT)


def start_vars(req: LaunchRequest, hosts: Sequence[Host]) -> dict[str, Any]:
    """Variables for the launch playbook (rank and count come per host from the plan); the
    master's address and port are the same for every host."""
    out: dict[str, Any] = {
        "run_id": req.launch_id,
        "master_addr": master_address(req, hosts),
        "master_port": master_port(req, hosts),
        "command": req.command,
        "extra_env": req.env_pairs,
    }
    if req.nproc_per_node is not None:
        out["gpus"] = req.nproc_per_node
    if req.container:
        out["container"] = req.container
    if req.launcher:
        out["launcher"] = req.launcher
    if req.workdir:
        out["workdir"] = req.workdir
    out.update(req.extra_vars)
    return out


def _dir_vars(req: LaunchRequest) -> dict[str, Any]:
    """The output dir (when given) plus --var values, which apply to every phase."""
    given = {"output_dir": req.output_dir} if req.output_dir else {}
    return {**given, **req.extra_vars}


def _cleanup_vars(req: LaunchRequest, hosts: Sequence[Host]) -> dict[str, Any]:
    """Cleanup frees the port this launch will use (not only the default one)."""
    return {"port": master_port(req, hosts), **req.extra_vars}


def _preflight_vars(req: LaunchRequest, hosts: Sequence[Host]) -> dict[str, Any]:
    return {"master_port": master_port(req, hosts), **_dir_vars(req)}


def _janitor_vars(req: LaunchRequest) -> dict[str, Any]:
    return {"action": "start", **_dir_vars(req)}


def launch_job(req: LaunchRequest, opts: Settings, hosts: Sequence[Host]) -> Job:
    """Every phase's plan, checked before anything connects (a --cleanup or --janitor phase whose
    state paths or delete globs fleet would refuse on its own is refused here). Both are
    destructive, as `fleet cleanup` and `fleet janitor start` are: one question (or, with no
    terminal, one refusal) names the launch with them, after the janitor's warning."""
    check_values(req, hosts)
    cleanup = janitor = None
    if req.cleanup:
        cleanup = build(opts, load_shipped("cleanup"), _cleanup_vars(req, hosts), hosts)
    preflight = build(opts, load_shipped("preflight"), _preflight_vars(req, hosts), hosts)
    if req.janitor:
        janitor = build(opts, load_shipped("janitor"), _janitor_vars(req), hosts)
    start = build(opts, req.playbook, start_vars(req, hosts), hosts)
    phases = (cleanup, preflight, janitor, start)
    return Job(
        plans=tuple(plan for plan in phases if plan is not None),
        chain=_chain(req, opts, hosts, *phases),
        ask=cleanup or janitor,
        notice=RESUME_WARNING if janitor is not None else "",
        question=_question(req),
    )


def _question(req: LaunchRequest) -> str:
    """`'launch' with --cleanup and --janitor`: what the one question is about."""
    flags = [flag for flag, on in (("--cleanup", req.cleanup), ("--janitor", req.janitor)) if on]
    return f"'{req.playbook.name}' with {' and '.join(flags)}" if flags else ""


def _say(message: str) -> None:
    say(clean(message), err=True)


def _chain(
    req: LaunchRequest,
    opts: Settings,
    hosts: Sequence[Host],
    cleanup: Plan | None,
    preflight: Plan,
    janitor: Plan | None,
    start: Plan,
) -> Chain:
    """The launch phases in order; the exit code is that of the phase that decided the outcome."""
    if cleanup is not None:
        done = yield Phase(cleanup, cancelling=None)
        if done.exit_code is not ExitCode.OK:
            _say(f"fleet: cleanup failed on {nodeset.fold(done.failed)}: not launching")
            return done.exit_code
    pre = yield Phase(preflight, cancelling=None)
    if pre.exit_code is not ExitCode.OK:
        bad = nodeset.fold(pre.failed)
        if not req.force:
            _say(f"fleet: preflight failed on {bad}: not launching (fix it, or pass --force)")
            return pre.exit_code
        _say(f"fleet: preflight failed on {bad}; launching anyway (--force)")
    janitors = _Janitors(hosts)
    if janitor is not None:
        done = yield Phase(janitor, listeners=[janitors.collector], cancelling=None)
        janitors.read(done)
        if done.exit_code is not ExitCode.OK:
            _say(f"fleet: janitor failed to start on {nodeset.fold(done.failed)}: not launching")
            yield from _stop_janitors(req, opts, janitors)
            return done.exit_code
    reached = _StepsReached()
    said = OutputCollector()
    cancelling = clean(
        f"fleet: cancelling the start of run {req.launch_id}: it will be stopped wherever it "
        "started (Ctrl-C again to abort at once, leaving that to you)"
    )
    started = yield Phase(start, listeners=[reached, said], cancelling=cancelling)
    if started.exit_code is ExitCode.OK:
        master = master_address(req, hosts)
        port = master_port(req, hosts)
        names = nodeset.fold(h.name for h in hosts)
        _say(
            f"fleet: run {req.launch_id} started on {len(hosts)} hosts {names} "
            f"(master {master}:{port}); follow with `fleet logs -f`, stop with `fleet stop`"
        )
        return ExitCode.OK
    refused = _refused(started, said)
    if refused:
        _say(
            f"fleet: {nodeset.fold(refused)} refused the start of run {req.launch_id} and "
            "started nothing: whatever runs there is left alone"
        )
    touched = [h for h in hosts if h.name in reached.hosts and h.name not in refused]
    if touched or not refused:  # refused everywhere: started nowhere, as said above
        yield from _roll_back(req, opts, touched, started)
    yield from _stop_janitors(req, opts, janitors)
    return started.exit_code


class _StepsReached:
    """Reporter: the hosts where a step started. Where the start step started, the run may run,
    whatever the step's outcome says: a cancelled or timed-out step may have been stopped after
    its job was launched, and a node that went away mid-step may have launched it all the same."""

    def __init__(self) -> None:
        self.hosts: set[str] = set()

    def handle(self, event: Event) -> None:
        if isinstance(event, StepStarted):
            self.hosts.add(event.host)

    def close(self) -> None:
        return None


# What `launch.sh start` says last when it refused before starting anything (a live run, even one
# of the same id; a run id used before; another start or stop holding the node's lock).
_REFUSED = "start: refused: "


def _refused(started: RunSummary, said: OutputCollector) -> list[str]:
    """The hosts whose start step ran to its end and refused: nothing of this launch runs there,
    and a stop by its launch id would end what the refusal protected (a run of the same id)."""
    out = []
    for result in started.results:
        lines = said.lines.get(result.host, {}).get("start", [])
        if result.outcome is Outcome.FAILED and lines and lines[-1].startswith(_REFUSED):
            out.append(result.host)
    return out


# What `launch.sh stop` says last, per node (see its action_stop).
_STOPPED = "stopped run="
_NOTHING = ("stop: no run on this node", "stop: run ")


def _roll_back(
    req: LaunchRequest, opts: Settings, touched: Sequence[Host], started: RunSummary
) -> Chain:
    """All or nothing: stop this run, by its launch id (never another), on every node its start
    reached (the janitor is _stop_janitors' to stop).

    On a node whose start was interrupted, launch.sh already stopped what it had begun, and the
    stop finds nothing; on one where it completed, or where the interruption could not be
    delivered, the stop ends it. The stop gets the launch's --var values: a run started under
    `--var state_dir=...` is looked for there, not in the default state dir. Returns the start's
    exit code (130 after Ctrl-C)."""
    failed = nodeset.fold(started.failed)
    if started.interrupted:
        why = "launch interrupted"
    else:
        why = f"run {req.launch_id} failed to start on {failed}"
    if not touched:
        _say(f"fleet: {why}; its start ran on no node, so it started nowhere")
        return started.exit_code
    _say(
        f"fleet: {why}; stopping run {req.launch_id} wherever its start ran: "
        f"{nodeset.fold(h.name for h in touched)} (all or nothing)"
    )
    collector = OutputCollector()
    stop_vars = {**req.extra_vars, "run_id": req.launch_id, "grace": defaults.ROLLBACK_GRACE_S}
    plan = prepare(opts.run, load_shipped("stop"), stop_vars, touched)
    stopped = yield Phase(plan, listeners=[collector], cancelling=None)
    for line in _rollback_report(req.launch_id, stopped, collector):
        _say(line)
    return started.exit_code


def _rollback_report(launch_id: str, stopped: RunSummary, collector: OutputCollector) -> list[str]:
    """Where the rollback stopped the run and where nothing of it was left (one line), and where
    it could not make sure (a line of its own: those nodes need the operator)."""
    ended: list[str] = []
    nothing: list[str] = []
    unsure: list[str] = []
    for result in stopped.results:
        lines = collector.lines.get(result.host, {}).get("stop", [])
        last = lines[-1] if lines else ""
        if result.outcome is Outcome.OK and last.startswith(_STOPPED):
            ended.append(result.host)
        elif result.outcome is Outcome.OK and last.startswith(_NOTHING):
            nothing.append(result.host)
        else:
            unsure.append(result.host)
    parts = []
    if ended:
        parts.append(f"stopped on {nodeset.fold(ended)}")
    if nothing:
        parts.append(f"nothing of it running on {nodeset.fold(nothing)}")
    lines = [f"fleet: run {launch_id} rolled back: {'; '.join(parts)}"] if parts else []
    if unsure:
        lines.append(
            f"fleet: could not stop run {launch_id} on {nodeset.fold(unsure)}: it may still be "
            f"running there; check with `fleet status`, stop it with "
            f"`fleet stop --run-id {launch_id}`"
        )
    return lines


# What `janitor-loop.sh start` says last, per node (see its start_janitor): a janitor this
# launch started, or one that was running before it (which a rollback leaves alone).
_JANITOR_STARTED = "janitor: started for "
_JANITOR_RUNNING = "janitor: already running for "
# What `janitor-loop.sh stop` says last: the janitor ended, or it was no longer running.
_JANITOR_ENDED = ("janitor: stopped for ", "janitor: not running for ")


class _Janitors:
    """Where the launch's janitor phase started a janitor, where one was running before it, and
    where the phase cannot say (its step cut short: unreachable, timed out, cancelled)."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        self.hosts = hosts
        self.collector = OutputCollector()
        self.ours: list[Host] = []
        self.theirs: list[str] = []
        self.unsure: list[str] = []

    def read(self, done: RunSummary) -> None:
        by_name = {h.name: h for h in self.hosts}
        for result in done.results:
            lines = self.collector.lines.get(result.host, {}).get("janitor", [])
            last = lines[-1] if lines else ""
            if last.startswith(_JANITOR_STARTED):
                self.ours.append(by_name[result.host])
            elif last.startswith(_JANITOR_RUNNING):
                self.theirs.append(result.host)
            elif result.outcome not in (Outcome.FAILED, Outcome.SKIPPED):
                # FAILED: janitor-loop.sh refused, and started nothing; anything else may have
                # been cut after the daemon started.
                self.unsure.append(result.host)


def _stop_janitors(req: LaunchRequest, opts: Settings, janitors: _Janitors) -> Chain:
    """The launch did not start its run: stop the janitor where this launch started it (by its
    dir, as `fleet janitor stop` does), and say where a janitor is left running and why."""
    if janitors.theirs:
        _say(
            f"fleet: janitor left running on {nodeset.fold(janitors.theirs)}: it was running "
            "before this launch"
        )
    if janitors.unsure:
        _say(
            f"fleet: the janitor may have started on {nodeset.fold(janitors.unsure)}: check "
            f"with `{_janitor_command(req, 'status')}`, stop it with "
            f"`{_janitor_command(req, 'stop')}`"
        )
    if not janitors.ours:
        return ExitCode.OK
    collector = OutputCollector()
    plan = prepare(opts.run, load_shipped("janitor"), _janitor_stop_vars(req), janitors.ours)
    stopped = yield Phase(plan, listeners=[collector], cancelling=None)
    ended: list[str] = []
    unsure: list[str] = []
    for result in stopped.results:
        lines = collector.lines.get(result.host, {}).get("janitor", [])
        last = lines[-1] if lines else ""
        ok = result.outcome is Outcome.OK and last.startswith(_JANITOR_ENDED)
        (ended if ok else unsure).append(result.host)
    if ended:
        _say(f"fleet: janitor started by this launch stopped on {nodeset.fold(ended)}")
    if unsure:
        _say(
            f"fleet: could not stop the janitor this launch started on {nodeset.fold(unsure)}: "
            f"it may still be deleting files there; stop it with `{_janitor_command(req, 'stop')}`"
        )
    return ExitCode.OK


def _janitor_stop_vars(req: LaunchRequest) -> dict[str, Any]:
    return {**_janitor_vars(req), "action": "stop"}


def _janitor_command(req: LaunchRequest, action: str) -> str:
    """The `fleet janitor` command for this launch's janitor (its --dir, when one was given)."""
    given = f" --dir {shlex.quote(req.output_dir)}" if req.output_dir else ""
    return f"fleet janitor {action}{given}"
