"""`fleet kill-docker` against real sshd nodes, with a stand-in for Docker.

No Docker engine can run here (there is no daemon, and the nodes are namespaces, not machines), so
each test installs `tests/cluster/docker_shim.sh` as `docker` on a node's PATH (`node.bin_dir` is
mounted over the node's /usr/local/bin). The shim's containers are real isolation, not
bookkeeping: each is a child PID + mount namespace of the node (`unshare --pid --fork
--mount-proc`), `docker exec` enters it with nsenter, and processes inside see only their own
/proc. So these tests prove that fleet/remote/docker.sh selects the right containers and that the
cleanup.sh it feeds into each one kills there and nowhere else (not on the node, not in the other
containers). What they cannot prove is compatibility with a real dockerd: the shim mimics the
CLI's output formats and error messages, and fleet's calls are asserted from its log.

Every process a test plants carries `--tag kd-<name>` in its command line, built at exec time so
no wrapper's argv (nsenter, sh -c) contains it; the tests find processes by tag and by PID
namespace through /proc, and each test kills exactly what it started, by pid.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

pytestmark = pytest.mark.cluster

SHIM = Path(__file__).resolve().parent / "docker_shim.sh"
STATE = "/run/fake-docker"
TRAINER_PATH = "/tmp/kd_train.py"
# A trainer that ignores SIGTERM, as a wedged NCCL job does: only SIGKILL ends it.
TRAINER = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(3600)
"""
# What each kind of planted process runs; "$0" is the tag, so the tag appears in the final
# process's argv only (not in the argv of bash -c, sh -c or nsenter before the exec).
KINDS = {
    "torchrun": ["bash", "-c", 'exec -a "torchrun --nproc-per-node 8 --tag "kd-$0 sleep 3600'],
    "trainer": ["sh", "-c", f'exec python3 {TRAINER_PATH} --deepspeed --tag "kd-$0"'],
    "other": ["bash", "-c", 'exec -a "tensorboard --logdir /runs --tag "kd-$0 sleep 3600'],
}
TAG = re.compile(r"--tag kd-(\S+)")
# Lists every live (not zombie) process carrying a tag: "pid pid-namespace cmdline".
SCAN = r"""
for d in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
    case $cmd in *"--tag kd-"*) ;; *) continue ;; esac
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "$d/status" 2>/dev/null)
    case $state in '' | Z | X) continue ;; esac
    printf '%s %s %s\n' "${d#/proc/}" "$(readlink "$d/ns/pid")" "$cmd"
done
"""
DEADLINE_S = 15.0


@dataclass(frozen=True)
class Proc:
    pid: int
    pidns: str
    cmdline: str


