"""fleet/remote/launch.sh run locally under dash, the way a node runs it (no sshd needed).

The jobs are small sh scripts that behave like torchrun: the "launcher" starts "workers" with
setsid (torchrun gives each worker a session of its own), so when the launcher dies they are
re-parented away from it, out of its process group and session. Each test's run id is unique, and
every process a test started is found by that run's marker and killed by pid at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import _with_includes
from fleet.engine.runner import parse_facts
from fleet.node.runstate import RunState, decide
from fleet.remote import __file__ as remote_init

SCRIPT = Path(remote_init).with_name("launch.sh")
# launcher: two workers in sessions of their own, one of them ignoring TERM, then waits
TRAINING = """\
setsid sh -c 'echo "worker $$"; exec sleep 300' &
setsid sh -c 'trap "" TERM; echo "stubborn $$"; while :; do sleep 0.2; done' &
echo "launcher $$"
sleep 300
"""


def marked(run_id: str) -> list[int]:
    """Pids of live processes whose environment carries FLEET_RUN_ID=run_id."""
    want = f"FLEET_RUN_ID={run_id}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if want in env.split(b"\0"):
            out.append(int(entry))
    return out


class Node:
    """launch.sh ACTION ... with a state dir of the test's own."""

    def __init__(self, tmp_path: Path) -> None:
        self.state = tmp_path / "state"
        self.text = _with_includes(SCRIPT, SCRIPT.parent, ())
        self.runs: list[str] = []
        self.env = {**os.environ, "FLEET_LAUNCH_SETTLE_DS": "3"}
        self.script = tmp_path / "launch.sh"  # what spawn() feeds on stdin
        self.script.write_text(self.text)

    def argv(self, action: str, *args: str) -> list[str]:
        return [DASH, "-s", "--", action, "--state-dir", str(self.state), *args]

    def __call__(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(action, *args),
            input=self.text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=self.env,
        )

    def spawn(self, action: str, *args: str) -> subprocess.Popen[str]:
        """launch.sh in the background, in a session of its own as sshd starts a step: fleet's
        kill of a cancelled step signals that whole session."""
        with self.script.open() as stdin:
            return subprocess.Popen(
                self.argv(action, *args),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.env,
                start_new_session=True,
            )

    def job(self, text: str) -> tuple[str, list[str]]:
        """A new run id, and the start arguments that run `text` as the job."""
        run_id = f"t-{uuid.uuid4().hex[:10]}"
        self.runs.append(run_id)
        script = self.state.parent / f"{run_id}.sh"
        script.write_text(text)
        return run_id, ["--run-id", run_id, "--", "sh", str(script)]

    def start(self, job: str, *env: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        run_id, args = self.job(job)
        pairs = [w for kv in env for w in ("--env", kv)]
        return run_id, self("start", *pairs, *args)

    def facts(self) -> dict[str, str]:
        out = self("status").stdout.splitlines()
        return parse_facts(out[-1]) if out else {}

    def file(self, run_id: str, name: str) -> str:
        return (self.state / run_id / name).read_text().strip()


DASH = shutil.which("dash") or "dash"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A node with dash and flock(1), which launch.sh's lock needs."""
    if not shutil.which("dash"):
        pytest.skip("dash is not installed")
    if not shutil.which("flock"):
        pytest.skip("flock(1) is not installed")
    n = Node(tmp_path)
    yield n
    for run_id in n.runs:
        for pid in marked(run_id):
            with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
                os.kill(pid, signal.SIGKILL)


def _path_without(bin_dir: Path, missing: str) -> Path:
    """A directory of links to every command on PATH but `missing`."""
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = bin_dir / name
            if name != missing and not link.exists() and os.access(f"{directory}/{name}", os.X_OK):
                link.symlink_to(f"{directory}/{name}")
    assert not (bin_dir / missing).exists()
    return bin_dir


def pids_in_log(node: Node, run_id: str) -> dict[str, int]:
    """TRAINING's `launcher PID`, `worker PID`, `stubborn PID` lines."""
    lines = (node.state / run_id / "log").read_text().splitlines()
    return {w[0]: int(w[1]) for w in (x.split() for x in lines) if len(w) == 2 and w[1].isdigit()}


def poll(check: Callable[[], object], timeout_s: float = 10) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    return check()


def test_start_marks_every_process_of_the_run_and_status_reports_it_running(node: Node) -> None:
    run_id, started = node.start(TRAINING, "EXTRA=x y")
    assert started.returncode == 0, started.stdout + started.stderr
    launcher = int(node.file(run_id, "launcher"))
    assert f"started run={run_id} pid={launcher} " in started.stdout
    # wrapper + launcher + 2 workers (+ the stubborn one's sleep, now and then)
    assert poll(lambda: len(marked(run_id)) >= 4)
    assert launcher in marked(run_id)
    facts = node.facts()
    assert facts["run"] == run_id
    assert facts["launcher"] == "alive"
    assert facts["launcher_pid"] == str(launcher)
    assert int(facts["procs"]) >= 2
    assert decide(facts).state is RunState.RUNNING
    # env values reach the job, never the record
    assert "x y" not in (node.state / run_id / "env-keys").read_text()


def test_a_killed_launcher_leaves_orphans_that_status_flags_and_stop_ends(node: Node) -> None:
    run_id, started = node.start(TRAINING)
    assert started.returncode == 0, started.stdout + started.stderr
    assert poll(lambda: len(pids_in_log(node, run_id)) == 3)
    pids = pids_in_log(node, run_id)
    workers = {pids["worker"], pids["stubborn"]}
    os.kill(int(node.file(run_id, "launcher")), signal.SIGKILL)  # the agent dies (OOM, kill -9)
    assert poll((node.state / run_id / "exit").exists)

    facts = node.facts()
    assert (facts["launcher"], facts["exit"]) == ("gone", "137")
    run = decide(facts)
    assert run.state is RunState.ORPHANED, facts
    assert run.detail.startswith("launcher killed by SIGKILL; ")
    assert all(pid in marked(run_id) for pid in workers), "the workers died with the launcher"

    second, refused = node.start("sleep 30\n")
    assert refused.returncode == 1
    assert f"start: refused: run {run_id} is still running" in refused.stdout
    assert not (node.state / second).exists() or not marked(second)

    stopped = node("stop", "--grace", "0.5")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    lines = stopped.stdout.splitlines()
    assert lines[-1] == f"stopped run={run_id}: none of its processes is left"
    # "killed pid=P by SIG: CMDLINE" for every process, with the signal that ended it
    by = {
        int(words[1].removeprefix("pid=")): words[3].rstrip(":")
        for words in (line.split() for line in lines if line.startswith("killed pid="))
    }
    assert workers <= set(by), lines
    assert by[pids["worker"]] == "TERM"
    assert by[pids["stubborn"]] == "KILL", "the worker that ignores TERM needs KILL"
    assert marked(run_id) == []
    facts = node.facts()
    assert (facts["procs"], facts["stopped"]) == ("0", "1")
    assert decide(facts).state is RunState.STOPPED


# like torchrun: on TERM the launcher ends its workers at once, before stop gets to them
TEARS_DOWN = """\
for n in $(seq 30); do setsid sh -c 'echo "worker $$"; exec sleep 300' & w="$w $!"; done
trap 'kill -KILL $w; exit 1' TERM
echo "launcher $$"
wait
"""


def test_stop_names_the_command_line_of_a_process_its_launcher_ended_first(node: Node) -> None:
    """A worker the launcher kills on TERM is gone (a zombie, its cmdline empty) by the time
    stop would read it: stop reads every command line before it signals any process."""
    run_id, started = node.start(TEARS_DOWN)
    assert started.returncode == 0, started.stdout + started.stderr
    assert poll(lambda: len(marked(run_id)) >= 32)
    stopped = node("stop", "--grace", "2")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    killed = [line for line in stopped.stdout.splitlines() if line.startswith("killed pid=")]
    assert len(killed) >= 32, stopped.stdout
    assert all(line.split(": ", 1)[1].strip() for line in killed), killed
    assert sum("sleep 300" in line for line in killed) == 30, killed


@pytest.mark.parametrize(("code", "state"), [(0, RunState.FINISHED), (3, RunState.FAILED)])
def test_a_run_that_ends_is_finished_or_failed_with_its_exit_status(
    node: Node, code: int, state: RunState
) -> None:
    run_id, started = node.start(f"echo working; sleep 2; echo 'last words'; exit {code}\n")
    assert started.returncode == 0, started.stdout + started.stderr
    assert poll((node.state / run_id / "exit").exists)
    out = node("status").stdout.splitlines()
    run = decide(parse_facts(out[-1]), [x[5:] for x in out[:-1]])
    assert run.state is state
    assert run.detail == f"exit {code}"
    assert run.log_tail[-1] == "last words"


def test_a_command_that_dies_at_once_is_a_failed_start(node: Node) -> None:
    _, started = node.start("echo 'no such option: --bogus' >&2; exit 2\n")
    assert started.returncode == 1
    assert "log: no such option: --bogus" in started.stdout
    assert "start: the run exited at once" in started.stdout
    # status shows the failed start, with the reason from its log
    out = node("status").stdout.splitlines()
    run = decide(parse_facts(out[-1]), [x[5:] for x in out[:-1]])
    assert (run.state, run.detail) == (RunState.FAILED, "exit 2")
    assert run.log_tail == ("no such option: --bogus",)


def test_stop_with_nothing_left_says_so_and_succeeds(node: Node) -> None:
    run_id, started = node.start("sleep 1\n")
    assert started.returncode == 0, started.stdout + started.stderr
    assert poll((node.state / run_id / "exit").exists)
    stopped = node("stop")
    assert stopped.returncode == 0
    assert stopped.stdout.startswith(f"stop: run {run_id} is not running: nothing to stop")
    assert not (node.state / run_id / "stopped").exists()


# A trainer that saves on TERM: it counts the TERMs it gets while it takes a second to save.
SAVER = """n=0 first=''
trap 'n=$((n + 1)); [ -n "$first" ] || first=$n' TERM
while [ -z "$first" ]; do sleep 0.05; done
i=0; while [ $i -lt 20 ]; do sleep 0.05; i=$((i + 1)); done
echo "saved after $n TERM"
"""


def test_stop_sends_each_process_one_term_not_one_every_round(node: Node) -> None:
    """A job that handles TERM (a checkpoint save) gets it once, as from docker stop or
    systemd: TERM ten times a second re-enters its handler, mid-save, for the whole grace."""
    run_id, started = node.start(SAVER)
    assert started.returncode == 0, started.stdout + started.stderr
    stopped = node("stop", "--grace", "5")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    log = (node.state / run_id / "log").read_text()
    assert "saved after 1 TERM" in log, log


def test_the_marker_cannot_be_overridden_by_the_jobs_env(node: Node) -> None:
    run_id, started = node.start("sleep 30\n", "FLEET_RUN_ID=someone-else")
    assert started.returncode == 0, started.stdout + started.stderr
    assert int(node.file(run_id, "launcher")) in marked(run_id)


# ---------------------------------------------------------------- the start is one transaction

SLEEPER = "echo up; exec sleep 300\n"


def current(node: Node) -> str | None:
    path = node.state / "current"
    return path.read_text().strip() if path.exists() else None


def test_two_starts_at_once_start_one_run(node: Node) -> None:
    """The check for a running run and the start are one step under the node's lock: of two
    starts racing, one starts and the other is refused, never both."""
    for _ in range(3):
        ids_args = [node.job(SLEEPER) for _ in range(2)]
        procs = [node.spawn("start", *args) for _, args in ids_args]
        outs = [(p.communicate(timeout=60)[0], p.returncode) for p in procs]
        started = [run_id for (run_id, _), (_, rc) in zip(ids_args, outs, strict=True) if rc == 0]
        assert len(started) == 1, outs
        refused = [out for out, rc in outs if rc != 0]
        assert refused[0].startswith("start: refused: "), refused
        assert current(node) == started[0]
        loser = next(run_id for run_id, _ in ids_args if run_id != started[0])
        assert marked(loser) == []
        stopped = node("stop", "--grace", "0.5")
        assert stopped.returncode == 0, stopped.stdout


def _wait_for_launcher(node: Node, run_id: str, proc: subprocess.Popen[str]) -> int:
    launcher = node.state / run_id / "launcher"
    assert poll(lambda: launcher.exists() and launcher.read_text().strip()), proc.poll()
    pid = int(launcher.read_text())
    assert poll(lambda: pid in marked(run_id))
    return pid


def test_a_start_interrupted_before_it_is_recorded_stops_its_run_and_keeps_current(
    node: Node,
) -> None:
    """Fleet cancels a start by signalling the step's session (TERM): the run the start already
    began is stopped, `current` keeps naming the previous run, and the lock is free again."""
    first, started = node.start("sleep 0.2\n")
    assert started.returncode == 0 or "exited at once" in started.stdout, started.stdout
    assert current(node) == first
    node.env["FLEET_LAUNCH_SETTLE_DS"] = "100"  # 10 s between the launch and the record
    run_id, args = node.job(SLEEPER)
    proc = node.spawn("start", *args)
    _wait_for_launcher(node, run_id, proc)
    assert current(node) == first  # not recorded before the settle is over

    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)

    assert proc.returncode != 0
    assert f"start: interrupted: run {run_id} stopped on this node" in out, out
    assert marked(run_id) == [], "the interrupted start left its run running"
    assert current(node) == first
    assert (node.state / run_id / "aborted").exists()
    node.env["FLEET_LAUNCH_SETTLE_DS"] = "3"
    after, again = node.start(SLEEPER)
    assert again.returncode == 0, again.stdout  # the lock was released
    assert current(node) == after


