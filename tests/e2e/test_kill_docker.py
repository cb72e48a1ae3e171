"""`fleet kill-docker` against real sshd nodes and a real Docker engine.

The engine is the session's private dockerd (`docker_engine`, tests/support/docker_engine.py: no
bridge, no iptables, every file under its own directory), with one image: a debootstrapped
bookworm with python3 and procps, built without a registry and cached. A test gives a node docker
by bind-mounting the daemon's socket onto /run/docker.sock (= /var/run/docker.sock) in that
node's mount namespace only (`Sandbox.bind_into`), so fleet's node-side helper runs docker.io's
own client against a real daemon, as on a real node. The containers' processes live in PID
namespaces outside the node's (the node's /proc does not show them): the only way in is
`docker exec`, which is how fleet runs facts.sh and act.sh there (fleet/node/docker.py).

The failures are real too, made by changing the node, never by faking docker:
- "cannot reach the docker daemon": a node without the socket (the client's own message);
- "permission denied on the docker socket": a non-root login `kdop`, which exists only in one
  node's mount namespace (like test_sudo_and_jump's user), run with --no-sudo; the socket is
  root:docker 0660 and kdop is not in group docker;
- "docker not installed": docker.io is installed on this machine, so /usr/bin/docker exists on
  every node. The test hides it on its node by bind-mounting an empty, non-executable file over
  it: the node's sh (dash) does not count that as a command, so `command -v docker` fails as on
  a node without docker.
No outcome here needs a stand-in for docker: every one comes from the real engine.

What fleet asked docker to run is read from the engine's own event stream (`docker events`:
each `docker exec` with its command line), not from a log the test writes.

Every process a test plants carries `--tag <prefix>-<name>` in its command line, the prefix
unique to the test and session. The tests find these processes by scanning this machine's /proc,
which sees into every node and container, and tell where each runs by its PID namespace. Each
test removes exactly the containers and image tags it made and kills the node processes it
started, by pid, then checks that none of its tagged processes is left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from docker_engine import DockerEngine, image_name
from fleetrun import FleetResult, poll, run_fleet

pytestmark = pytest.mark.root

IMAGE = image_name()
FACTS_ARGS = r"--pattern torchrun --pattern train\.py"  # facts.sh's, with the default patterns
DEADLINE_S = 15.0
# Planting waits longer: polling ends as soon as every process is seen, and a full suite on a
# loaded 2-core machine once did not see a node's python3 within 15 s (not reproduced since).
PLANT_DEADLINE_S = 45.0
TAG = re.compile(r"--tag (\S+)")
INNER_SCRIPTS = "/kd"  # where containers see the scripts dir (read-only)
NODE_DOCKER = "/usr/bin/docker"  # docker.io's client, on every node
DOCKER_INIT = "/sbin/docker-init"  # a container's pid 1 with --init; its argv repeats the command
# How long a container's end is held back after its main process died (see slow_to_end): well
# past the moment the kill's docker exec returns, well within the 5 s fleet waits to be told.
HOLD_S = 1.5

# A trainer that survives SIGTERM, as a wedged NCCL job does: only SIGKILL ends it. It notes when
# TERM arrived, so the test can tell how long the kill waited before SIGKILL.
TRAIN_PY = """\
import signal, sys, time

tag = sys.argv[sys.argv.index("--tag") + 1]


def note(signum, frame):
    with open(f"/tmp/{tag}.term", "w") as fh:
        fh.write(repr(time.monotonic()))


signal.signal(signal.SIGTERM, note)
while True:
    time.sleep(3600)
"""
# Runs train.py as its child (tagged with its own tag minus "-watch") and records how the child
# ended: the signal, and the seconds from the TERM it noted to its death. Its own command line
# matches no kill pattern, so it outlives the kill to tell.
WATCH_PY = """\
import json, os, subprocess, sys, time

tag = sys.argv[sys.argv.index("--tag") + 1].removesuffix("-watch")
train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
code = subprocess.Popen([sys.executable, train, "--deepspeed", "--tag", tag]).wait()
died = time.monotonic()
try:
    with open(f"/tmp/{tag}.term") as fh:
        waited = died - float(fh.read())
except OSError:
    waited = None
with open(f"/tmp/{tag}.partial", "w") as fh:
    json.dump({"signal": -code, "term_to_death_s": waited}, fh)
os.rename(f"/tmp/{tag}.partial", f"/tmp/{tag}.ended")
time.sleep(3600)
"""

# The non-root login of the permission test, in one node's mount namespace only.
LOGIN, LOGIN_UID = "kdop", 4343
LOGIN_ETC = "/run/kdop-etc"  # on the node's private /run
LOGIN_HOME = "/tmp/kdop-home"  # on the node's private /tmp
AUTH_KEYS = "/run/fleet/authorized_keys"  # the sandbox sshd's one AuthorizedKeysFile
LOGIN_MOUNTS = f"/etc/passwd /etc/group {AUTH_KEYS}"
_LOGIN_SETUP = f"""
set -eu
if getent passwd {LOGIN} >/dev/null || getent passwd {LOGIN_UID} >/dev/null; then
    echo "{LOGIN} or uid {LOGIN_UID} already exists on the node" >&2; exit 1
fi
d={LOGIN_ETC}
mkdir -m 0755 "$d"
cp -p /etc/passwd /etc/group "$d/"
echo '{LOGIN}:x:{LOGIN_UID}:{LOGIN_UID}:fleet kill-docker test:{LOGIN_HOME}:/bin/sh' >>"$d/passwd"
echo '{LOGIN}:x:{LOGIN_UID}:' >>"$d/group"
# sshd reads AuthorizedKeysFile as the user: a readable copy of root's 0600 key list.
install -m 0644 {AUTH_KEYS} "$d/authorized_keys"
mkdir -m 0700 {LOGIN_HOME}
chown {LOGIN_UID}:{LOGIN_UID} {LOGIN_HOME}
mount --bind "$d/passwd" /etc/passwd
mount --bind "$d/group" /etc/group
mount --bind "$d/authorized_keys" {AUTH_KEYS}
id -Gn {LOGIN}
"""
_LOGIN_TEARDOWN = f"""
for m in {LOGIN_MOUNTS}; do
    while mountpoint -q "$m"; do umount "$m" || umount -l "$m"; done
