"""`fleet cleanup`'s node side (facts.sh, the decisions, act.sh, in rounds) run for real inside
throwaway node-like namespaces, in dash, bash and busybox sh.

Each test starts a bash "driver" as pid 1 of fresh PID, mount and network namespaces
(`unshare --pid --fork --kill-child --mount --propagation private --mount-proc --net`)
with tmpfs on /tmp, /dev (a few real nodes bound in, fake /dev/nvidia* where wanted),
/dev/shm and a temporary HOME. Whatever the cleanup kills or deletes, it cannot touch
this machine's real processes or files, and when the driver exits the kernel kills
everything left in the namespace.

The driver plants processes, files and listeners, waits for them to be ready (polling
to a deadline, never sleeping blindly), then runs the cleanup op as fleet runs it on a node
(`python3 -m fleet.engine.local`: the same commands, on this shell instead of over SSH), from a
caller in a session of its own whose argv holds the kill patterns (PITFALLS 1). The node's PATH
holds only the tools the node side may use, so a dependency on anything else (ps, pgrep, fuser,
awk, a real nvidia-smi) fails here. Afterwards the driver reports from /proc what is alive and
from the file system what is left; the assertions live in this file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

RUN_TIMEOUT_S = 90
# The tools the node side may use on a node, besides the shell's builtins: POSIX utilities every
# Linux node has (busybox's included), and flock, which is optional here (without it the kill is
# not serialised with other cleanups, and says so).
NODE_TOOLS = ("tr", "ls", "grep", "sed", "cut", "rm", "sleep", "timeout", "cat", "dd", "od")
NODE_TOOLS += ("head", "env", "awk", "flock", "id", "mkdir", "uname")
UNSHARE = (
    "unshare",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--propagation",
    "private",
    "--mount-proc",
    "--net",
)


def _namespaces_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create PID/mount/net namespaces"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
    pytest.mark.skipif(
        shutil.which("setsid") is None, reason="needs setsid (util-linux) to mimic sshd"
    ),
]

SHELLS = ["dash", "bash", "busybox"]


@pytest.fixture(scope="module", autouse=True)
def _require_namespaces() -> None:
    if not _namespaces_work():
        pytest.skip(
            "unshare cannot create PID/mount/net namespaces here (container without privileges?)"
        )


def _shell_or_skip(shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (apt-get install {shell})")


# The driver's prelude: private /tmp, /dev, /dev/shm and HOME, loopback up, the node's PATH,
# and helpers.
PRELUDE = r"""
set -u
# A checkout under /tmp (fleet's code and its venv) stays visible at its own path.
case $REPO in /tmp/*) mount --bind "$REPO" /mnt && MOVE_REPO=1 ;; *) MOVE_REPO= ;; esac
mount -t tmpfs tmpfs /tmp
[ -z "$MOVE_REPO" ] || { mkdir -p "$REPO" && mount --move /mnt "$REPO"; }
mkdir /tmp/.realdev && mount --bind /dev /tmp/.realdev
mount -t tmpfs -o mode=755 tmpfs /dev
for n in null zero full random urandom tty; do
    touch "/dev/$n" && mount --bind "/tmp/.realdev/$n" "/dev/$n"
done
umount -l /tmp/.realdev && rmdir /tmp/.realdev
ln -s /proc/self/fd /dev/fd
mkdir /dev/shm && mount -t tmpfs tmpfs /dev/shm
mkdir -p /var/lib/fleet && mount -t tmpfs -o mode=700 tmpfs /var/lib/fleet  # node state, private
export HOME=/tmp/home
mkdir -p "$HOME"
ip link set lo up

# The node's PATH: only the tools the script is allowed to use.
mkdir /tmp/nodebin
if [ "$NODE_SHELL" = busybox ]; then
    BB=$(command -v busybox)
    for applet in $("$BB" --list); do ln -sf "$BB" "/tmp/nodebin/$applet"; done
else
    ln -s "$(command -v "$NODE_SHELL")" /tmp/nodebin/sh
    for tool in $NODE_TOOLS; do ln -s "$(command -v "$tool")" "/tmp/nodebin/$tool"; done
fi
NODE_PATH=/tmp/nodebin
NODE_SH=/tmp/nodebin/sh

fail() {
    echo "DRIVER FAILED: $*"
    if [ -n "${PLANTED:-}" ]; then  # what the last planted process looks like
        echo "planted $PLANTED: $(cat /proc/$PLANTED/stat 2>&1)"
        ls -l "/proc/$PLANTED/fd/" 2>&1
    fi
    exit 97
}

# wait_for DESCRIPTION COMMAND...: poll COMMAND until it succeeds, for up to 15 s.
wait_for() {
    local desc=$1 deadline=$((SECONDS + 15))
    shift
    until "$@"; do
        (( SECONDS < deadline )) || fail "timed out waiting for $desc"
        sleep 0.02
    done
}

alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}
dead() { ! alive "$1"; }
cmdline_is() { [ "$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null)" = "$2 " ]; }
parent_of() { local s; s=$(cat "/proc/$1/stat") && s=${s##*) } && set -- $s && echo "$2"; }
# child_with_cmd PID CMDLINE: print the pid of PID's child running CMDLINE.
child_with_cmd() {
    local d p
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        if [ "$(parent_of "$p" 2>/dev/null)" = "$1" ] && cmdline_is "$p" "$2"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
listening() {
    grep -q ":$(printf '%04X' "$1") [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
exists() { [ -e "$1" ] || [ -L "$1" ]; }
fd_count() {  # fd_count PID PATH: how many fds of PID are open on PATH
    local n=0 f
    for f in /proc/"$1"/fd/*; do [ "$(readlink "$f")" = "$2" ] && n=$((n + 1)); done
    echo "$n"
}
holds() { [ "$(fd_count "$1" "$2")" -ge 1 ]; }
cwd_is() { [ "$(readlink "/proc/$1/cwd")" = "$2" ]; }

# report NAME PID: tell the test whether the process is alive.
report() { if alive "$2"; then echo "proc $1 $2 alive"; else echo "proc $1 $2 dead"; fi; }
report_path() { if exists "$1"; then echo "path $1 exists"; else echo "path $1 gone"; fi; }
value() { echo "value $1 $2"; }

# run_cleanup LABEL NAME=VALUE...: the cleanup op as fleet runs it on a node (facts.sh, the
# decision, act.sh, facts.sh again), started from a caller whose argv holds the patterns, on the
# node's PATH. RUN_PREFIX is what starts it: `setsid -w` stands in for sshd, which gives every
# connection its own session. The caller's exit code proves it survived its own cleanup.
run_cleanup() {
    local label=$1
    shift
    echo "=== begin $label"
    ${RUN_PREFIX:-setsid -w} env PATH="$NODE_PATH" "$PY" -m fleet.engine.local "$@" 2>&1
    echo "caller survived rc=$?"
    echo "=== end $label"
}

# Planting helpers. Each waits until the process is what it claims to be.
plant_renamed() {  # plant_renamed NAME ARG: a sleep whose argv[0] is NAME
    bash -c "exec -a $1 sleep $2" &
    PLANTED=$!
    wait_for "$1 to exec" cmdline_is "$PLANTED" "$1 $2"
}
cat > /tmp/train.py <<'PY'
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a trainer stuck in a collective
open(sys.argv[1], "w").close()
time.sleep(600)
PY
plant_train() {
    "$PY" /tmp/train.py /tmp/train.ready &
    PLANTED=$!
    wait_for "train.py to ignore TERM" test -e /tmp/train.ready
}
plant_torchrun_with_worker() {  # a torchrun whose child is a renamed worker that ignores TERM
    bash -c '(trap "" TERM; exec -a worker sleep 601) & exec -a torchrun sleep 602' &
    PLANTED=$!
    wait_for "torchrun to exec" cmdline_is "$PLANTED" "torchrun 602"
    wait_for "the worker to exec" child_with_cmd "$PLANTED" "worker 601" >/dev/null
    WORKER=$(child_with_cmd "$PLANTED" "worker 601")
}
plant_listener() {  # plant_listener PORT [ADDRESS]
    "$PY" -m http.server "$1" --bind "${2:-127.0.0.1}" >/dev/null 2>&1 &
    PLANTED=$!
    wait_for "a listener on port $1" listening "$1"
}
plant_holder() {  # plant_holder PATH: an unrelated process with PATH open on fd 3
    sleep 600 3<"$1" &
    PLANTED=$!
    wait_for "sleep to hold $1" holds "$PLANTED" "$1"
}
"""


@dataclass
class Run:
    """One cleanup on the node: its output lines and exit status."""

    lines: list[str]
    rc: int

    @property
    def summary(self) -> str:
        return self.lines[-1] if self.lines else ""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Node:
    """What the driver reported: cleanups by label, processes, paths, values."""

    output: str
    runs: dict[str, Run] = field(default_factory=dict)
    procs: dict[str, tuple[int, bool]] = field(default_factory=dict)
    paths: dict[str, bool] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)

    def pid(self, name: str) -> int:
        return self.procs[name][0]

    def alive(self, name: str) -> bool:
        return self.procs[name][1]


def _parse(output: str) -> Node:
    node = Node(output)
    label: str | None = None
    body: list[str] = []
    for line in output.splitlines():
        if label is not None:
            if line == f"=== end {label}":
                survived = body and re.fullmatch(r"caller survived rc=(\d+)", body[-1])
                assert survived, f"{label}: no exit status:\n{output}"
                rc = int(survived.group(1))
                assert rc < 128, f"{label}: the caller died of a signal (rc {rc}):\n{output}"
                node.runs[label] = Run(body[:-1], rc)
                label = None
            else:
                body.append(line)
        elif line.startswith("=== begin "):
            label, body = line.removeprefix("=== begin "), []
        elif line.startswith("proc "):
            _, name, pid, state = line.split()
            node.procs[name] = (int(pid), state == "alive")
        elif line.startswith("path "):
            path, state = line.removeprefix("path ").rsplit(" ", 1)
            node.paths[path] = state == "exists"
        elif line.startswith("value "):
            _, name, value = line.split(" ", 2)
            node.values[name] = value
    assert label is None, f"run {label} never ended:\n{output}"
    return node


def run_node(body: str, shell: str = "dash", tools: tuple[str, ...] = NODE_TOOLS) -> Node:
    """Run PRELUDE + body as pid 1 of a throwaway node; return what it reported."""
    env = {
        **os.environ,
        "NODE_SHELL": shell,
        "NODE_TOOLS": " ".join(tools),
        "PY": sys.executable,
        "REPO": str(Path(__file__).resolve().parents[2]),
        "BIND_SOCKET": BIND_SOCKET,
    }
    # The driver reads its program from a file: as pid 1 it must not carry the kill patterns in
    # its argv (a pattern set matching pid 1 is refused, as on a real node).
    with tempfile.NamedTemporaryFile("w", prefix="node-driver-", suffix=".sh") as program:
        program.write(PRELUDE + body)
        program.flush()
        proc = subprocess.run(
            [*UNSHARE, "bash", program.name],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"driver exited {proc.returncode}:\n{output}"
    return _parse(output)


def lines_matching(run: Run, pattern: str) -> list[str]:
    return [line for line in run.lines if re.fullmatch(pattern, line)]


# The cleanup's vars for the tests below (the playbook's defaults otherwise): no state part, no
# port part, a short grace.
KILL = "grace=1 port= 'state_paths=[]'"
PATTERNS = r"'patterns=[torchrun, train\.py]'"


# ----------------------------------------------------------------------- kill


@pytest.mark.parametrize("shell", SHELLS)
def test_kill_ends_matches_and_their_renamed_workers_but_spares_caller_and_bystanders(
    shell: str,
) -> None:
    _shell_or_skip(shell)
    node = run_node(
        rf"""
        plant_renamed torchrun 600; TORCHRUN=$PLANTED
        plant_train; TRAIN=$PLANTED
        plant_torchrun_with_worker; LAUNCHER=$PLANTED
        plant_renamed trainXpy 600; DECOY=$PLANTED     # must not match train\.py
        sleep 600 & BYSTANDER=$!
        value worker_parent "$(parent_of "$WORKER")"
        run_cleanup kill {PATTERNS} {KILL}
        report torchrun "$TORCHRUN"; report train "$TRAIN"; report launcher "$LAUNCHER"
        report worker "$WORKER"; report decoy "$DECOY"; report bystander "$BYSTANDER"
        """,
        shell,
    )
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert int(node.values["worker_parent"]) == node.pid("launcher")  # a real parent/child
    for name in ("torchrun", "train", "launcher", "worker"):
        assert not node.alive(name), f"{name} survived:\n{run.text}"
    assert node.alive("decoy")
    assert node.alive("bystander")
    # TERM ends what honours it; what ignores it (train.py, the worker) is KILLed.
    assert lines_matching(run, rf"killed {node.pid('torchrun')} \(TERM\): torchrun 600")
    assert lines_matching(run, rf"killed {node.pid('launcher')} \(TERM\): torchrun 602")
    assert lines_matching(
        run, rf"killed {node.pid('train')} \(KILL\): \S*python\S* /tmp/train\.py .*"
    )
    assert lines_matching(run, rf"killed {node.pid('worker')} \(KILL\): worker 601")
    assert "kill: 4 ended (2 by TERM, 2 by KILL)" in run.lines
    assert run.summary == "killed 4 processes (TERM 2, KILL 2)"


def test_kill_spares_pattern_matches_in_its_own_ssh_session() -> None:
    # The caller starts a sibling whose argv matches too, as a wrapper fleet added might;
    # it lives in the caller's session (what sshd made for this connection).
    node = run_node(
        r"""
        plant_renamed torchrun 600; TORCHRUN=$PLANTED
        echo "=== begin kill"
        setsid -w env PATH="$NODE_PATH" SIBLING_BASH="$BASH" PY="$PY" "$NODE_SH" -c '
            "$SIBLING_BASH" -c "exec -a torchrun-sibling sleep 600" & sibling=$!
            tries=0
            until tr "\0" " " < /proc/$sibling/cmdline | grep -q ^torchrun-sibling; do
                tries=$((tries + 1)); [ "$tries" -lt 500 ] || exit 98; sleep 0.02
            done
            echo "$sibling" > /tmp/sibling.pid
            "$PY" -m fleet.engine.local patterns=[torchrun] grace=1 port= "state_paths=[]"
            echo "caller survived rc=$?"' 2>&1
        echo "=== end kill"
        report torchrun "$TORCHRUN"; report sibling "$(cat /tmp/sibling.pid)"
        """
    )
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert not node.alive("torchrun")
    assert node.alive("sibling"), run.text
    assert "kill: 1 ended (1 by TERM, 0 by KILL)" in run.lines


def test_kill_does_not_spare_a_session_whose_leader_is_outside_the_namespace() -> None:
    # Without setsid the session leader lives outside this PID namespace (sid reads as
    # 0), exactly like the planted job: treating that as "our session" would spare it.
    node = run_node(
        rf"""
        plant_renamed torchrun 600; TORCHRUN=$PLANTED
        value planted_sid "$(s=$(cat /proc/$TORCHRUN/stat); set -- ${{s##*) }}; echo "$4")"
        RUN_PREFIX=" " run_cleanup kill patterns=[torchrun] {KILL}
        report torchrun "$TORCHRUN"
        """
    )
    assert node.values["planted_sid"] == "0"
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert not node.alive("torchrun")
    assert "kill: 1 ended (1 by TERM, 0 by KILL)" in run.lines


def test_kill_patterns_see_the_command_line_like_pkill_f() -> None:
    # NULs between arguments read as spaces, with no trailing one, so anchors work.
    node = run_node(
        rf"""
        plant_renamed torchrun 600; EXACT=$PLANTED
        plant_renamed torchrun 6000; LONGER=$PLANTED
        run_cleanup kill 'patterns=[^torchrun 600$]' {KILL}
        report exact "$EXACT"; report longer "$LONGER"
        """
    )
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert not node.alive("exact")
    assert node.alive("longer")
    assert "kill: 1 ended (1 by TERM, 0 by KILL)" in run.lines


@pytest.mark.parametrize("shell", SHELLS)
def test_a_newline_in_a_process_name_neither_hides_it_nor_fakes_another(shell: str) -> None:
    """Any process may set its comm (up to 15 bytes) to text with a newline. Read one line at a
    time, /proc/PID/stat then ends early (the process vanished from the scan), and in a bulk read
    the fragment after the newline looks like a stat line of its own (here: of pid 1)."""
    _shell_or_skip(shell)
    node = run_node(
        rf"""
        # Only a process itself may rename itself (prctl PR_SET_NAME).
        "$PY" -c 'import ctypes, time
ctypes.CDLL(None).prctl(15, b"a\n1 (b) S 0 0", 0, 0, 0)
open("/tmp/renamed", "w").close()
time.sleep(600)' torchrun &
        HIDDEN=$!
        wait_for "the process to rename itself" test -e /tmp/renamed
        grep -q '^1 (b) S 0 0) ' "/proc/$HIDDEN/stat" || fail "comm was not renamed"
        plant_renamed torchrun 601; PLAIN=$PLANTED
        run_cleanup preview patterns=[torchrun] {KILL} preview=true
        run_cleanup kill patterns=[torchrun] {KILL}
        report hidden "$HIDDEN"; report plain "$PLAIN"
        """,
        shell,
    )
    hidden, plain = node.pid("hidden"), node.pid("plain")
    listed = node.runs["preview"]
    assert [line.split()[2] for line in listed.lines if line.startswith("would kill")] == [
        str(pid) for pid in sorted((hidden, plain))
    ], listed.text
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert "kill: 2 ended (2 by TERM, 0 by KILL)" in run.lines
    assert not node.alive("hidden")
    assert not node.alive("plain")


@pytest.mark.parametrize("shell", SHELLS)
def test_kill_spares_another_fleet_run_s_helpers_and_their_children(shell: str) -> None:
    """Two operators clean the same node at once: the other run's node-side processes (its
    facts.sh, its wrapper, their children such as a grep -e torchrun) carry the patterns too,
    and FLEET_NODE_HELPER in their environment, which fleet sets on them. They are left alone;
    the training job goes. A user's playbook starting training from a script step looks alike
    but carries no marker: it and its child go."""
    _shell_or_skip(shell)
    node = run_node(
        rf"""
        plant_renamed torchrun 600; TRAIN=$PLANTED
        printf '%s\n' 'sh -c "sleep 602; :" grep-e-torchrun & echo $! > /tmp/other.child; wait' |
            FLEET_NODE_HELPER=1 setsid timeout -k 5 600 "$NODE_SH" -s -- --pattern torchrun &
        wait_for "the other run's child" test -s /tmp/other.child
        OTHER_CHILD=$(cat /tmp/other.child)
        OTHER=$(parent_of "$OTHER_CHILD"); OTHER_WRAPPER=$(parent_of "$OTHER")
        printf '%s\n' 'sleep 603 & echo $! > /tmp/step.child; wait' |
            setsid "$NODE_SH" -s -- torchrun --nproc-per-node 8 train.py &
        wait_for "the script step's child" test -s /tmp/step.child
        STEP_CHILD=$(cat /tmp/step.child); STEP=$(parent_of "$STEP_CHILD")
        run_cleanup kill patterns=[torchrun] {KILL}
        report train "$TRAIN"; report other "$OTHER"; report other_child "$OTHER_CHILD"
        report other_wrapper "$OTHER_WRAPPER"; report step "$STEP"; report step_child "$STEP_CHILD"
        kill "$OTHER_CHILD" "$OTHER" "$OTHER_WRAPPER" 2>/dev/null || true
        """,
        shell,
    )
    run = node.runs["kill"]
    assert run.rc == 0, run.text
    assert "kill: 3 ended (3 by TERM, 0 by KILL)" in run.lines, run.text
    for name in ("train", "step", "step_child"):
        assert not node.alive(name), name
    for name in ("other", "other_child", "other_wrapper"):
        assert node.alive(name), name


def test_kill_with_nothing_to_match_says_so_and_the_node_is_clean() -> None:
    node = run_node(
        rf"""
        sleep 600 & BYSTANDER=$!
        run_cleanup kill {PATTERNS} {KILL}
        report bystander "$BYSTANDER"
        """
    )
    run = node.runs["kill"]
    assert (run.rc, run.lines) == (
        0,
        ["kill: nothing matched", "gpu-reset: skipped: no nvidia-smi", "already clean"],
    )
    assert node.alive("bystander")


def test_kill_reports_gpu_holders_and_kills_them_only_when_asked() -> None:
    node = run_node(
        rf"""
        touch /dev/nvidia0 /dev/nvidiactl
        # An orphaned, renamed DataLoader worker still holding the GPU, and the
        # persistence daemon, which holds it on purpose.
        bash -c 'exec -a pt_data_worker sleep 600' 3</dev/nvidia0 & HOLDER=$!
        wait_for "the holder" holds "$HOLDER" /dev/nvidia0
        bash -c 'exec -a nvidia-persistenced sleep 600' 3</dev/nvidiactl & DAEMON=$!
        wait_for "the daemon" holds "$DAEMON" /dev/nvidiactl
        wait_for "renames" cmdline_is "$HOLDER" "pt_data_worker 600"
        run_cleanup report patterns=[torchrun] {KILL}
        report holder_after_report "$HOLDER"
        run_cleanup kill patterns=[torchrun] {KILL} kill_gpu_holders=true
        report holder "$HOLDER"; report daemon "$DAEMON"
        """
    )
    holder, daemon = node.pid("holder"), node.pid("daemon")
    report = node.runs["report"]
    assert report.rc == 0
    assert report.lines[:2] == [
        f"gpu holder {holder} not killed (pass kill_gpu_holders=true): pt_data_worker 600",
        "kill: nothing matched",
    ]
    assert node.alive("holder_after_report")
    kill = node.runs["kill"]
    assert kill.rc == 0, kill.text
    assert f"killed {holder} (TERM): pt_data_worker 600" in kill.lines
    assert f"gpu holder {daemon} not killed (system daemon): nvidia-persistenced 600" in kill.lines
    assert "kill: 1 ended (1 by TERM, 0 by KILL)" in kill.lines
    assert kill.summary == "killed 1 process (TERM 1)"
    assert not node.alive("holder")
    assert node.alive("daemon")


def test_kill_without_permission_reports_what_is_left_and_exits_1() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    # Another user's job, and a cleanup that may not signal it (root without CAP_KILL, as
    # fleet without sudo is a plain user).
    node = run_node(
        r"""
        setpriv --reuid=65534 --regid=65534 --clear-groups bash -c 'exec -a torchrun sleep 600' &
        PLANTED=$!; wait_for "torchrun to exec" cmdline_is "$PLANTED" "torchrun 600"
        start=$SECONDS
        RUN_PREFIX="setsid -w setpriv --bounding-set=-kill --inh-caps=-kill" \
            run_cleanup kill patterns=[torchrun] grace=0.2 port= 'state_paths=[]'
        value seconds $((SECONDS - start))
        report torchrun "$PLANTED"
        """
    )
    pid = node.pid("torchrun")
    run = node.runs["kill"]
    assert run.rc == 1
    assert run.lines[:4] == [
        "kill: sending TERM to 1 process, KILL after 0.2s",
        f"not permitted to signal {pid} (not root?): torchrun 600",
        f"left {pid}: torchrun 600",
        f"kill: 1 left (pids {pid}); 0 ended (0 by TERM, 0 by KILL)",
    ]
    assert run.summary == "left: 1 process; failed: kill"
    assert node.alive("torchrun")
    assert int(node.values["seconds"]) <= 3  # no point waiting for what it cannot signal


# ---------------------------------------------------------------------- state

STATE_GLOBS = (
    "/tmp/.torch_distributed_*",
    "/dev/shm/torch_*",
    "/tmp/cuda_*",
    "~/.nv",
    "/tmp/nomatch_*",
)


def _state(*globs: str, allow_any: bool = False) -> str:
    """Vars for the state part alone."""
    paths = ", ".join(f'"{g}"' for g in globs)
    anywhere = " allow_any_state_path=true" if allow_any else ""
    return f"patterns=[torchrun] grace=1 port= 'state_paths=[{paths}]'{anywhere}"


def test_state_removes_free_paths_and_keeps_the_ones_in_use() -> None:
    node = run_node(
        r"""
        mkdir -p /tmp/.torch_distributed_x "$HOME/.nv/ComputeCache" /tmp/cuda_1 /tmp/cuda_cwd
        echo store > /tmp/.torch_distributed_x/store
        echo blob > "$HOME/.nv/ComputeCache/blob"
        echo seg > /dev/shm/torch_abc
        echo x > "/tmp/cuda_with space"
        mkdir "$HOME/precious" && echo keep > "$HOME/precious/file"
        ln -s "$HOME/precious" /tmp/cuda_link          # rm -rf must drop the link only
        echo seg > /dev/shm/torch_inuse
        plant_holder /dev/shm/torch_inuse; FD_HOLDER=$PLANTED
        mkdir /tmp/.torch_distributed_busy && echo s > /tmp/.torch_distributed_busy/store
        plant_holder /tmp/.torch_distributed_busy/store; DIR_HOLDER=$PLANTED
        (cd /tmp/cuda_cwd && exec sleep 600) & CWD_HOLDER=$!
        wait_for "a process inside /tmp/cuda_cwd" cwd_is "$CWD_HOLDER" /tmp/cuda_cwd
        head -c 4096 /dev/zero > /dev/shm/torch_mapped
        "$PY" -c '
import mmap, os, sys, time
path, ready = sys.argv[1:3]
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, 0)
for name in os.listdir("/proc/self/fd"):  # mmap keeps a dup of the fd: drop them all
    try:
        if os.readlink(f"/proc/self/fd/{name}") == path:
            os.close(int(name))
    except OSError:
        pass
open(ready, "w").close()
time.sleep(600)
' /dev/shm/torch_mapped /tmp/mapped.ready & MAPPER=$!
        wait_for "the mapping" test -e /tmp/mapped.ready
        value mapper_fds "$(fd_count "$MAPPER" /dev/shm/torch_mapped)"
        run_cleanup state """
        + _state(*STATE_GLOBS)
        + r"""
        for p in /tmp/.torch_distributed_x /dev/shm/torch_abc /tmp/cuda_1 "/tmp/cuda_with space" \
                 "$HOME/.nv" /tmp/cuda_link "$HOME/precious/file" /dev/shm/torch_inuse \
                 /tmp/.torch_distributed_busy/store /tmp/cuda_cwd /dev/shm/torch_mapped; do
            report_path "$p"
        done
        report fd_holder "$FD_HOLDER"; report dir_holder "$DIR_HOLDER"
        report cwd_holder "$CWD_HOLDER"; report mapper "$MAPPER"
        """
    )
    run = node.runs["state"]
    assert run.rc == 1, run.text  # what is kept is left: a verdict, not a failure
    assert node.values["mapper_fds"] == "0"  # only the mapping holds it: /proc/PID/maps
    home = "/tmp/home"
    removed = [
        "/tmp/.torch_distributed_x",
        "/dev/shm/torch_abc",
        "/tmp/cuda_1",
        "/tmp/cuda_with space",
        "/tmp/cuda_link",
        f"{home}/.nv",
    ]
    for path in removed:
        assert f"removed: {path}" in run.lines, run.text
        assert not node.paths[path], path
    assert node.paths[f"{home}/precious/file"], "rm -rf followed a symlink"
    kept = {
        "/dev/shm/torch_inuse": rf"{node.pid('fd_holder')} sleep 600",
        "/tmp/.torch_distributed_busy": rf"{node.pid('dir_holder')} sleep 600",
        "/tmp/cuda_cwd": rf"{node.pid('cwd_holder')} sleep 600",
        "/dev/shm/torch_mapped": rf"{node.pid('mapper')} \S*python\S* -c .*",
    }
    for path, holder in kept.items():
        assert lines_matching(run, rf"kept \(in use by {holder}\): {re.escape(path)}"), run.text
    for path in ("/dev/shm/torch_inuse", "/tmp/.torch_distributed_busy/store", "/tmp/cuda_cwd"):
        assert node.paths[path], path
    assert all(node.alive(name) for name in ("fd_holder", "dir_holder", "cwd_holder", "mapper"))
    assert not any("nomatch" in line for line in run.lines)
    assert "state: removed 6, kept 4" in run.lines
    assert run.summary == "removed 6 paths; left: 4 paths"


# A process holding a unix socket it bound at SOCKET (what multiprocessing's Listener and
# torch_shm_manager do), or, with "bind-and-die", one that binds it and exits without
# cleaning up (a SIGKILLed DataLoader worker): the socket file stays, no process has it.
BIND_SOCKET = r"""
import os, socket, sys, time
path, mode = sys.argv[1:3]
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(1)
if mode == "bind-and-die":
    os._exit(0)
open(path + ".ready", "w").close()
time.sleep(600)
"""


@pytest.mark.parametrize("shell", SHELLS)
def test_state_keeps_dirs_a_live_job_holds_only_by_socket_or_environment(shell: str) -> None:
    """A live torch job holds some of its dirs with no fd on any path in them, no cwd and no
    mapping: a DataLoader worker its /tmp/pymp-*/ through the listener socket it bound there,
    torch_shm_manager its /tmp/torch-shm-dir-*/ through manager.sock, a torchrun worker its
    /tmp/torchelastic_*/ through TORCHELASTIC_ERROR_FILE in its environment."""
    _shell_or_skip(shell)
    node = run_node(
        r"""
        printf '%s' "$BIND_SOCKET" > /tmp/bind_socket.py
        mkdir /tmp/pymp-live /tmp/pymp-dead /tmp/torch-shm-dir-live
        "$PY" /tmp/bind_socket.py /tmp/pymp-live/listener-x hold & SOCKET=$!
        "$PY" /tmp/bind_socket.py /tmp/torch-shm-dir-live/manager.sock hold & MANAGER=$!
        "$PY" /tmp/bind_socket.py /tmp/pymp-dead/listener-y bind-and-die
        wait_for "the listener" test -e /tmp/pymp-live/listener-x.ready
        wait_for "the manager" test -e /tmp/torch-shm-dir-live/manager.sock.ready
        mkdir -p /tmp/torchelastic_live/none_a/attempt_0/0 /tmp/torchelastic_dead/none_b/attempt_0/0
        TORCHELASTIC_ERROR_FILE=/tmp/torchelastic_live/none_a/attempt_0/0/error.json \
            sleep 600 & WORKER=$!
        wait_for "the worker" cmdline_is "$WORKER" "sleep 600"
        # a bystander whose environment names a path that only starts like a held one
        TMPDIR=/tmp/torchelastic_deadbeef sleep 601 & DECOY=$!
        wait_for "the decoy" cmdline_is "$DECOY" "sleep 601"
        run_cleanup state """
        + _state("/tmp/pymp-*", "/tmp/torch-shm-dir-*", "/tmp/torchelastic_*")
        + r"""
        for p in /tmp/pymp-live/listener-x /tmp/torch-shm-dir-live/manager.sock \
                 /tmp/torchelastic_live/none_a/attempt_0/0 /tmp/pymp-dead /tmp/torchelastic_dead; do
            report_path "$p"
        done
        report socket "$SOCKET"; report manager "$MANAGER"; report worker "$WORKER"
        """,
        shell,
    )
    run = node.runs["state"]
    assert run.rc == 1, run.text
    py = r"\S*python\S* /tmp/bind_socket\.py.*"  # command lines are cut at 60 characters
    kept = {
        "/tmp/pymp-live": rf"{node.pid('socket')} {py}",
        "/tmp/torch-shm-dir-live": rf"{node.pid('manager')} {py}",
        "/tmp/torchelastic_live": rf"{node.pid('worker')} sleep 600",
    }
    for path, holder in kept.items():
        assert lines_matching(run, rf"kept \(in use by {holder}\): {re.escape(path)}"), run.text
    assert "removed: /tmp/pymp-dead" in run.lines, run.text
    assert "removed: /tmp/torchelastic_dead" in run.lines, run.text
    assert "state: removed 2, kept 3" in run.lines
    for path in (
        "/tmp/pymp-live/listener-x",
        "/tmp/torch-shm-dir-live/manager.sock",
        "/tmp/torchelastic_live/none_a/attempt_0/0",
    ):
        assert node.paths[path], path
    assert not node.paths["/tmp/pymp-dead"]
    assert not node.paths["/tmp/torchelastic_dead"]
    assert all(node.alive(name) for name in ("socket", "manager", "worker"))


def test_state_refuses_paths_that_resolve_to_home_or_root() -> None:
    # even with allow_any_state_path (without it, these are refused before anything runs)
    node = run_node(
        r"""
        echo keep > "$HOME/file"
        ln -s / /tmp/cuda_root
        run_cleanup state """
        + _state("~", "/", "/tmp/cuda_*/", allow_any=True)
        + r"""
        report_path "$HOME/file"; report_path /tmp/cuda_root
        """
    )
    run = node.runs["state"]
    assert run.rc == 1
    assert "refused (resolves to /tmp/home): /tmp/home" in run.lines
    assert "refused (resolves to /): /" in run.lines
    assert "refused (resolves to /): /tmp/cuda_root/" in run.lines
    assert "state: removed 0, kept 0, refused 3" in run.lines
    assert run.summary == "left: 3 paths; failed: state"
    assert node.paths["/tmp/home/file"]
    assert node.paths["/tmp/cuda_root"]


PLACES = "below /tmp, /var/tmp, /dev/shm or ~/.cache; ~/.nv, ~/.triton"


def test_state_refuses_paths_outside_the_state_places_before_anything_runs() -> None:
    """`rm -rf` only where training state lives: /opt/*, /usr/../opt, /tmp/* and anything
    in the home but its caches are refused, one line each, and nothing at all is done on the
    node (the good path is not removed, the job not killed). /opt is a tmpfs of the throwaway
    node: nothing real at risk."""
    node = run_node(
        r"""
        mount -t tmpfs tmpfs /opt
        mkdir -p /opt/app /tmp/cuda_1 "$HOME/.ssh"
        echo keep > /opt/app/file; echo key > "$HOME/.ssh/id_rsa"
        plant_renamed torchrun 600; LAUNCHER=$PLANTED
        run_cleanup bad """
        + _state("/tmp/cuda_*", "/opt/*", "/usr/../opt", "/tmp/*", "~/.ssh/id_rsa", "tmp/cuda_1")
        + r"""
        for p in /opt/app/file /tmp/cuda_1 "$HOME/.ssh/id_rsa"; do report_path "$p"; done
        report launcher "$LAUNCHER"
        run_cleanup allowed """
        + _state("/opt/*", allow_any=True)
        + r"""
        report_path /opt/app
        """
    )
    bad = node.runs["bad"]
    assert bad.rc == 1, bad.text
    assert bad.lines == [
        f"refused --path '/opt/*': not where training state lives ({PLACES})",
        f"refused --path '/usr/../opt': /opt: not where training state lives ({PLACES})",
        "refused --path '/tmp/*': '*' matches everything in /tmp",
        f"refused --path '~/.ssh/id_rsa': /tmp/home/.ssh/id_rsa: not where training state "
        f"lives ({PLACES})",
        "refused --path 'tmp/cuda_1': relative: give an absolute path or ~/...",
        "refused: 5 state paths outside the places training state lives; did nothing on this "
        "node (--var allow_any_state_path=true to allow)",
    ], bad.text
    assert node.paths["/opt/app/file"]
    assert node.paths["/tmp/cuda_1"], "removed a good path although the node was refused"
    assert node.paths["/tmp/home/.ssh/id_rsa"]
    assert node.alive("launcher"), "killed processes although the node was refused"
    allowed = node.runs["allowed"]
    assert allowed.rc == 0, allowed.text
    assert "state: removed 1, kept 0" in allowed.lines
    assert not node.paths["/opt/app"]


def test_state_refuses_a_match_behind_a_symlinked_dir_before_removing_anything() -> None:
    """A glob that reads fine can reach outside through a symlinked directory that only the
    node can see: each match is resolved, and one outside stops the whole state part."""
    node = run_node(
        r"""
        mount -t tmpfs tmpfs /opt
        mkdir -p /opt/app/data /tmp/cuda_1
        ln -s /opt/app /tmp/pymp-link
        run_cleanup state """
        + _state("/tmp/pymp-*/data", "/tmp/cuda_*")
        + r"""
        run_cleanup prefix """
        + _state("/tmp/pymp-link/*")
        + r"""
        report_path /opt/app/data; report_path /tmp/cuda_1; report_path /tmp/pymp-link
        """
    )
    run = node.runs["state"]
    assert run.rc == 1, run.text
    assert "refused (resolves to /opt/app/data): /tmp/pymp-link/data" in run.lines
    assert (
        "state: removed 0, kept 0, refused 1 (outside the places training state lives)" in run.lines
    )
    assert run.summary == "left: 2 paths; failed: state"
    prefix = node.runs["prefix"]
    assert prefix.rc == 1
    assert prefix.lines[0] == (
        f"refused --path '/tmp/pymp-link/*': resolves to /opt/app/*: not where training "
        f"state lives ({PLACES})"
    ), prefix.text
    assert node.paths["/opt/app/data"]
    assert node.paths["/tmp/cuda_1"]
    assert node.paths["/tmp/pymp-link"]