@dataclass
class FakeDocker:
    """The docker shim on one sandbox node, and everything a test started through it."""

    box: Any
    node: Any
    host_pids: list[int] = field(default_factory=list)

    def sh(self, script: str, check: bool = True) -> str:
        """Run a script as root on the node; its stdout."""
        result = self.box.run_on(self.node, script)
        if check:
            assert result.returncode == 0, f"{script!r}: {result.stderr or result.stdout}"
        return str(result.stdout)

    def install(self) -> None:
        shim = self.node.bin_dir / "docker"
        shim.write_text(SHIM.read_text())
        shim.chmod(0o755)
        self.sh(f"rm -rf {STATE}; printf %s {shlex.quote(TRAINER)} > {TRAINER_PATH}")

    def docker(self, *args: str) -> str:
        return self.sh(shlex.join(["docker", *args])).strip()

    def run(
        self, name: str, *cmd: str, image: str = "pytorch:2.3", labels: tuple[str, ...] = ()
    ) -> str:
        """`docker run -d`: a container whose pid 1 is CMD (by default a plain sleep)."""
        flags = [a for label in labels for a in ("--label", label)]
        return self.docker("run", "-d", "--name", name, *flags, image, *(cmd or ("sleep", "3600")))

    def spawn(self, container: str, kind: str, tag: str) -> None:
        """Start a tagged process inside a container with `docker exec -d`."""
        self.docker("exec", "-d", container, *KINDS[kind], tag)

    def spawn_on_host(self, kind: str, tag: str) -> None:
        """Start a tagged process on the node itself, outside any container."""
        cmd = shlex.join([*KINDS[kind], tag])
        self.host_pids.append(int(self.sh(f"setsid {cmd} </dev/null >/dev/null 2>&1 & echo $!")))

    def procs(self) -> dict[str, Proc]:
        """Every live tagged process on the node, by tag."""
        found = {}
        for line in self.sh(SCAN).splitlines():
            pid, pidns, cmdline = line.split(" ", 2)
            m = TAG.search(cmdline)
            if m:
                found[m.group(1)] = Proc(int(pid), pidns, cmdline)
        return found

    def wait_for(self, *tags: str) -> dict[str, Proc]:
        """Poll until every tag runs (planting is asynchronous); fail at the deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            procs = self.procs()
            if all(t in procs for t in tags):
                return procs
            assert time.monotonic() < deadline, f"not started: {set(tags) - set(procs)}"
            time.sleep(0.1)

    def pidns(self, container: str | None = None) -> str:
        """The PID namespace of a container's init, or of the node itself."""
        target = f"$(cat {STATE}/containers/{container}/pid)" if container else "self"
        return self.sh(f"readlink /proc/{target}/ns/pid").strip()

    def state(self, container: str) -> str:
        """The container's state as `docker ps -a` reports it."""
        listing = self.docker("ps", "-a", "--format", "{{.Names}} {{.State}}")
        return dict(line.split() for line in listing.splitlines())[container]

    def fault(self, kind: str) -> None:
        """Make every later docker command fail: DENY (socket permission) or DOWN (no daemon)."""
        self.sh(f"mkdir -p {STATE} && touch {STATE}/{kind}")

    def calls(self) -> list[str]:
        return self.sh(f"cat {STATE}/calls").splitlines()

    def teardown(self) -> None:
        """Kill what this test started, by pid: each container's init (which ends its PID
        namespace), `docker exec -d` launchers and their children, host processes; then remove
        the shim and its state, and check that no tagged process is left."""
        host = " ".join(str(p) for p in self.host_pids)
        self.sh(
            f"""
start() {{ sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }}
for c in {STATE}/containers/*/; do
    [ -d "$c" ] || continue
    pid=$(cat "$c/pid") start=$(cat "$c/start")
    [ -n "$pid" ] && [ "$(start "$pid")" = "$start" ] && kill -KILL "$pid"
    for e in $(cat "$c/execs"); do
        case $(tr '\\0' ' ' <"/proc/$e/cmdline" 2>/dev/null) in
        nsenter*) pkill -KILL -P "$e"; kill -KILL "$e" ;;
        esac
    done
done
for p in {host}; do
    case $(tr '\\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) in *"--tag kd-"*) kill -KILL "$p" ;; esac
done
true
""",
        )
        deadline = time.monotonic() + DEADLINE_S
        while (left := self.procs()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (self.node.bin_dir / "docker").unlink(missing_ok=True)
        self.sh(f"rm -rf {STATE} {TRAINER_PATH}")
        assert not left, f"{self.node.name}: left behind: {left}"


@pytest.fixture
def fake_docker(sandbox: Any) -> Iterator[Callable[[Any], FakeDocker]]:
    """Install the shim on a node (the first by default); everything is removed afterwards."""
    made: list[FakeDocker] = []

    def make(node: Any = None) -> FakeDocker:
        fd = FakeDocker(sandbox, node or sandbox.nodes()[0])
        made.append(fd)
        fd.install()
        return fd

    try:
        yield make
    finally:
        for fd in made:
            fd.teardown()


def kill_docker(box: Any, log_dir: Path, *args: str) -> FleetResult:
    """`fleet kill-docker --yes --json ARGS`."""
    return run_fleet(box, "kill-docker", "--yes", "--json", *args, log_dir=log_dir)


def lines(result: FleetResult, host: str) -> list[str]:
    return [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["host"] == host and e["stream"] == "stdout"
    ]


def last_line(result: FleetResult, host: str) -> str:
    return str(result.final()["hosts"][host]["last_line"])


def test_kills_only_the_named_containers_training_processes(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    d = fake_docker()
    a_id = d.run("train-a")
    d.run("train-b")
    d.spawn("train-a", "torchrun", "a-torchrun")
    d.spawn("train-a", "trainer", "a-trainer")
    d.spawn("train-a", "other", "a-tensorboard")
    d.spawn("train-b", "trainer", "b-trainer")
    d.spawn_on_host("trainer", "host-trainer")
    before = d.wait_for("a-torchrun", "a-trainer", "a-tensorboard", "b-trainer", "host-trainer")
    # The stand-in isolates for real: train-a's processes are in its own PID namespace.
    assert {before[t].pidns for t in ("a-torchrun", "a-trainer", "a-tensorboard")} == {
        d.pidns("train-a")
    }
    assert before["b-trainer"].pidns == d.pidns("train-b") != d.pidns("train-a")
    assert before["host-trainer"].pidns == d.pidns() != d.pidns("train-a")

    result = kill_docker(
        sandbox, tmp_path, "--container", "train-a", "--limit", d.node.name, "--grace", "1"
    )

    assert result.code == 0, result.stdout + result.stderr
    after = d.procs()
    assert "a-torchrun" not in after
    assert "a-trainer" not in after
    for spared in ("a-tensorboard", "b-trainer", "host-trainer"):
        assert after[spared].pid == before[spared].pid, f"{spared} was killed"
    out = lines(result, d.node.name)
    assert any(
        x.startswith("[train-a] killed ") and "(TERM)" in x and "kd-a-torchrun" in x for x in out
    ), out
    # the TERM-ignoring trainer ended only by SIGKILL, after the grace period
    assert any(
        x.startswith("[train-a] killed ") and "(KILL)" in x and "kd-a-trainer" in x for x in out
    ), out
    assert last_line(result, d.node.name) == "kill-docker: 1 container: train-a killed 2"
    assert d.state("train-a") == "running", "without --stop the container keeps running"
    # one docker exec, into train-a, running cleanup.sh's kill; nothing went into train-b
    execs = [c for c in d.calls() if c.startswith("docker exec -i")]
    assert len(execs) == 1, execs
    assert execs[0].startswith(f"docker exec -i -u 0 {a_id} sh -s -- kill --grace 1"), execs


def test_label_and_image_selection(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    d = fake_docker()
    d.run("lab-a", image="pytorch:2.3", labels=("job=llama", "team=nlp"))
    d.run("lab-b", image="pytorch:2.3", labels=("job=other",))
    d.run("img-c", image="nvcr.io/nvidia/pytorch:24.01-py3")
    d.run("img-d", image="pytorch:2.4", labels=("job=llama",))
    for name in ("lab-a", "lab-b", "img-c", "img-d"):
        d.spawn(name, "trainer", name)
    d.wait_for("lab-a", "lab-b", "img-c", "img-d")
    common = ("--limit", d.node.name, "--grace", "0.2")

    # Different kinds AND: job=llama on pytorch:2.3 is lab-a only (img-d runs pytorch:2.4).
    by_label = kill_docker(
        sandbox, tmp_path, *common, "--label", "job=llama", "--image", "pytorch:2.3"
    )

    assert by_label.code == 0, by_label.stdout + by_label.stderr
    assert set(d.procs()) == {"lab-b", "img-c", "img-d"}
    assert last_line(by_label, d.node.name) == "kill-docker: 1 container: lab-a killed 1"

    # Values of one kind OR; a repository without a tag matches any tag of it.
    by_image = kill_docker(
        sandbox, tmp_path, *common, "--image", "nvcr.io/nvidia/pytorch", "--image", "pytorch:2.4"
    )

    assert by_image.code == 0, by_image.stdout + by_image.stderr
    assert set(d.procs()) == {"lab-b"}
    assert last_line(by_image, d.node.name) == (
        "kill-docker: 2 containers: img-c killed 1, img-d killed 1"
    )

    # A bare label key selects by presence; nothing else carries team=...
    by_key = kill_docker(sandbox, tmp_path, *common, "--label", "team", "--label", "job=nope")

    assert by_key.code == 0, by_key.stdout + by_key.stderr
    assert set(d.procs()) == {"lab-b"}
    assert last_line(by_key, d.node.name) == "kill-docker: 1 container: lab-a nothing matched"


def test_stop_kills_then_stops_the_container(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    d = fake_docker()
    d.run("train-a")
    d.run("train-b")
    d.spawn("train-a", "trainer", "a-trainer")
    d.spawn("train-a", "other", "a-tensorboard")
    d.spawn("train-b", "trainer", "b-trainer")
    d.wait_for("a-trainer", "a-tensorboard", "b-trainer")

    result = kill_docker(
        sandbox, tmp_path, "--container", "train-a", "--stop", "--limit", d.node.name,
        "--grace", "0.5",
    )  # fmt: skip

    assert result.code == 0, result.stdout + result.stderr
    assert d.state("train-a") == "exited"
    assert d.state("train-b") == "running"
    # stopping ends everything in the container, the unrelated process too; train-b is untouched
    assert set(d.procs()) == {"b-trainer"}
    out = lines(result, d.node.name)
    assert out.index("[train-a] stopped") > min(
        i for i, x in enumerate(out) if "(KILL)" in x and "kd-a-trainer" in x
    ), "the kill (TERM, grace, KILL) must come before docker stop"
    assert last_line(result, d.node.name) == "kill-docker: 1 container: train-a killed 1, stopped"
    assert any(c.startswith("docker stop -t 1 ") for c in d.calls()), "grace rounded up"


def test_a_matching_pid_1_is_reported_left_and_stop_ends_it(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    # The container's main process is torchrun itself: cleanup never kills pid 1.
    d = fake_docker()
    d.run("solo", *KINDS["torchrun"], "solo-pid1")
    d.spawn("solo", "trainer", "solo-trainer")
    d.wait_for("solo-pid1", "solo-trainer")
    common = ("--container", "solo", "--limit", d.node.name, "--grace", "0.2")

    kept = kill_docker(sandbox, tmp_path, *common)

    assert kept.code == 3, kept.stdout + kept.stderr
    assert set(d.procs()) == {"solo-pid1"}
    assert any(
        x.startswith("[solo] left: pid 1") and "--stop" in x for x in lines(kept, d.node.name)
    )
    assert last_line(kept, d.node.name) == "kill-docker: 1 container: solo killed 1, pid 1 left"

    stopped = kill_docker(sandbox, tmp_path, *common, "--stop")

    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert d.procs() == {}
    assert d.state("solo") == "exited"
    assert last_line(stopped, d.node.name) == (
        "kill-docker: 1 container: solo nothing matched, stopped"
    )


def test_default_selection_only_touches_containers_with_matching_processes(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    d = fake_docker()
    busy_id = d.run("busy")
    quiet_id = d.run("quiet")
    d.spawn("busy", "torchrun", "busy-torchrun")
    d.spawn("quiet", "other", "quiet-tensorboard")
    d.spawn_on_host("trainer", "host-trainer")
    d.wait_for("busy-torchrun", "quiet-tensorboard", "host-trainer")

    result = kill_docker(sandbox, tmp_path, "--limit", d.node.name, "--grace", "1")

    assert result.code == 0, result.stdout + result.stderr
    assert set(d.procs()) == {"quiet-tensorboard", "host-trainer"}
    assert "[quiet] no matching process" in lines(result, d.node.name)
    assert last_line(result, d.node.name) == "kill-docker: 1 container: busy killed 1"
    execs = [c for c in d.calls() if c.startswith("docker exec -i")]
    # Both were checked (cleanup.sh verify: lists, signals nothing); only busy got a kill.
    assert any(quiet_id in c and " verify " in c for c in execs), execs
    assert [c for c in execs if " kill " in c] == [
        c for c in execs if busy_id in c and " kill " in c
    ]
    assert len([c for c in execs if " kill " in c]) == 1


def test_named_containers_that_are_missing_or_not_running_fail_the_host(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    d = fake_docker()
    d.run("train-a")
    d.run("old", "true")  # exits at once
    d.spawn("train-a", "trainer", "a-trainer")
    d.wait_for("a-trainer")
    assert d.state("old") == "exited"

    result = kill_docker(
        sandbox, tmp_path, "--container", "train-a", "--container", "nope", "--container", "old",
        "--limit", d.node.name, "--grace", "0.2",
    )  # fmt: skip

    assert result.code == 3, result.stdout + result.stderr
    assert result.final()["hosts"][d.node.name]["outcome"] == "failed"
    out = lines(result, d.node.name)
    assert "no such container: nope" in out
    assert "container not running: old (exited)" in out
    assert d.procs() == {}, "the container that does run is still acted on"
    assert last_line(result, d.node.name) == (
        "kill-docker: 1 container: train-a killed 1; "
        "no such container: nope; container not running: old (exited)"
    )


def test_container_sharing_the_nodes_pid_namespace_is_refused(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    # `docker run --pid host`: a kill "inside" it would hit every matching process of the node.
    d = fake_docker()
    d.docker("run", "-d", "--name", "hostpid", "--pid", "host", "pytorch:2.3", "sleep", "3600")
    d.spawn("hostpid", "torchrun", "hostpid-torchrun")
    d.spawn_on_host("trainer", "host-trainer")
    before = d.wait_for("hostpid-torchrun", "host-trainer")
    assert before["hostpid-torchrun"].pidns == d.pidns()

    result = kill_docker(sandbox, tmp_path, "--container", "hostpid", "--limit", d.node.name)

    assert result.code == 3, result.stdout + result.stderr
    assert d.procs().keys() == before.keys(), "nothing may be killed"
    assert any(x.startswith("[hostpid] refused:") for x in lines(result, d.node.name))
    assert last_line(result, d.node.name) == (
        "kill-docker: 1 container: hostpid refused (host PID namespace)"
    )


def test_json_carries_each_hosts_distinct_outcome(
    sandbox: Any, fake_docker: Callable[..., FakeDocker], tmp_path: Path
) -> None:
    killed, no_docker, denied, down = sandbox.nodes()[:4]
    d = fake_docker(killed)
    d.run("train-a")
    d.spawn("train-a", "trainer", "a-trainer")
    d.wait_for("a-trainer")
    fake_docker(denied).fault("DENY")
    fake_docker(down).fault("DOWN")
    probe = sandbox.run_on(no_docker, "command -v docker")
    assert probe.returncode != 0, f"{no_docker.name} has a docker: {probe.stdout}"

    result = kill_docker(sandbox, tmp_path, "--grace", "0.2")

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
    assert hosts[killed.name]["last_line"] == "kill-docker: 1 container: train-a killed 1"
    assert hosts[no_docker.name]["last_line"] == "kill-docker: skipped: docker not installed"
    assert hosts[denied.name]["last_line"] == (
        "kill-docker: permission denied on the docker socket "
        "(run with sudo or join the docker group)"
    )
    assert any("permission denied while trying to connect" in x for x in lines(result, denied.name))
    assert (
        hosts[down.name]["last_line"]
        == "kill-docker: cannot reach the docker daemon (is it running?)"
    )
    assert d.procs() == {}


def test_no_docker_fails_only_when_containers_were_named(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[1]
    assert sandbox.run_on(node, "command -v docker").returncode != 0

    named = kill_docker(sandbox, tmp_path, "--container", "train-a", "--limit", node.name)

    assert named.code == 3, named.stdout + named.stderr
    assert last_line(named, node.name) == (
        "kill-docker: docker not installed, but containers were named: train-a"
    )