done
for s in /proc/[0-9]*/status; do
    awk '/^Uid:/ {{ exit !($2 == {LOGIN_UID}) }}' "$s" 2>/dev/null || continue
    p=${{s#/proc/}}; kill -KILL "${{p%/status}}" 2>/dev/null || :
done
rm -rf {LOGIN_ETC} {LOGIN_HOME}
! getent passwd {LOGIN} >/dev/null
"""


def argv(kind: str, tag: str, scripts: str) -> list[str]:
    """The command line of a planted process of `kind`, tagged `tag`; `scripts` is where the
    process sees the scripts dir. `exec -a` renames a plain sleep."""
    if kind == "torchrun":
        return ["bash", "-c", f'exec -a "torchrun --nproc-per-node 8 --tag {tag}" sleep 3600']
    if kind == "trainer":  # ignores TERM
        return ["python3", f"{scripts}/train.py", "--deepspeed", "--tag", tag]
    if kind == "watched":  # a trainer under watch.py, which records how it ended
        return ["python3", f"{scripts}/watch.py", "--tag", f"{tag}-watch"]
    if kind == "other":
        return ["bash", "-c", f'exec -a "tensorboard --logdir /runs --tag {tag}" sleep 3600']
    raise ValueError(kind)


@dataclass(frozen=True)
class Proc:
    pid: int  # as this machine (the root PID namespace) sees it
    pidns: str
    cmdline: str


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _child_in(parent: int, pidns: str) -> bool:
    """Whether `parent` has a child in PID namespace `pidns`."""
    for entry in os.listdir("/proc"):
        stat = _read(f"/proc/{entry}/stat") if entry.isdigit() else b""
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == pidns:
                    return True
    return False


@dataclass
class Docker:
    """The engine as one test uses it: the nodes it gave docker to, and everything it started."""

    engine: DockerEngine
    box: Any
    prefix: str
    scripts: Path
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    attached: list[Any] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)
    node_pids: list[tuple[Any, int]] = field(default_factory=list)

    def name(self, short: str) -> str:
        """The test's own name for a container, image or tag (unique per test and session)."""
        return f"{self.prefix}-{short}"

    def docker(self, *args: str) -> str:
        return self.engine.docker(*args).stdout.strip()

    def sh(self, node: Any, script: str) -> str:
        """Run a script as root on the node; its stdout."""
        result = self.box.run_on(node, script)
        assert result.returncode == 0, f"{script!r}: {result.stderr or result.stdout}"
        return str(result.stdout)

    # ------------------------------------------------------------ nodes

    def attach(self, node: Any) -> Any:
        """Give the node the engine at /run/docker.sock."""
        self.attached.append(node)
        self.engine.attach(self.box, node)
        return node

    def hide_docker(self, node: Any) -> Any:
        """Make the node look like one without docker: an empty, non-executable file over the
        client binary (dash's `command -v` then finds no docker)."""
        empty = self.scripts / "no-docker"
        empty.touch(mode=0o644)
        self.hidden.append(node)
        self.box.bind_into(node, empty, NODE_DOCKER)
        return node

    def node_pidns(self, node: Any) -> str:
        return os.readlink(f"/proc/{node.pid1}/ns/pid")

    def spawn_on_node(self, node: Any, kind: str, tag: str) -> None:
        """Start a tagged process on the node itself, outside any container."""
        cmd = shlex.join(argv(kind, self.name(tag), str(self.scripts)))
        err = shlex.quote(f"/tmp/{self.name(tag)}.err")  # the node's own /tmp: node_story
        pid = int(self.sh(node, f"setsid {cmd} </dev/null >/dev/null 2>{err} & echo $!"))
        self.node_pids.append((node, pid))

    def node_story(self) -> dict[int, str]:
        """What became of each process started on a node, as the node sees it (its pids are
        the node's PID namespace's): its state and command line, or gone; and what it wrote to
        stderr."""
        story = {}
        for node, pid in self.node_pids:
            script = (
                f"grep -s '^State:' /proc/{pid}/status || echo gone; "
                f"tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null; echo; "
                f"tail -c 2000 /tmp/{self.prefix}-*.err 2>/dev/null"
            )
            story[pid] = self.box.run_on(node, script).stdout
        return story

    # ------------------------------------------------------------ containers

    def run(
        self,
        short: str,
        *cmd: str,
        image: str = IMAGE,
        labels: tuple[str, ...] = (),
        init: bool = True,
        pid_host: bool = False,
        restart: str = "",
        env: tuple[str, ...] = (),
    ) -> str:
        """`docker run -d` (with --init unless the test needs the command as pid 1); the id."""
        flags = ["-d", "--name", self.name(short), "-v", f"{self.scripts}:{INNER_SCRIPTS}:ro"]
        flags += ["--init"] if init else []
        flags += ["--pid", "host"] if pid_host else []
        flags += ["--restart", restart] if restart else []
        flags += [a for e in env for a in ("--env", e)]
        flags += [a for label in labels for a in ("--label", label)]
        self.containers.append(self.name(short))  # first: a failed run may leave it created
        return self.docker("run", *flags, image, *(cmd or ("sleep", "3600")))

    def tag_image(self, short_ref: str) -> str:
        """Another name for the test image (no registry: `docker tag`), removed afterwards."""
        ref = self.name(short_ref)
        self.images.append(ref)
        self.docker("tag", IMAGE, ref)
        return ref

    def spawn(self, container: str, kind: str, tag: str) -> None:
        """Start a tagged process inside a container with `docker exec -d`."""
        self.docker("exec", "-d", self.name(container), *argv(kind, self.name(tag), INNER_SCRIPTS))

    def pidns(self, container: str) -> str:
        """The PID namespace of a container (of its init, as this machine sees it)."""
        pid = self.docker("inspect", "-f", "{{.State.Pid}}", self.name(container))
        return os.readlink(f"/proc/{pid}/ns/pid")

    def state(self, container: str) -> str:
        return self.docker("inspect", "-f", "{{.State.Status}}", self.name(container))

    def ended(self, container: str, tag: str) -> dict[str, Any]:
        """How a watched trainer ended, as watch.py recorded it inside the container."""
        path = f"/tmp/{self.name(tag)}.ended"
        cat = ("exec", self.name(container), "cat", path)
        text = poll(lambda: self.engine.docker(*cat, check=False).stdout, timeout_s=DEADLINE_S)
        assert text, f"{tag}: watch.py recorded no end in {container}"
        result: dict[str, Any] = json.loads(text)
        return result

    def events(self, since: float, *filters: str) -> list[dict[str, Any]]:
        """The engine's container events since `since` (a time.time()), oldest first."""
        args = ["events", "--since", f"{since:.6f}", "--until", f"{time.time():.6f}"]
        args += [a for f in filters for a in ("--filter", f)]
        out = self.docker(*args, "--format", "{{json .}}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def fleet_execs(self, since: float) -> list[tuple[str, str]]:
        """(container name, command) of each `sh -s -- ...` docker exec since `since`: the
        cleanup helper fleet ran in containers (the test's own execs run other commands); act.sh
        runs as a bare `sh -s --`, its arguments on stdin."""
        found = []
        for e in self.events(since, "event=exec_start"):
            command = e["Action"].removeprefix("exec_start: ")
            if command == "sh -s --" or command.startswith("sh -s -- "):
                found.append((e["Actor"]["Attributes"]["name"], command))
        return found

    @contextlib.contextmanager
    def slow_to_end(self, container: str) -> Iterator[Callable[[], None]]:
        """Hold back the container's end until `release()` (yielded) is called.

        The kernel lets a PID namespace's init finish exiting, and so the daemon learn that the
        container ended, only once every process in the namespace has been reaped. A process
        put into the container's namespace by a parent outside it (nsenter) that is stopped
        stays an unreaped zombie once killed: the container ends, for the daemon, only after
        the parent resumes and reaps it. A training process stuck in an uninterruptible GPU
        driver call delays a real container's end the same way.
        """
        init = int(self.docker("inspect", "-f", "{{.State.Pid}}", self.name(container)))
        holder = subprocess.Popen(
            ["nsenter", "--target", str(init), "--pid", "--", "sleep", "3600"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            inside = os.readlink(f"/proc/{init}/ns/pid")
            entered = poll(lambda: _child_in(holder.pid, inside), DEADLINE_S)
            assert entered, "nsenter did not start a process in the container"
            os.kill(holder.pid, signal.SIGSTOP)
            yield lambda: os.kill(holder.pid, signal.SIGCONT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
            holder.wait(timeout=DEADLINE_S)

    # ------------------------------------------------------------ processes

    def procs(self) -> dict[str, Proc]:
        """Every live tagged process of this test, anywhere on the machine, by short tag."""
        marker = f"--tag {self.prefix}-"
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            cmdline = _read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            m = TAG.search(cmdline)
            if marker not in cmdline or m is None or cmdline.startswith(DOCKER_INIT + " "):
                continue
            stat = _read(f"/proc/{entry}/stat")
            if stat[stat.rfind(b")") + 2 :][:1] in (b"", b"Z", b"X"):
                continue
            try:
                pidns = os.readlink(f"/proc/{entry}/ns/pid")
            except OSError:
                continue
            found[m.group(1).removeprefix(f"{self.prefix}-")] = Proc(int(entry), pidns, cmdline)
        return found

    def wait_for(self, *tags: str) -> dict[str, Proc]:
        """Poll until every tag runs (planting is asynchronous); fail at the deadline, saying
        what became of the processes started on nodes (alive? what command line?)."""
        poll(lambda: set(tags) <= set(self.procs()), PLANT_DEADLINE_S)
        procs = self.procs()
        if not set(tags) <= set(procs):
            raise AssertionError(
                f"not started: {set(tags) - set(procs)}; seen: {sorted(procs)}; "
                f"processes started on nodes (node pid: state, cmdline, stderr): "
                f"{self.node_story()}"
            )
        return procs

    def visible_on(self, node: Any, tag: str) -> bool:
        """Whether the node's own /proc shows the tagged process."""
        script = "for d in /proc/[0-9]*; do tr '\\0' ' ' <\"$d/cmdline\" 2>/dev/null; echo; done"
        return f"--tag {self.name(tag)} " in self.sh(node, script)

    # ------------------------------------------------------------ teardown

    def teardown(self) -> None:
        """Remove what this test made: its containers and image tags, the node processes it
        started (by pid), the nodes' socket and hidden client; then nothing tagged may be left."""
        if self.containers:
            self.engine.docker("rm", "-f", *self.containers, check=False)
        if self.images:
            self.engine.docker("rmi", *self.images, check=False)
        marker = f"--tag {self.prefix}-"
        for node, pid in self.node_pids:
            self.box.run_on(
                node,
                f"case $(tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null) in "
                f'*"{marker}"*) kill -KILL {pid} ;; esac; rm -f /tmp/{self.prefix}-*.err',
            )
        for node in self.attached:
            self.engine.detach(self.box, node)
        for node in self.hidden:
            self.box.unbind(node, NODE_DOCKER)
        gone = poll(lambda: not self.procs(), DEADLINE_S)
        assert gone, f"left behind: {self.procs()}"


@pytest.fixture(scope="module")
def scripts(docker_engine: DockerEngine) -> Iterator[Path]:
    """train.py and watch.py in a dir both the nodes and (mounted at /kd) the containers see."""
    path = docker_engine.root / "kd-scripts"
    path.mkdir(exist_ok=True)
    (path / "train.py").write_text(TRAIN_PY)
    (path / "watch.py").write_text(WATCH_PY)
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.fixture
def kd(
    sandbox: Any, docker_engine: DockerEngine, scripts: Path, request: pytest.FixtureRequest
) -> Iterator[Docker]:
    """The engine for one test; everything the test made is removed afterwards."""
    token = f"{request.node.nodeid}|{os.getpid()}"
    prefix = "kd" + hashlib.sha1(token.encode()).hexdigest()[:6]
    d = Docker(docker_engine, sandbox, prefix, scripts)
    try:
        yield d
    finally:
        d.teardown()


@pytest.fixture
def login(sandbox: Any) -> Iterator[Any]:
    """The last node, with a non-root login `kdop` (no sudo, not in group docker) in that
    node's mount namespace only."""
    node = sandbox.nodes()[-1]
    try:
        setup = sandbox.run_on(node, _LOGIN_SETUP)
        assert setup.returncode == 0, setup.stderr
        assert setup.stdout.split() == [LOGIN], "kdop must be in its own group only"
        yield node
    finally:
        teardown = sandbox.run_on(node, _LOGIN_TEARDOWN)
        assert teardown.returncode == 0, teardown.stderr or teardown.stdout


def kill_docker(box: Any, log_dir: Path, *args: str, **kw: Any) -> FleetResult:
    """`fleet kill-docker --yes --json ARGS`."""
    return run_fleet(box, "kill-docker", "--yes", "--json", *args, log_dir=log_dir, **kw)


def lines(result: FleetResult, host: str) -> list[str]:
    return [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["host"] == host and e["stream"] == "stdout"
    ]


def last_line(result: FleetResult, host: str) -> str:
    return str(result.final()["hosts"][host]["last_line"])


# ---------------------------------------------------------------- selection and the kill


def test_kills_only_the_named_containers_training_processes(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    node = kd.attach(sandbox.nodes()[0])
    kd.run("train-a")
    kd.run("train-b")
    kd.spawn("train-a", "torchrun", "a-torchrun")
    kd.spawn("train-a", "watched", "a-trainer")
    kd.spawn("train-a", "other", "a-tensorboard")
    kd.spawn("train-b", "trainer", "b-trainer")
    kd.spawn_on_node(node, "trainer", "host-trainer")
    spared = ("a-tensorboard", "a-trainer-watch", "b-trainer", "host-trainer")
    before = kd.wait_for("a-torchrun", "a-trainer", *spared)
    in_a = ("a-torchrun", "a-trainer", "a-trainer-watch", "a-tensorboard")
    assert {before[t].pidns for t in in_a} == {kd.pidns("train-a")}
    assert before["b-trainer"].pidns == kd.pidns("train-b") != kd.pidns("train-a")
    assert before["host-trainer"].pidns == kd.node_pidns(node) != kd.pidns("train-a")
    # A real container's processes are outside the node's PID namespace: the node cannot see
    # (let alone signal) them, hence docker exec.
    assert kd.visible_on(node, "host-trainer")
    assert not kd.visible_on(node, "a-trainer")
    since = time.time()

    result = kill_docker(
        sandbox, tmp_path, "--container", kd.name("train-a"), "--limit", node.name, "--grace", "1"
    )

    assert result.code == 0, result.stdout + result.stderr
    after = kd.procs()
    assert "a-torchrun" not in after
    assert "a-trainer" not in after
    for tag in spared:
        assert after[tag].pid == before[tag].pid, f"{tag} was killed"
    out = lines(result, node.name)
    a = kd.name("train-a")
    assert any(
        x.startswith(f"[{a}] killed ") and "(TERM)" in x and kd.name("a-torchrun") in x for x in out
    ), out
    assert any(
        x.startswith(f"[{a}] killed ") and "(KILL)" in x and kd.name("a-trainer") in x for x in out
    ), out
    # The TERM-ignoring trainer ended by SIGKILL, and only after the grace period.
    ended = kd.ended("train-a", "a-trainer")
    assert ended["signal"] == 9, ended
    assert ended["term_to_death_s"] is not None, "the trainer never saw SIGTERM"
    assert ended["term_to_death_s"] >= 0.9, f"grace of 1 s not honoured: {ended}"
    assert last_line(result, node.name) == f"kill-docker: 1 container: {a} killed 2"
    assert kd.state("train-a") == "running", "without --stop the container keeps running"
    # Into train-a only: facts.sh, then act.sh signalling both (1 s = 10 deciseconds of grace)
    # and looking again; nothing went into train-b.
    execs = kd.fleet_execs(since)
    assert execs[0] == (a, f"sh -s -- {FACTS_ARGS}"), execs
    assert len(execs) == 2, execs
    assert execs[1] == (a, "sh -s --")  # act.sh: its `signal 10 PID:START... facts` on stdin


def test_selection_by_label_image_and_regex(sandbox: Any, kd: Docker, tmp_path: Path) -> None:
    node = kd.attach(sandbox.nodes()[0])
    torch23 = kd.tag_image("pytorch:2.3")
    torch24 = kd.tag_image("pytorch:2.4")
    ngc = kd.tag_image("nvcr.io/nvidia/pytorch:24.01-py3")
    kd.run("lab-a", image=torch23, labels=("job=llama", "team=nlp"))
    kd.run("lab-b", image=torch23, labels=("job=other",))
    kd.run("img-c", image=ngc)
    kd.run("img-d", image=torch24, labels=("job=llama",))
    for name in ("lab-a", "lab-b", "img-c", "img-d"):
        kd.spawn(name, "trainer", name)
    kd.wait_for("lab-a", "lab-b", "img-c", "img-d")
    common = ("--limit", node.name, "--grace", "0.2")

    # Different kinds AND: job=llama on pytorch:2.3 is lab-a only (img-d runs pytorch:2.4).
    by_label = kill_docker(sandbox, tmp_path, *common, "--label", "job=llama", "--image", torch23)

    assert by_label.code == 0, by_label.stdout + by_label.stderr
    assert set(kd.procs()) == {"lab-b", "img-c", "img-d"}
    assert (
        last_line(by_label, node.name) == f"kill-docker: 1 container: {kd.name('lab-a')} killed 1"
    )

    # Values of one kind OR; a repository without a tag matches any tag of it.
    repo = ngc.rsplit(":", 1)[0]
    by_image = kill_docker(sandbox, tmp_path, *common, "--image", repo, "--image", torch24)

    assert by_image.code == 0, by_image.stdout + by_image.stderr
    assert set(kd.procs()) == {"lab-b"}
    # (in `docker ps` order: the newest container first)
    assert last_line(by_image, node.name) == (
        f"kill-docker: 2 containers: {kd.name('img-d')} killed 1, {kd.name('img-c')} killed 1"
    )

    # A bare label key selects by presence; nothing carries job=nope.
    by_key = kill_docker(sandbox, tmp_path, *common, "--label", "team", "--label", "job=nope")

    assert by_key.code == 0, by_key.stdout + by_key.stderr
    assert set(kd.procs()) == {"lab-b"}
    assert last_line(by_key, node.name) == (
        f"kill-docker: 1 container: {kd.name('lab-a')} nothing matched"
    )

    # --container is an anchored extended regex over the names.
    by_regex = kill_docker(sandbox, tmp_path, *common, "--container", kd.name("lab-.*"))

    assert by_regex.code == 0, by_regex.stdout + by_regex.stderr
    assert kd.procs() == {}
    assert last_line(by_regex, node.name) == (
        f"kill-docker: 2 containers: {kd.name('lab-b')} killed 1, "
        f"{kd.name('lab-a')} nothing matched"
    )


def test_stop_kills_then_stops_the_container(sandbox: Any, kd: Docker, tmp_path: Path) -> None:
    node = kd.attach(sandbox.nodes()[0])
    kd.run("train-a")
    kd.run("train-b")
    kd.spawn("train-a", "trainer", "a-trainer")
    kd.spawn("train-a", "other", "a-tensorboard")
    kd.spawn("train-b", "trainer", "b-trainer")
    kd.wait_for("a-trainer", "a-tensorboard", "b-trainer")
    since = time.time()

    result = kill_docker(
        sandbox, tmp_path, "--container", kd.name("train-a"), "--stop", "--limit", node.name,
        "--grace", "0.5",
    )  # fmt: skip

    assert result.code == 0, result.stdout + result.stderr
    assert kd.state("train-a") == "exited"
    assert kd.state("train-b") == "running"
    # Stopping ends everything in the container, the unrelated process too; train-b is untouched.
    assert set(kd.procs()) == {"b-trainer"}
    a = kd.name("train-a")
    out = lines(result, node.name)
    assert out.index(f"[{a}] stopped") > min(
        i for i, x in enumerate(out) if "(KILL)" in x and kd.name("a-trainer") in x
    ), "the kill (TERM, grace, KILL) must come before docker stop"
    assert last_line(result, node.name) == f"kill-docker: 1 container: {a} killed 1, stopped"
    stops = [e["Actor"]["Attributes"]["name"] for e in kd.events(since, "event=stop")]
    assert stops == [a]


def test_a_matching_pid_1_is_reported_left_and_stop_ends_it(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # No --init: the container's main process (pid 1) is torchrun itself, and cleanup never kills
    # pid 1. As pid 1 it also ignores SIGTERM (no handler), so docker stop must escalate to KILL.
    node = kd.attach(sandbox.nodes()[0])
    kd.run("solo", *argv("torchrun", kd.name("solo-pid1"), INNER_SCRIPTS), init=False)
    kd.spawn("solo", "trainer", "solo-trainer")
    kd.wait_for("solo-pid1", "solo-trainer")
    common = ("--container", kd.name("solo"), "--limit", node.name, "--grace", "0.2")

    kept = kill_docker(sandbox, tmp_path, *common)

    solo = kd.name("solo")
    assert kept.code == 3, kept.stdout + kept.stderr
    assert set(kd.procs()) == {"solo-pid1"}
    assert any(
        x.startswith(f"[{solo}] left: pid 1") and "--stop" in x for x in lines(kept, node.name)
    )
    assert last_line(kept, node.name) == f"kill-docker: 1 container: {solo} killed 1, pid 1 left"
    since = time.time()

    stopped = kill_docker(sandbox, tmp_path, *common, "--stop")

    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert kd.procs() == {}
    assert kd.state("solo") == "exited"
    assert last_line(stopped, node.name) == (
        f"kill-docker: 1 container: {solo} nothing matched, stopped"
    )
    # docker stop got the grace rounded up to whole seconds (0.2 -> 1): TERM, 1 s, then KILL.
    kills = [
        (int(e["Actor"]["Attributes"]["signal"]), e["timeNano"] / 1e9)
        for e in kd.events(since, "event=kill", f"container={solo}")
    ]
    assert [signal for signal, _ in kills] == [15, 9], kills
    assert kills[1][1] - kills[0][1] >= 0.9, f"docker stop did not wait 1 s: {kills}"


def test_killing_the_main_process_ends_the_container_even_when_docker_learns_late(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # With --init the training command is docker-init's child, not pid 1: the kill ends it, so
    # docker-init exits, the container ends, and so does the kill's own docker exec (exit 137).
    # The daemon says "exited" only once every process in the container is reaped; here one
    # stays unreaped for HOLD_S after the kill (as one stuck in a GPU driver call would), and
    # until then `docker ps` says "running". fleet waits to be told: reading "running" as
    # "kill failed (exit 137)" would fail the host (it happens under load without any hold).
    node = kd.attach(sandbox.nodes()[0])
    kd.run("main", *argv("torchrun", kd.name("main-torchrun"), INNER_SCRIPTS))
    kd.spawn("main", "other", "main-tensorboard")
    kd.wait_for("main-torchrun", "main-tensorboard")

    with kd.slow_to_end("main") as release:

        def release_after_the_kill() -> None:
            poll(lambda: "main-torchrun" not in kd.procs(), DEADLINE_S)
            time.sleep(HOLD_S)
            release()

        releaser = threading.Thread(target=release_after_the_kill, daemon=True)
        releaser.start()
        result = kill_docker(
            sandbox, tmp_path, "--container", kd.name("main"), "--limit", node.name,
            "--grace", "1",
        )  # fmt: skip
        releaser.join(DEADLINE_S)

    main = kd.name("main")
    assert result.code == 0, result.stdout + result.stderr
    assert kd.state("main") == "exited"
    assert kd.procs() == {}, "the container's end took every process in it"
    out = lines(result, node.name)
    # The kill sent TERM; then either it died with the container before it could report what
    # ended, or it reported the kill first and the container's end came after (which of the two
    # depends on when docker-init exits): never "kill failed".
    assert f"[{main}] kill: sending TERM to 1 process, KILL after 1s" in out
    died_with_it = f"[{main}] container exited during the kill: its main process ended" in out
    reported_first = f"[{main}] container exited: its main process ended" in out and any(
        line.startswith(f"[{main}] killed ") and "(TERM)" in line for line in out
    )
    assert died_with_it != reported_first, out
    ended = "container exited" if died_with_it else "killed 1, container exited"
    assert last_line(result, node.name) == f"kill-docker: 1 container: {main} {ended}"


def test_a_container_its_restart_policy_starts_again_is_no_success_and_stop_ends_it(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # A training container with a restart policy (auto-resume): killing its training command
    # ends its main process, and docker starts the container again, training included. That is
    # not "container exited": without --stop the host fails, and --stop must still stop it.
    node = kd.attach(sandbox.nodes()[0])
    cmd = argv("torchrun", kd.name("auto-torchrun"), INNER_SCRIPTS)
    kd.run("auto", *cmd, restart="unless-stopped")
    first = kd.wait_for("auto-torchrun")["auto-torchrun"].pid
    common = ("--container", kd.name("auto"), "--limit", node.name, "--grace", "1")
    auto = kd.name("auto")

    kept = kill_docker(sandbox, tmp_path, *common)

    assert kept.code == 3, kept.stdout + kept.stderr
    assert any(
        x.startswith(f"[{auto}] container restarted by its restart policy") and "--stop" in x
        for x in lines(kept, node.name)
    ), lines(kept, node.name)
    assert last_line(kept, node.name) in (
        f"kill-docker: 1 container: {auto} restarted",
        f"kill-docker: 1 container: {auto} killed 1, restarted",
    )
    again = kd.wait_for("auto-torchrun")["auto-torchrun"].pid
    assert again != first, "docker started the container again"

    stopped = kill_docker(sandbox, tmp_path, *common, "--stop")

    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert kd.state("auto") == "exited"
    assert kd.procs() == {}
    assert last_line(stopped, node.name) in (
        f"kill-docker: 1 container: {auto} restarted, stopped",
        f"kill-docker: 1 container: {auto} killed 1, restarted, stopped",
        f"kill-docker: 1 container: {auto} killed 1, stopped",
    )


def test_an_entrypoint_that_ends_with_its_trainer_and_a_restart_policy_is_no_success(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # The main process is an entrypoint shell that runs the trainer as its child and matches no
    # pattern (`^torchrun` matches the trainer's command line only): the kill ends the trainer,
    # the shell exits a second later (after its own epilogue, well after the kill reported),
    # and the restart policy starts the container, training included, again.
    node = kd.attach(sandbox.nodes()[0])
    train = shlex.join(argv("torchrun", kd.name("entry-torchrun"), INNER_SCRIPTS))
    kd.run("entry", "sh", "-c", f"{train}; sleep 1; exit 1", restart="unless-stopped")
    kd.wait_for("entry-torchrun")
    entry = kd.name("entry")
    before = int(kd.docker("inspect", "-f", "{{.RestartCount}}", entry))

    result = kill_docker(
        sandbox, tmp_path, "--container", entry, "--pattern", "^torchrun", "--limit", node.name,
        "--grace", "1",
    )  # fmt: skip

    assert result.code == 3, result.stdout + result.stderr
    assert int(kd.docker("inspect", "-f", "{{.RestartCount}}", entry)) > before
    assert any(
        x.startswith(f"[{entry}] container restarted by its restart policy")
        for x in lines(result, node.name)
    ), lines(result, node.name)
    assert last_line(result, node.name) == f"kill-docker: 1 container: {entry} killed 1, restarted"


def test_default_selection_only_touches_containers_with_matching_processes(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    node = kd.attach(sandbox.nodes()[0])
    kd.run("busy")
    kd.run("quiet")
    kd.spawn("busy", "torchrun", "busy-torchrun")
    kd.spawn("quiet", "other", "quiet-tensorboard")
    kd.spawn_on_node(node, "trainer", "host-trainer")
    kd.wait_for("busy-torchrun", "quiet-tensorboard", "host-trainer")
    since = time.time()

    result = kill_docker(sandbox, tmp_path, "--limit", node.name, "--grace", "1")

    busy, quiet = kd.name("busy"), kd.name("quiet")
    assert result.code == 0, result.stdout + result.stderr
    assert set(kd.procs()) == {"quiet-tensorboard", "host-trainer"}
    assert f"[{quiet}] no matching process" in lines(result, node.name)
    assert last_line(result, node.name) == f"kill-docker: 1 container: {busy} killed 1"
    # Both were looked into (facts.sh only reads); only busy got act.sh (its arguments on stdin).
    execs = kd.fleet_execs(since)
    assert {(c, cmd.split()[3] if cmd != "sh -s --" else "act.sh") for c, cmd in execs} == {
        (busy, "--pattern"),
        (quiet, "--pattern"),
        (busy, "act.sh"),
    }, execs
    assert len(execs) == 3, execs


def test_named_containers_that_are_missing_or_not_running_fail_the_host(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    node = kd.attach(sandbox.nodes()[0])
    kd.run("train-a")
    kd.run("old", "true")  # exits at once
    kd.spawn("train-a", "trainer", "a-trainer")
    kd.wait_for("a-trainer")
    assert poll(lambda: kd.state("old") == "exited"), kd.state("old")
    a, old, nope = kd.name("train-a"), kd.name("old"), kd.name("nope")

    result = kill_docker(
        sandbox, tmp_path, "--container", a, "--container", nope, "--container", old,
        "--limit", node.name, "--grace", "0.2",
    )  # fmt: skip

    assert result.code == 3, result.stdout + result.stderr
    assert result.final()["hosts"][node.name]["outcome"] == "failed"
    out = lines(result, node.name)
    assert f"no such container: {nope}" in out
    assert f"container not running: {old} (exited)" in out
    assert kd.procs() == {}, "the container that does run is still acted on"
    assert last_line(result, node.name) == (
        f"kill-docker: 1 container: {a} killed 1; "
        f"no such container: {nope}; container not running: {old} (exited)"
    )


def test_a_paused_container_is_reported_never_silently_left_and_stop_ends_it(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # `docker pause` freezes a training container: its processes (and their GPU memory) stay,
    # and docker exec refuses it, so fleet cannot look inside. It must never pass for "no
    # matching process" or "not running"; docker stop does end it.
    node = kd.attach(sandbox.nodes()[0])
    kd.run("frozen", labels=("job=frozen",))
    kd.spawn("frozen", "torchrun", "frozen-torchrun")
    before = kd.wait_for("frozen-torchrun")
    kd.docker("pause", kd.name("frozen"))
    frozen = kd.name("frozen")
    pattern = ("--pattern", f"[{kd.prefix[0]}]{kd.prefix[1:]}-frozen-")
    common = ("--limit", node.name, "--grace", "0.2", *pattern)

    default = kill_docker(sandbox, tmp_path, *common)

    assert default.code == 0, default.stdout + default.stderr
    assert f"[{frozen}] skipped: paused: docker exec cannot look inside" in lines(
        default, node.name
    )
    assert f"skipped {frozen} (paused)" in last_line(default, node.name)

    named = kill_docker(sandbox, tmp_path, *common, "--container", frozen)

    assert named.code == 3, named.stdout + named.stderr
    assert last_line(named, node.name) == (
        f"kill-docker: nothing killed; container paused: {frozen} (docker exec cannot look "
        "inside; unpause it, or stop it with --stop)"
    )
    assert kd.procs() == before
    assert kd.state("frozen") == "paused"

    stopped = kill_docker(sandbox, tmp_path, *common, "--label", "job=frozen", "--stop")

    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert kd.state("frozen") == "exited"
    assert kd.procs() == {}
    assert last_line(stopped, node.name) == f"kill-docker: 1 container: {frozen} paused, stopped"


def test_a_container_without_sh_is_reported_with_dockers_reason(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # A distroless-like container: no sh on its PATH (docker exec uses the container's), so
    # fleet's helper cannot run there. docker exec -i says why on stdout, not stderr: that
    # reason must reach the operator, in the default selection's skip and in a named failure.
    node = kd.attach(sandbox.nodes()[0])
    trainer = ["/usr/bin/python3", *argv("trainer", kd.name("nosh-trainer"), INNER_SCRIPTS)[1:]]
    kd.run("nosh", *trainer, env=("PATH=/nonexistent",))
    before = kd.wait_for("nosh-trainer")
    nosh = kd.name("nosh")
    reason = 'exec: "sh": executable file not found in $PATH'

    default = kill_docker(sandbox, tmp_path, "--limit", node.name, "--grace", "0.2")

    assert default.code == 0, default.stdout + default.stderr
    out = lines(default, node.name)
    assert any(x.startswith(f"[{nosh}] skipped: cannot run sh") and reason in x for x in out), out

    named = kill_docker(sandbox, tmp_path, "--container", nosh, "--limit", node.name)

    assert named.code == 3, named.stdout + named.stderr
    out = lines(named, node.name)
    assert any(x.startswith(f"[{nosh}] kill did not run") and reason in x for x in out), out
    assert kd.procs() == before


def test_container_sharing_the_host_pid_namespace_is_refused(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    # `docker run --pid host`: a kill "inside" it would hit every matching process of the host.
    # Here the host is this whole machine (the node's PID namespace is a child of it), so the
    # pattern matches only this test's two processes, and not itself: "[k]d..." is not "kd...".
    node = kd.attach(sandbox.nodes()[0])
    kd.run("hostpid", pid_host=True)
    kd.spawn("hostpid", "torchrun", "hp-torchrun")
    kd.spawn_on_node(node, "trainer", "hp-node-trainer")
    before = kd.wait_for("hp-torchrun", "hp-node-trainer")
    assert before["hp-torchrun"].pidns == os.readlink("/proc/self/ns/pid")
    pattern = f"[{kd.prefix[0]}]{kd.prefix[1:]}-hp-"
    hostpid = kd.name("hostpid")

    result = kill_docker(
        sandbox, tmp_path, "--container", hostpid, "--pattern", pattern, "--limit", node.name,
        "--grace", "0.2",
    )  # fmt: skip

    assert result.code == 3, result.stdout + result.stderr
    assert {t: p.pid for t, p in kd.procs().items()} == {t: p.pid for t, p in before.items()}, (
        "nothing may be killed"
    )
    assert any(x.startswith(f"[{hostpid}] refused:") for x in lines(result, node.name))
    assert last_line(result, node.name) == (
        f"kill-docker: 1 container: {hostpid} refused (host PID namespace)"
    )

    # The default selection (no selector) skips it instead of probing the whole host.
    default = kill_docker(
        sandbox, tmp_path, "--pattern", pattern, "--limit", node.name, "--grace", "0.2"
    )

    assert default.code == 0, default.stdout + default.stderr
    assert {t: p.pid for t, p in kd.procs().items()} == {t: p.pid for t, p in before.items()}
    assert last_line(default, node.name) == (
        "kill-docker: no running container has a matching process (1 running); "
        f"skipped {hostpid} (host PID namespace)"
    )


def test_dry_run_prints_the_command_and_touches_nothing(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    node = kd.attach(sandbox.nodes()[0])
    kd.run("train-a")
    kd.spawn("train-a", "trainer", "a-trainer")
    before = kd.wait_for("a-trainer")
    since = time.time()
    log_dir = tmp_path / "runs"

    result = run_fleet(
        sandbox, "kill-docker", "--dry-run", "--container", kd.name("train-a"), "--limit",
        node.name, "--grace", "3", log_dir=log_dir,
    )  # fmt: skip

    assert result.code == 0, result.stdout + result.stderr
    assert node.name in result.stdout
    assert f"--container {kd.name('train-a')}" in result.stdout
    assert "--grace 3" in result.stdout
    assert kd.procs() == before
    assert kd.events(since) == [], "a dry run must not reach docker"
    assert not log_dir.exists() or not list(log_dir.iterdir()), "no run record for a dry run"


# ---------------------------------------------------------------- hosts without a usable docker


def _inventory(tmp_path: Path, sandbox: Any, users: dict[str, str]) -> Path:
    """An inventory of the sandbox's nodes, each logging in as `users[name]` (default root)."""
    hosts = "".join(
        f"    {n.name}:\n      ansible_host: {n.address}\n"
        f"      ansible_user: {users.get(n.name, 'root')}\n"
        for n in sandbox.nodes()
    )
    path = tmp_path / "inventory.yaml"
    path.write_text(
        "all:\n  vars:\n"
        f"    ansible_ssh_private_key_file: {json.dumps(str(sandbox.key_path))}\n"
        f"  hosts:\n{hosts}"
    )
    return path


def test_json_carries_each_hosts_distinct_outcome(
    sandbox: Any, kd: Docker, login: Any, tmp_path: Path
) -> None:
    killed, no_docker, down = sandbox.nodes()[:3]
    denied = login
    kd.attach(killed)
    kd.attach(denied)
    kd.hide_docker(no_docker)
    kd.run("train-a")
    kd.spawn("train-a", "trainer", "a-trainer")
    kd.wait_for("a-trainer")
    assert sandbox.run_on(no_docker, "command -v docker").returncode != 0
    assert sandbox.run_on(down, "command -v docker && ! test -e /run/docker.sock").returncode == 0
    inventory = _inventory(tmp_path, sandbox, {denied.name: LOGIN})

    # --no-sudo: kdop has no sudo; the root logins need none.
    result = kill_docker(
        sandbox, tmp_path / "runs", "--no-sudo", "--grace", "0.2", inventory=inventory
    )

    assert result.code == 3, result.stdout + result.stderr
    final = result.final()
    assert final["exit_code"] == 3
    hosts = final["hosts"]
    assert {h: hosts[h]["outcome"] for h in hosts} == {
        killed.name: "ok",
        no_docker.name: "ok",
        denied.name: "failed",
        down.name: "failed",
    }
    a = kd.name("train-a")
    assert hosts[killed.name]["last_line"] == f"kill-docker: 1 container: {a} killed 1"
    assert hosts[no_docker.name]["last_line"] == "kill-docker: skipped: docker not installed"
    assert hosts[denied.name]["last_line"] == (
        "kill-docker: permission denied on the docker socket "
        "(run with sudo or join the docker group)"
    )
    assert any("permission denied while trying to connect" in x for x in lines(result, denied.name))
    assert hosts[down.name]["last_line"] == (
        "kill-docker: cannot reach the docker daemon (is it running?)"
    )
    assert any("Is the docker daemon running?" in x for x in lines(result, down.name))
    assert kd.procs() == {}


def test_a_login_whose_sudo_needs_a_password_is_told_so(
    sandbox: Any, kd: Docker, login: Any, tmp_path: Path
) -> None:
    # kdop has no sudo rights (kill-docker's step uses sudo by default). sudo warns first that
    # it cannot resolve the node's name, as on many real nodes, then fails: its failure is the
    # reason to show, not its warning, and not "docker ps failed".
    kd.attach(login)
    inventory = _inventory(tmp_path, sandbox, {login.name: LOGIN})

    result = kill_docker(
        sandbox, tmp_path / "runs", "--limit", login.name, "--grace", "0.2", inventory=inventory
    )

    assert result.code == 3, result.stdout + result.stderr
    host = result.final()["hosts"][login.name]
    assert "docker ps: sudo: a password is required" in lines(result, login.name)
    assert host["last_line"] == (
        "kill-docker: sudo failed, docker ps did not run (a password: pass -K; a login in the "
        "docker group: --no-sudo)"
    )
    assert host["reason"] == "sudo needs a password (pass -K/--ask-become-pass)"


def test_no_docker_fails_only_when_containers_were_named(
    sandbox: Any, kd: Docker, tmp_path: Path
) -> None:
    node = kd.hide_docker(sandbox.nodes()[1])
    assert sandbox.run_on(node, "command -v docker").returncode != 0

    named = kill_docker(sandbox, tmp_path, "--container", "train-a", "--limit", node.name)

    assert named.code == 3, named.stdout + named.stderr
    assert last_line(named, node.name) == (
        "kill-docker: docker not installed, but containers were named: train-a"
    )