# ----------------------------------------------------------------------- port

PORT = "patterns=[torchrun] grace=2 'state_paths=[]'"


def test_port_frees_the_listener_and_names_it() -> None:
    node = run_node(
        rf"""
        plant_listener 39500; LISTENER=$PLANTED
        sleep 600 & BYSTANDER=$!
        run_cleanup port {PORT}
        report listener "$LISTENER"; report bystander "$BYSTANDER"
        listening 39500 && value still_listening yes
        run_cleanup again {PORT}
        """
    )
    pid = node.pid("listener")
    run = node.runs["port"]
    assert run.rc == 0, run.text
    server = r"\S*python\S* -m http\.server 39500 --bind 127\.0\.0\.1"
    assert lines_matching(run, rf"port 39500: held by {pid} \({server}\)")
    assert lines_matching(run, rf"killed {pid} \(TERM\): {server}")
    # The summary is for a live table: the command line is cut short there.
    (freed,) = lines_matching(run, rf"port 39500: freed \(killed {pid} \S*python.*\)")
    assert len(freed) < 120
    assert not node.alive("listener")
    assert node.alive("bystander")
    assert "still_listening" not in node.values
    assert "port 39500: free" in node.runs["again"].lines
    assert node.runs["again"].rc == 0


def test_port_is_found_on_a_node_without_dd() -> None:
    # The TCP tables are read with one dd read when dd exists; without it, to the end with cat.
    node = run_node(
        rf"""
        plant_listener 39500; LISTENER=$PLANTED
        run_cleanup port {PORT}
        report listener "$LISTENER"
        """,
        tools=tuple(t for t in NODE_TOOLS if t != "dd"),
    )
    run = node.runs["port"]
    assert run.rc == 0, run.text
    assert lines_matching(run, rf"port 39500: freed \(killed {node.pid('listener')} .*")
    assert not node.alive("listener")


