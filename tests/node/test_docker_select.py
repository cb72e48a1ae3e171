"""fleet/node/docker.py without a Docker engine: reading docker.sh's listing, selecting
containers (names, anchored regexes, id prefixes, labels, images), what a container's pid 1 and
PID namespace mean for the kill, the summary line, and the vars refused before anything connects.

The kill itself, against a real private dockerd and real containers, is in
tests/e2e/test_kill_docker.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.core.result import CommandResult
from fleet.node.decide import decide_kill, who
from fleet.node.docker import (
    Container,
    ContainerResult,
    DockerSpec,
    Selection,
    build,
    image_matches,
    labels_match,
    parse_containers,
    pid1_matches,
    select,
    shares_host_pids,
    spec_of,
    summary,
    without_pid1,
)
from fleet.node.facts import Proc, Record, Snapshot
from fleet.node.step import OpVarError

A = "a" * 64
B = "b" * 64
C = "c0ffee" + "0" * 58


def row(cid: str, name: str, image: str, state: str, mode: str = "", **labels: str) -> str:
    return json.dumps([cid, f"/{name}", image, state, mode, labels or None, 0, "no"])


LISTING = [
    row(A, "train-a", "pytorch:2.3", "running", job="llama", team="nlp"),
    row(B, "train-b", "docker.io/library/pytorch:2.4", "running", job="other"),
    row(C, "old", "nvcr.io/nvidia/pytorch:24.01-py3", "exited"),
]
CONTAINERS = parse_containers(LISTING)


def spec(**kw: Any) -> DockerSpec:
    return spec_of({"patterns": ["torchrun", "train\\.py"], **kw})


def names(selection: Selection) -> list[str]:
    return [c.name for c in selection.chosen]


# ------------------------------------------------------------------------------ the listing


def test_the_listing_is_read_as_data_and_broken_lines_are_skipped() -> None:
    lines = [
        *LISTING,
        "not json",
        "[1, 2]",
        json.dumps(["x", "/y", "i", "s", "", "bad labels", 2, "always"]),
    ]

    found = parse_containers(lines)

    assert [c.name for c in found] == ["train-a", "train-b", "old", "y"]
    assert found[0] == Container(A, "train-a", "pytorch:2.3", "running", "", {
        "job": "llama", "team": "nlp"}, restart_policy="no")  # fmt: skip
    assert found[-1].labels == {}
    assert found[-1].restarts == 2
    assert found[-1].restart_policy == "always"


# ------------------------------------------------------------------------------ selection


@pytest.mark.parametrize(
    ("kw", "chosen", "problems"),
    [
        ({}, ["train-a", "train-b"], []),
        ({"containers": ["train-a"]}, ["train-a"], []),
        ({"containers": ["train-.*"]}, ["train-a", "train-b"], []),
        ({"containers": ["train"]}, [], ["no such container: train"]),  # anchored
        ({"containers": ["bbbb"]}, ["train-b"], []),  # an id prefix
        ({"containers": ["c0ffee"]}, [], ["container not running: old (exited)"]),  # one id
        ({"labels": ["job=llama"]}, ["train-a"], []),
        ({"labels": ["job"]}, ["train-a", "train-b"], []),  # a bare key: any value
        ({"labels": ["job=nope", "team"]}, ["train-a"], []),  # one kind: alternatives
        ({"labels": ["job"], "images": ["pytorch:2.4"]}, ["train-b"], []),  # kinds: all hold
        ({"images": ["pytorch"]}, ["train-a", "train-b"], []),  # any tag of the repository
        ({"images": ["nvcr.io/nvidia/pytorch"]}, [], []),  # it matches only the exited one
    ],
)
def test_select(kw: dict[str, Any], chosen: list[str], problems: list[str]) -> None:
    selection = select(CONTAINERS, spec(**kw))
    assert names(selection) == chosen
    assert list(selection.problems) == problems


def test_an_id_prefix_of_several_containers_selects_none_of_them() -> None:
    # docker refuses such a prefix; `--container 3` would otherwise pick about a sixteenth of the
    # node's containers, anyone's.
    more = [row("3" + A[1:], "mine", "x", "running"), row("3" + B[1:], "theirs", "x", "running")]

    selection = select([*CONTAINERS, *parse_containers(more)], spec(containers=["3", "a"]))

    assert names(selection) == ["train-a"]
    assert selection.problems == (
        "ambiguous container id prefix: 3 is the start of 2 ids (mine, theirs): give more of it, "
        "or a name",
    )
    assert names(select(parse_containers(more), spec(containers=["3a"]))) == ["mine"]


PAUSED = parse_containers([*LISTING, row("d" * 64, "frozen", "pytorch:2.3", "paused", job="llama")])
PAUSE_NOTE = "(docker exec cannot look inside; unpause it, or stop it with --stop)"


@pytest.mark.parametrize(
    ("kw", "chosen", "paused", "problems"),
    [
        # No selector: nothing can look inside it, so it is left (and the op says it skipped it).
        ({}, ["train-a", "train-b"], ["frozen"], []),
        ({"stop": True}, ["train-a", "train-b"], ["frozen"], []),
        # Selected, it is not "not running" (its processes are all there): it fails the host,
        # unless --stop, which docker carries out on a paused container.
        ({"containers": ["frozen"]}, [], ["frozen"], [f"container paused: frozen {PAUSE_NOTE}"]),
        ({"containers": ["frozen"], "stop": True}, [], ["frozen"], []),
        (
            {"labels": ["job=llama"]},
            ["train-a"],
            ["frozen"],
            [f"container paused: frozen {PAUSE_NOTE}"],
        ),
        ({"labels": ["job=other"]}, ["train-b"], [], []),
    ],
)
def test_a_paused_container_is_never_silently_left(
    kw: dict[str, Any], chosen: list[str], paused: list[str], problems: list[str]
) -> None:
    selection = select(PAUSED, spec(**kw))
    assert names(selection) == chosen
    assert [c.name for c in selection.paused] == paused
    assert list(selection.problems) == problems


@pytest.mark.parametrize(
    ("actual", "wanted", "hit"),
    [
        ("pytorch:2.3", "pytorch:2.3", True),
        ("pytorch", "pytorch:latest", True),
        ("pytorch:latest", "pytorch", True),
        ("docker.io/library/pytorch:2.3", "pytorch:2.3", True),
        ("pytorch:2.3", "pytorch:2.4", False),
        ("localhost:5000/pytorch:2.3", "localhost:5000/pytorch", True),
        ("localhost:5000/pytorch", "localhost:5000/pytorch:latest", True),
        ("localhost:5000/pytorch", "pytorch", False),
        ("pytorch@sha256:abc", "pytorch", True),
    ],
)
def test_images(actual: str, wanted: str, hit: bool) -> None:
    assert image_matches(actual, [wanted]) is hit


@given(st.dictionaries(st.sampled_from("abc"), st.sampled_from(["", "x", "y=z"])))
def test_a_bare_label_key_matches_whenever_the_key_is_there(labels: dict[str, str]) -> None:
    assert labels_match(labels, ["a"]) is ("a" in labels)
    assert labels_match(labels, ["a=x"]) is (labels.get("a") == "x")


# ------------------------------------------------------------------------ pid 1, namespaces


def _snap(rows: list[tuple[int, int, bytes]], self_pid: int) -> Snapshot:
    return Snapshot(
        self_pid=self_pid,
        procs={pid: Proc(pid, ppid, pid, pid, 100 + pid, "S") for pid, ppid, _ in rows},
        records={pid: Record(pid, 0, cmd.replace(b" ", b"\0")) for pid, _, cmd in rows if cmd},
    )


# A container run with --init: docker-init is pid 1 and its argv repeats the command; the
# training command is its child, a trainer was started with docker exec (parent outside: 0),
# and fleet's facts.sh came in the same way.
CONTAINER = [
    (1, 0, b"/sbin/docker-init -- torchrun --nproc-per-node 2 train.py"),
    (7, 1, b"torchrun --nproc-per-node 2 train.py"),
    (8, 7, b"python -u train.py"),
    (20, 0, b"python3 /kd/train.py --deepspeed"),
    (30, 0, b"sleep 600"),
    (40, 0, b"sh -s -- --pattern torchrun"),
]


def test_pid_1_is_no_match_so_the_container_is_not_all_descendants() -> None:
    snap = _snap(CONTAINER, 40)
    kill_spec = spec().kill

    targets = decide_kill(without_pid1(snap), kill_spec, who(snap)).targets

    assert targets == (7, 8, 20)  # not 1, not sleep 600 (a child of nobody here), not fleet's
    assert pid1_matches(snap, kill_spec) == (
        "/sbin/docker-init -- torchrun --nproc-per-node 2 train.py"
    )
    # on cleanup's own terms pid 1 (docker-init, a supervisor) would refuse the whole node
    assert decide_kill(snap, kill_spec, who(snap)).refusal


def test_a_pid_1_that_matches_nothing_is_not_reported() -> None:
    rows = [(1, 0, b"/sbin/docker-init -- sleep 3600"), *CONTAINER[1:]]
    assert pid1_matches(_snap(rows, 40), spec().kill) is None


def test_fleet_s_exec_has_an_invisible_parent_unless_the_namespace_is_the_host_s() -> None:
    assert not shares_host_pids(_snap(CONTAINER, 40))
    # act.sh's look again: facts.sh is act.sh's child, whose parent is outside
    assert not shares_host_pids(_snap([*CONTAINER, (41, 40, b"")], 41))
    # --pid host: the exec's parent (containerd-shim) and its parent are visible
    host = [(1, 0, b"/sbin/init"), (900, 1, b"containerd-shim"), (901, 900, b"sh -s --")]
    assert shares_host_pids(_snap(host, 901))


# ------------------------------------------------------------------------------ the summary


@pytest.mark.parametrize(
    ("done", "selection", "kw", "skipped", "line"),
    [
        (
            [ContainerResult("a", "killed 2"), ContainerResult("b", "nothing matched")],
            Selection(()),
            {"containers": ["a", "b"]},
            [],
            "kill-docker: 2 containers: a killed 2, b nothing matched",
        ),
        (
            [ContainerResult("a", "killed 1")],
            Selection((), ("no such container: x", "container not running: y (exited)")),
            {"containers": ["a", "x", "y"]},
            [],
            "kill-docker: 1 container: a killed 1; no such container: x; "
            "container not running: y (exited)",
        ),
        (
            [],
            Selection((), ("no such container: x",)),
            {"containers": ["x"]},
            [],
            "kill-docker: nothing killed; no such container: x",
        ),
        (
            [],
            Selection(tuple(CONTAINERS[:2])),
            {},
            ["h (host PID namespace)"],
            "kill-docker: no running container has a matching process (2 running); "
            "skipped h (host PID namespace)",
        ),
        (
            [],
            Selection(()),
            {"labels": ["job=x"]},
            [],
            "kill-docker: no running container matches the selection",
        ),
    ],
)
def test_summary(
    done: list[ContainerResult],
    selection: Selection,
    kw: dict[str, Any],
    skipped: list[str],
    line: str,
) -> None:
    assert summary(done, selection, spec(**kw), skipped) == line


# ------------------------------------------------------------------------------ the vars


def test_vars_become_the_spec_and_the_stop_seconds_round_up() -> None:
    got = spec(grace="0.2", stop="true", containers=["a"], labels=["k=v"], images=["i:1"])
    assert (got.kill.grace_s, got.stop, got.stop_s) == (0.2, True, 1)
    assert (got.containers, got.labels, got.images) == (("a",), ("k=v",), ("i:1",))
    assert got.kill.max_kill_share == 1  # a training container is mostly the job
    assert spec(grace=10).stop_s == 10


@pytest.mark.parametrize(
    ("kw", "var"),
    [
        ({"patterns": []}, "patterns"),
        ({"patterns": ["a\\d"]}, "patterns"),
        ({"grace": "soon"}, "grace"),
        ({"grace": 601}, "grace"),
        ({"containers": [".*"]}, "containers"),
        ({"containers": ["a("]}, "containers"),
        ({"containers": ["a\nb"]}, "containers"),
        ({"labels": ["=v"]}, "labels"),
        ({"images": ["py torch"]}, "images"),
    ],
)
def test_bad_vars_are_refused_naming_the_var(kw: dict[str, Any], var: str) -> None:
    with pytest.raises(OpVarError) as err:
        spec_of({"patterns": ["torchrun"], **kw})
    assert err.value.var == var
    assert err.value.hint


def test_the_plan_shows_the_listing_and_what_may_follow() -> None:
    op = build(
        {"patterns": ["torchrun"], "containers": ["train-a"], "grace": 3, "stop": True},
        sudo=True,
        timeout_s=600,
        password_on_stdin=False,
    )
    assert op.cmd.display == "sudo sh -s -- list  < docker.sh"
    assert op.cmd.timeout_s == 600
    assert "FLEET_NODE_HELPER=1" in op.cmd.command
    assert "--container train-a" in op.describe()
    assert "--grace 3 s" in op.describe()
    assert "docker stop -t 3" in op.describe()


# ------------------------------------------------------------------------------ a hung daemon


class HungDocker:
    """A node whose docker daemon answers the listing (or not, with `hung_list`) and then
    never answers a docker exec: each such command runs out its time."""

    def __init__(self, hung_list: bool = False) -> None:
        self.hung_list = hung_list
        self.said: list[str] = []
        self.timeouts: list[float | None] = []

    def run(self, cmd: Any, on_line: Any) -> CommandResult:
        self.timeouts.append(cmd.timeout_s)
        if "-- list" in cmd.display and not self.hung_list:
            for line in LISTING:
                on_line("stdout", line)
            return CommandResult(0)
        return CommandResult(None, timed_out=True, duration_s=cmd.timeout_s)

    def emit(self, stream: str, line: str) -> None:
        self.said.append(line)


def op(timeout_s: float | None, **kw: Any) -> Any:
    variables = {"patterns": ["torchrun"], **kw}
    return build(variables, sudo=False, timeout_s=timeout_s, password_on_stdin=False)


def test_a_hung_docker_ps_fails_the_node_saying_so_not_as_the_steps_time_out() -> None:
    io = HungDocker(hung_list=True)

    result = op(600).run(io)

    assert not result.timed_out
    assert result.exit_code == 1
    assert io.timeouts == [120]
    assert result.stdout_tail[-1] == (
        "kill-docker: docker ps did not answer within 120s: the docker daemon hangs or is "
        "overloaded"
    )


def test_a_hung_docker_exec_fails_its_container_and_the_others_are_still_told() -> None:
    io = HungDocker()

    result = op(600, containers=["train-a", "train-b"]).run(io)

    assert not result.timed_out
    assert result.exit_code == 1
    hung = "did not answer within 120s: the docker daemon hangs or is overloaded"
    assert f"[train-a] docker exec facts.sh {hung}" in io.said
    assert f"[train-b] docker exec facts.sh {hung}" in io.said
    assert result.stdout_tail[-1] == (
        "kill-docker: 2 containers: train-a no answer from docker, train-b no answer from docker"
    )


def test_the_steps_own_deadline_is_still_a_time_out() -> None:
    result = op(5).run(HungDocker(hung_list=True))

    assert result.timed_out


def test_a_hung_docker_exec_in_the_default_selection_fails_the_node_saying_where() -> None:
    io = HungDocker()

    result = op(600).run(io)

    assert not result.timed_out
    assert result.exit_code == 1
    assert (
        "[train-a] docker exec facts.sh did not answer within 120s: the docker daemon hangs "
        "or is overloaded" in io.said
    )
    assert result.stdout_tail[-1] == (
        "kill-docker: 2 containers: train-a no answer from docker, train-b no answer from docker"
    )