def test_a_start_killed_outright_neither_wedges_the_lock_nor_hides_its_run(node: Node) -> None:
    """SIGKILL leaves no chance to clean up: the lock must not stay taken (flock dies with its
    holder), and the run that start left behind, though never recorded as current, refuses the
    next start until it is stopped by its id."""
    node.env["FLEET_LAUNCH_SETTLE_DS"] = "100"
    run_id, args = node.job(SLEEPER)
    proc = node.spawn("start", *args)
    _wait_for_launcher(node, run_id, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert current(node) is None
    assert marked(run_id), "the job should have outlived its killed start"
    node.env["FLEET_LAUNCH_SETTLE_DS"] = "3"

    _, refused = node.start(SLEEPER)
    assert refused.returncode == 1
    assert refused.stdout.startswith(f"start: refused: run {run_id} is still running"), (
        refused.stdout
    )
    stopped = node("stop", "--run-id", run_id, "--grace", "0.5")
    assert stopped.returncode == 0, stopped.stdout
    assert marked(run_id) == []
    later, started = node.start(SLEEPER)
    assert started.returncode == 0, started.stdout
    assert current(node) == later


def test_stop_waits_for_a_start_in_flight_and_stops_what_it_recorded(node: Node) -> None:
    node.env["FLEET_LAUNCH_SETTLE_DS"] = "20"
    run_id, args = node.job(SLEEPER)
    proc = node.spawn("start", *args)
    _wait_for_launcher(node, run_id, proc)
    stopped = node("stop", "--grace", "0.5")  # the current run, once the start recorded it
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert stopped.returncode == 0, stopped.stdout
    assert stopped.stdout.splitlines()[-1] == f"stopped run={run_id}: none of its processes is left"
    assert marked(run_id) == []


def test_without_flock_start_and_stop_refuse_saying_so_and_start_nothing(tmp_path: Path) -> None:
    if not shutil.which("dash"):
        pytest.skip("dash is not installed")
    node = Node(tmp_path)
    node.env["PATH"] = str(_path_without(tmp_path / "bin", "flock"))
    run_id, refused = node.start(SLEEPER)
    for result in (refused, node("stop", "--grace", "0.5")):
        assert result.returncode == 1, result.stdout
        assert result.stdout.splitlines()[-1] == (
            "launch.sh: refused: flock (util-linux) is not installed on this host"
        )
    assert marked(run_id) == []
    assert not (node.state / run_id).exists()


@pytest.mark.parametrize("bad", ["current", ".hidden", "-x", "a/b", "..", "a b", "$(id)", "a;b"])
def test_reserved_and_unsafe_run_ids_are_refused_by_every_action(node: Node, bad: str) -> None:
    for action in ("start", "stop", "logs"):
        tail = ["--", "sleep", "1"] if action == "start" else []
        result = node(action, "--run-id", bad, *tail)
        assert result.returncode == 2, (action, result.stdout, result.stderr)
        assert f"bad run id '{bad}'" in result.stderr
    assert not (node.state / "current").exists()