def test_port_frees_an_ipv6_listener() -> None:
    if not Path("/proc/net/tcp6").exists():
        pytest.skip("IPv6 is disabled on this machine")
    node = run_node(
        rf"""
        plant_listener 39501 ::1; LISTENER=$PLANTED
        run_cleanup port {PORT} port=39501
        report listener "$LISTENER"
        """
    )
    run = node.runs["port"]
    assert run.rc == 0, run.text
    assert lines_matching(run, rf"port 39501: freed \(killed {node.pid('listener')} .*")
    assert not node.alive("listener")


def test_port_held_by_a_process_it_cannot_see_is_reported_not_free() -> None:
    # The listener shares the network namespace, but the cleanup runs in a nested PID
    # namespace where no process owns the socket: like a container's port on the host.
    node = run_node(
        rf"""
        plant_listener 39500; LISTENER=$PLANTED
        RUN_PREFIX="unshare --pid --fork --kill-child --mount-proc" run_cleanup port {PORT}
        report listener "$LISTENER"
        """
    )
    run = node.runs["port"]
    assert run.rc == 1
    assert "port 39500: still held (no visible process)" in run.lines
    assert run.summary == "left: port 39500; failed: port"
    assert node.alive("listener")


# ----------------------------------------------------------- the whole sequence

# A dead run's leftovers for the whole-sequence tests, and the lines that report on them.
PLANT_DEAD_RUN = r"""
        plant_torchrun_with_worker; LAUNCHER=$PLANTED
        plant_train; TRAIN=$PLANTED
        plant_listener 39500; LISTENER=$PLANTED
        sleep 600 & BYSTANDER=$!
        mkdir -p /tmp/.torch_distributed_x "$HOME/.nv/ComputeCache" /tmp/cuda_1
        echo seg > /dev/shm/torch_abc
"""
REPORT_DEAD_RUN = r"""
        report launcher "$LAUNCHER"; report worker "$WORKER"; report train "$TRAIN"
        report listener "$LISTENER"; report bystander "$BYSTANDER"
"""
ALL = (
    PATTERNS
    + " grace=1 port=39500 "
    + "'state_paths=["
    + ", ".join(f'"{g}"' for g in STATE_GLOBS[:4])
    + "]'"
)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_sequence_runs_in_rounds_and_ends_on_clean(shell: str) -> None:
    """What the cleanup playbook runs: each part's lines, then what it did, nothing left."""
    _shell_or_skip(shell)
    node = run_node(
        PLANT_DEAD_RUN
        + rf"""
        run_cleanup all {ALL}
        """
        + REPORT_DEAD_RUN,
        shell,
    )
    run = node.runs["all"]
    assert run.rc == 0, run.text
    assert re.fullmatch(
        r"killed 4 processes \(TERM 2, KILL 2\), removed 4 paths, "
        r"port 39500 freed \(stopped python[0-9.]*\)",
        run.summary,
    ), run.text
    # Each part's summary line, in the playbook's order, and the verdict last.
    summaries = [
        "kill: 3 ended (1 by TERM, 2 by KILL)",
        "gpu-reset: skipped: no nvidia-smi",
        "state: removed 4, kept 0",
        next((x for x in run.lines if x.startswith("port 39500: freed (killed ")), "no port line"),
    ]
    assert all(x in run.lines for x in summaries), run.text
    assert [run.lines.index(x) for x in summaries] == sorted(run.lines.index(x) for x in summaries)
    for name in ("launcher", "worker", "train", "listener"):
        assert not node.alive(name), name
    assert node.alive("bystander")


def test_a_path_in_use_is_left_then_removed_once_free() -> None:
    node = run_node(
        PLANT_DEAD_RUN
        + rf"""
        echo seg > /dev/shm/torch_inuse
        plant_holder /dev/shm/torch_inuse; HOLDER=$PLANTED; value holder "$HOLDER"
        run_cleanup first {ALL}
        kill "$HOLDER"; wait_for "the holder to end" dead "$HOLDER"
        run_cleanup again {ALL}
        """
        + REPORT_DEAD_RUN
    )
    first = node.runs["first"]
    assert first.rc == 1
    holder = node.values["holder"]
    assert f"kept (in use by {holder} sleep 600): /dev/shm/torch_inuse" in first.lines
    assert f"left path: /dev/shm/torch_inuse (in use by {holder} sleep 600)" in first.lines
    assert first.summary.endswith("; left: 1 path"), first.text
    again = node.runs["again"]
    assert "removed: /dev/shm/torch_inuse" in again.lines
    assert (again.rc, again.summary) == (0, "removed 1 path")


# ------------------------------------------------------------------ gpu-reset

SHIM = r"""
mkdir /tmp/shim
cat > /tmp/shim/nvidia-smi <<'SH'
#!/bin/sh
echo "$*" >> /tmp/shim/calls
# A tool that reads stdin must get EOF, not the SSH channel (or the rest of the script).
timeout 2 cat > /dev/null || echo "stdin-open" >> /tmp/shim/calls
case "$*" in
--query-compute-apps=pid*) cat /tmp/shim/apps 2>/dev/null; exit 0 ;;
--gpu-reset)
    if [ -e /tmp/shim/reset_fails ]; then echo "Unable to reset GPU 00000000:01:00.0"; exit 3; fi
    echo "GPU 00000000:01:00.0 was successfully reset."; exit 0 ;;
esac
exit 9
SH
chmod +x /tmp/shim/nvidia-smi
"""
GPU = "patterns=[torchrun] grace=1 port= 'state_paths=[]'"


def test_gpu_reset_skips_a_busy_gpu_and_resets_an_idle_one() -> None:
    node = run_node(
        SHIM
        + rf"""
        NODE_PATH=/tmp/shim:$NODE_PATH
        echo 4242 > /tmp/shim/apps
        run_cleanup busy_smi {GPU}
        value calls_busy_smi "$(grep -c -- --gpu-reset /tmp/shim/calls)"
        : > /tmp/shim/apps
        touch /dev/nvidia0 /dev/nvidiactl
        plant_holder /dev/nvidia0; HOLDER=$PLANTED; value holder "$HOLDER"
        run_cleanup busy_fd {GPU}
        value calls_busy_fd "$(grep -c -- --gpu-reset /tmp/shim/calls)"
        kill "$HOLDER"; wait_for "the holder to end" dead "$HOLDER"
        run_cleanup idle {GPU}
        value calls_idle "$(grep -c -x -- --gpu-reset /tmp/shim/calls)"
        touch /tmp/shim/reset_fails
        run_cleanup fails {GPU}
        value stdin_open "$(grep -c stdin-open /tmp/shim/calls)"
        """
    )
    busy = node.runs["busy_smi"]
    assert busy.rc == 0
    assert "gpu-reset: skipped: GPU busy (pids 4242)" in busy.lines
    assert node.values["calls_busy_smi"] == "0"
    holder = node.values["holder"]
    busy_fd = node.runs["busy_fd"]
    assert busy_fd.rc == 0
    assert busy_fd.lines[-3:] == [
        f"gpu holder {holder}: sleep 600",
        f"gpu-reset: skipped: GPU busy (pids {holder})",
        "already clean",
    ]
    assert node.values["calls_busy_fd"] == "0"
    idle = node.runs["idle"]
    assert "GPU 00000000:01:00.0 was successfully reset." in idle.lines
    assert "gpu-reset: done" in idle.lines
    assert idle.rc == 0
    assert node.values["calls_idle"] == "1"
    fails = node.runs["fails"]
    assert "Unable to reset GPU 00000000:01:00.0" in fails.lines
    assert "gpu-reset: failed (exit 3)" in fails.lines
    assert fails.summary == "failed: gpu-reset (nothing left behind)"
    assert fails.rc == 1
    assert node.values["stdin_open"] == "0"
