"""`fleet janitor start|stop|status|run-once` against real sshd nodes (fleet/remote/janitor.sh).

Each node has a private /tmp, so every test plants its own checkpoint tree at /tmp/ckpt on the
nodes it uses: a ZeRO-3 + PEFT checkpoint with files two hours old (so --min-age does not hide
them), a symlink named like an optimizer shard pointing outside the dir, a symlinked directory
outside the dir holding an `optimizer.pt`, and a separate filesystem mounted inside the dir (a
tmpfs, in the node's own mount namespace) holding another, and a bind mount of a directory
outside (same filesystem, so the same device number: -xdev does not stop there) holding an
`optimizer.pt` and a ZeRO shard: all of them must survive. Waits poll
the node to a deadline; nothing sleeps blindly. Afterwards every janitor, holder and decoy a
test started on a node is killed by pid and the planted paths are removed.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

pytestmark = pytest.mark.root

CKPT = "/tmp/ckpt"
STEP = f"{CKPT}/checkpoint-2"
# what the default delete globs take (path -> size in bytes)
DOOMED = {
    f"{STEP}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt": 60_000,
    f"{STEP}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt": 60_000,
    f"{STEP}/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt": 20_000,
    f"{STEP}/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt": 20_000,
    f"{STEP}/optimizer.pt": 30_000,
    f"{STEP}/scheduler.pt": 1_000,
    f"{STEP}/rng_state_0.pth": 500,
    f"{STEP}/rng_state_1.pth": 500,
}
# what must survive: wanted files, symlinks (and what they point to), another filesystem
KEPT = {
    f"{STEP}/adapter_model.safetensors": 8_000,
    f"{STEP}/adapter_config.json": 300,
    f"{STEP}/trainer_state.json": 900,
    f"{STEP}/training_args.bin": 100,
    f"{STEP}/global_step2/latest": 12,
    f"{CKPT}/other-fs/optimizer.pt": 100,  # on a tmpfs mounted inside the dir: -xdev
    "/tmp/outside/precious_optim_states.pt": 100,
    "/tmp/outside/shared/optimizer.pt": 100,
    # behind a bind mount at {STEP}/bound (same filesystem as the dir): not the dir's files
    "/tmp/outside/bound/optimizer.pt": 100,
    "/tmp/outside/bound/global_step9/zero_pp_rank_0_mp_rank_00_optim_states.pt": 100,
}
BOUND = f"{STEP}/bound"
LINKS = {
    f"{STEP}/global_step2/link_optim_states.pt": "/tmp/outside/precious_optim_states.pt",
    f"{STEP}/linked_dir": "/tmp/outside/shared",
}
FREED = sum(DOOMED.values())
JANITORS = "janitor-loop.sh loop --dir"  # how a janitor daemon's command line starts

_PLANT = """\
set -e
mkdir -p {ckpt}/checkpoint-2/global_step2 {ckpt}/other-fs /tmp/outside/shared
mountpoint -q {ckpt}/other-fs || mount -t tmpfs -o size=1m janitor-test {ckpt}/other-fs
mkdir -p {ckpt}/checkpoint-2/bound /tmp/outside/bound/global_step9
mountpoint -q {ckpt}/checkpoint-2/bound || mount --bind /tmp/outside/bound {ckpt}/checkpoint-2/bound
plant() {{ head -c "$2" /dev/zero > "$1"; touch -d '2 hours ago' "$1"; }}
"""


def _q(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _on(box: Any, node: Any, script: str) -> str:
    """Run a script as root on the node; fail the test if it fails."""
    result = box.run_on(node, script)
    assert result.returncode == 0, f"{node.name}: {result.stderr or result.stdout}"
    return str(result.stdout)


def _plant(box: Any, nodes: Sequence[Any]) -> None:
    script = _PLANT.format(ckpt=CKPT)
    for path, size in {**DOOMED, **KEPT}.items():
        script += f"plant {_q(path, str(size))}\n"
    for link, target in LINKS.items():
        script += f"ln -sfn {_q(target, link)}\n"
    for node in nodes:
        _on(box, node, script)


def _present(box: Any, node: Any, paths: Sequence[str]) -> dict[str, bool]:
    script = "".join(
        f'if [ -e {_q(p)} ] || [ -L {_q(p)} ]; then echo "1 "{_q(p)}; else echo "0 "{_q(p)}; fi\n'
        for p in paths
    )
    out = _on(box, node, script)
    return {line[2:]: line[0] == "1" for line in out.splitlines()}


def _listing(box: Any, node: Any) -> str:
    """Every path under the planted trees with type, size and mtime: a snapshot."""
    return _on(box, node, "find /tmp/ckpt /tmp/outside -printf '%y %s %T@ %p\\n' | sort")


def _janitor_pids(box: Any, node: Any, directory: str = CKPT) -> list[int]:
    """Pids of janitor daemons for `directory` on the node (by command line, read from /proc)."""
    script = f"""
for d in /proc/[0-9]*; do
    c=$(tr '\\000' ' ' < "$d/cmdline" 2>/dev/null) || continue
    case $c in *{_q(f"{JANITORS} {directory} --state ")}*) echo "${{d#/proc/}}" ;; esac
done
"""
    return sorted(int(p) for p in _on(box, node, script).split())


def _alive(box: Any, node: Any, pid: int) -> bool:
    out = _on(box, node, f"sed -n 's/^State:[[:space:]]*//p' /proc/{pid}/status 2>/dev/null; :")
    return bool(out.strip()) and not out.startswith("Z")


def _log(box: Any, node: Any, directory: str = CKPT) -> str:
    key = f"$(printf %s {_q(directory)} | cksum | cut -d' ' -f1)"
    return _on(box, node, f'cat "/var/lib/fleet/janitor/{key}/log"')


def _poll(check: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def _janitor(box: Any, log_dir: Path, action: str, *args: str) -> FleetResult:
    return run_fleet(box, "janitor", action, *args, "--json", log_dir=log_dir)


def _limit(nodes: Sequence[Any]) -> list[str]:
    return ["-l", ",".join(n.name for n in nodes)]


def _out(result: FleetResult, node: Any) -> list[str]:
    """The node's stdout lines in a --json run."""
    return [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["host"] == node.name and e["stream"] == "stdout"
    ]


def _facts(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split())


def _started_pid(result: FleetResult, node: Any, interval: str = "1", min_age: str = "10") -> int:
    (line,) = _out(result, node)
    m = re.fullmatch(
        rf"janitor: started for {CKPT} \(pid (\d+), every {interval}s, files older than "
        rf"{min_age}s, deleting \*_optim_states\.pt \*_model_states\.pt "
        r"zero_pp_rank_\*_model_states\.pt optimizer\.pt scheduler\.pt rng_state\*\.pth, "
        r"keeping adapter_model\.safetensors adapter_config\.json\)",
        line,
    )
    assert m, f"{node.name}: {line}"
    return int(m.group(1))


@pytest.fixture(autouse=True)
def _clean_nodes(sandbox: Any) -> Iterator[None]:
    """Whatever a test started or planted on a node is gone afterwards (killed by pid)."""
    yield
    script = f"""
for d in /proc/[0-9]*; do
    c=$(tr '\\000' ' ' < "$d/cmdline" 2>/dev/null) || continue
    case $c in
        *{_q(JANITORS)}' /tmp/'*)
            p=${{d#/proc/}}
            kill -KILL -"$p" 2>/dev/null || kill -KILL "$p"
            ;;
    esac
done
for f in /tmp/holder.pid /tmp/decoy.pid; do
    [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
done
umount {CKPT}/other-fs 2>/dev/null
umount {BOUND} 2>/dev/null
rm -rf {CKPT} {CKPT}2 /tmp/outside /tmp/rootlink /tmp/holder.pid /tmp/decoy.pid \\
    /var/lib/fleet/janitor
true
"""
    for node in sandbox.nodes():
        sandbox.run_on(node, script)


# ---------------------------------------------------------------------------------------------


def test_start_deletes_the_unwanted_files_on_every_node_and_survives_the_session(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[:2]
    _plant(sandbox, nodes)

    start = _janitor(
        sandbox, tmp_path, "start", "--dir", CKPT, "--interval", "1", "--yes", *_limit(nodes)
    )

    assert start.code == 0, start.stdout + start.stderr
    assert "exact resume" in start.stderr  # the trade is made explicit (PITFALLS 19)
    pids = {node.name: _started_pid(start, node) for node in nodes}
    for node in nodes:

        def swept(node: Any = node) -> bool:
            return not any(_present(sandbox, node, list(DOOMED)).values())

        _poll(swept, f"the janitor on {node.name} to delete every unwanted file")
        kept = _present(sandbox, node, [*KEPT, *LINKS])
        assert all(kept.values()), f"{node.name}: deleted {[p for p, k in kept.items() if not k]}"
        assert _janitor_pids(sandbox, node) == [pids[node.name]]

    # a new fleet run (new SSH sessions) finds the same daemons, with what they did
    status = _janitor(sandbox, tmp_path, "status", "--dir", CKPT, *_limit(nodes))
    assert status.code == 0, status.stdout + status.stderr
    for node in nodes:
        (line,) = _out(status, node)
        facts = _facts(line)
        assert facts["janitor"] == "running", line
        assert facts["dir"] == CKPT
        assert facts["pid"] == str(pids[node.name])
        assert facts["deleted"] == str(len(DOOMED))
        assert facts["freed_bytes"] == str(FREED)
        assert int(facts["free_bytes"]) > 0
        assert int(facts["uptime_s"]) >= 0
        log = _log(sandbox, node)
        for path, size in DOOMED.items():
            assert re.search(rf"^\S+Z deleted {re.escape(path)} \({size} bytes\)$", log, re.M)


def test_a_second_start_reports_the_running_janitor_and_starts_no_other(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[2:4]
    _plant(sandbox, nodes)
    first = _janitor(
        sandbox, tmp_path, "start", "--dir", CKPT, "--interval", "1", "--yes", *_limit(nodes)
    )
    assert first.code == 0, first.stdout + first.stderr
    pids = {node.name: _started_pid(first, node) for node in nodes}

    second = _janitor(
        sandbox, tmp_path, "start", "--dir", f"{CKPT}/", "--interval", "2", "--yes", *_limit(nodes)
    )

    assert second.code == 0, second.stdout + second.stderr
    for node in nodes:
        (line,) = _out(second, node)
        assert re.fullmatch(
            rf"janitor: already running for {CKPT} \(pid {pids[node.name]}, up \d+s\)", line
        ), line
        assert _janitor_pids(sandbox, node) == [pids[node.name]]


def test_a_file_still_being_written_waits_for_min_age(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[2]
    _on(sandbox, node, f"mkdir -p {CKPT}/checkpoint-4")
    start = _janitor(
        sandbox,
        tmp_path,
        "start",
        "--dir",
        CKPT,
        "--interval",
        "1",
        "--min-age",
        "3",
        "--yes",
        "-l",
        node.name,
    )
    assert start.code == 0, start.stdout + start.stderr
    _started_pid(start, node, min_age="3")
    fresh = f"{CKPT}/checkpoint-4/optimizer.pt"

    mtime = int(_on(sandbox, node, f"head -c 5000 /dev/zero > {fresh}; stat -c %Y {fresh}"))

    def gone() -> bool:
        present = _present(sandbox, node, [fresh])[fresh]
        if not present:  # checked at every poll: never gone while younger than --min-age
            now = int(_on(sandbox, node, "date +%s"))
            assert now - mtime >= 3, f"deleted {now - mtime}s after it was written"
        return not present

    _poll(gone, "the janitor to take the file once it is older than --min-age")
    log = _log(sandbox, node)
    skipped = re.search(rf"^(\S+Z) skipped \(modified [0-3]s ago\): {re.escape(fresh)}$", log, re.M)
    deleted = re.search(rf"^(\S+Z) deleted {re.escape(fresh)} \(5000 bytes\)$", log, re.M)
    assert skipped, log
    assert deleted, log
    deleted_at = datetime.strptime(deleted.group(1), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    assert deleted_at - mtime >= 3, log


def test_a_file_held_open_is_kept_while_held_and_deleted_after(
    sandbox: Any, tmp_path: Path
) -> None:
    node = sandbox.nodes()[3]
    held = f"{CKPT}/checkpoint-5/optimizer.pt"
    _on(
        sandbox,
        node,
        f"mkdir -p {CKPT}/checkpoint-5 && head -c 7000 /dev/zero > {held} && "
        f"touch -d '2 hours ago' {held} && "
        f"setsid sh -c 'echo $$ > /tmp/holder.pid; exec sleep 300 3< {held}' "
        "</dev/null >/dev/null 2>&1 &",
    )
    _poll(lambda: _on(sandbox, node, "cat /tmp/holder.pid 2>/dev/null; :").strip() != "", "holder")
    holder = int(_on(sandbox, node, "cat /tmp/holder.pid"))
    _poll(lambda: held in _on(sandbox, node, f"ls -l /proc/{holder}/fd/"), "the holder to open it")

    start = _janitor(
        sandbox, tmp_path, "start", "--dir", CKPT, "--interval", "1", "--yes", "-l", node.name
    )
    assert start.code == 0, start.stdout + start.stderr
    _poll(
        lambda: f"skipped (in use by pid {holder}): {held}" in _log(sandbox, node),
        "the janitor to see the file is in use",
    )
    # a later pass takes a new unwanted file, and still leaves the held one alone
    marker = f"{CKPT}/checkpoint-5/scheduler.pt"
    _on(sandbox, node, f"echo x > {marker} && touch -d '2 hours ago' {marker}")
    _poll(lambda: not _present(sandbox, node, [marker])[marker], "a later pass")
    assert _present(sandbox, node, [held])[held], "deleted a file a process holds open"

    _on(sandbox, node, f"kill {holder}")
    _poll(lambda: not _present(sandbox, node, [held])[held], "the janitor to take it once freed")
    status = _janitor(sandbox, tmp_path, "status", "--dir", CKPT, "-l", node.name)
    (line,) = _out(status, node)
    assert _facts(line)["deleted"] == "2"
    assert _facts(line)["freed_bytes"] == str(7000 + 2)


def test_stop_ends_that_janitor_and_nothing_else(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    # a decoy whose command line looks like a janitor's for the same dir
    _on(
        sandbox,
        node,
        f"mkdir -p {CKPT} {CKPT}2 && setsid sh -c 'echo $$ > /tmp/decoy.pid; "
        f"while :; do sleep 1; done' {JANITORS} {CKPT} --state /nowhere "
        "</dev/null >/dev/null 2>&1 &",
    )
    _poll(lambda: _on(sandbox, node, "cat /tmp/decoy.pid 2>/dev/null; :").strip() != "", "decoy")
    decoy = int(_on(sandbox, node, "cat /tmp/decoy.pid"))
    ours = _janitor(sandbox, tmp_path, "start", "--dir", CKPT, "--yes", "-l", node.name)
    other = _janitor(sandbox, tmp_path, "start", "--dir", f"{CKPT}2", "--yes", "-l", node.name)
    assert ours.code == other.code == 0, ours.stdout + other.stdout
    pid = _started_pid(ours, node, interval="3")
    (other_line,) = _out(other, node)
    other_pid = int(re.search(r"\(pid (\d+),", other_line).group(1))  # type: ignore[union-attr]

    stop = _janitor(sandbox, tmp_path, "stop", "--dir", CKPT, "-l", node.name)

    assert stop.code == 0, stop.stdout + stop.stderr
    assert _out(stop, node) == [
        f"janitor: stopped for {CKPT} (pid {pid}; deleted 0 files, freed 0 B)"
    ]
    assert not _alive(sandbox, node, pid)
    assert _alive(sandbox, node, decoy), "stop killed a process that only looked like the janitor"
    assert _alive(sandbox, node, other_pid), "stop killed the janitor of another dir"
    assert _janitor_pids(sandbox, node, f"{CKPT}2") == [other_pid]
    again = _janitor(sandbox, tmp_path, "stop", "--dir", CKPT, "-l", node.name)
    assert again.code == 0
    assert _out(again, node) == [f"janitor: not running for {CKPT}"]
    status = _janitor(sandbox, tmp_path, "status", "--dir", CKPT, "-l", node.name)
    assert _facts(_out(status, node)[0])["janitor"] == "stopped"
    assert _janitor(sandbox, tmp_path, "stop", "--dir", f"{CKPT}2", "-l", node.name).code == 0
    assert not _alive(sandbox, node, other_pid)


def test_run_once_dry_run_lists_and_deletes_nothing_then_run_once_deletes(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[:2]
    _plant(sandbox, nodes)
    before = {node.name: _listing(sandbox, node) for node in nodes}

    dry = _janitor(sandbox, tmp_path, "run-once", "--dir", CKPT, "--dry-run", *_limit(nodes))

    assert dry.code == 0, dry.stdout + dry.stderr
    for node in nodes:
        lines = _out(dry, node)
        listed = {}
        for line in lines:
            m = re.fullmatch(r"would delete: (\S+) \((\d+) bytes\)", line)
            if m:
                listed[m.group(1)] = m.group(2)
        assert listed == {p: str(s) for p, s in DOOMED.items()}
        assert lines[-1].startswith(f"janitor: would delete {len(DOOMED)} files ({FREED} bytes")
        assert _listing(sandbox, node) == before[node.name], "a dry run changed something"
        assert _janitor_pids(sandbox, node) == []

    real = _janitor(sandbox, tmp_path, "run-once", "--dir", CKPT, "--yes", *_limit(nodes))

    assert real.code == 0, real.stdout + real.stderr
    for node in nodes:
        lines = _out(real, node)
        assert sorted(lines[:-1]) == sorted(f"deleted: {p} ({s} bytes)" for p, s in DOOMED.items())
        assert lines[-1].startswith(f"janitor: deleted {len(DOOMED)} files ({FREED} bytes")
        assert not any(_present(sandbox, node, list(DOOMED)).values())
        assert all(_present(sandbox, node, [*KEPT, *LINKS]).values())
        assert _janitor_pids(sandbox, node) == [], "run-once left a daemon behind"


@pytest.mark.parametrize(
    ("directory", "reason"),
    [
        ("/", "/ is the root directory"),
        ("ckpt", "is relative"),
        ("/tmp/no-such-dir", "no such directory on this host: /tmp/no-such-dir (wrong host"),
        ("/tmp/rootlink", "resolves to / is the root directory"),
        ("/root", "/root is a system directory"),
    ],
)
def test_an_unsafe_or_missing_dir_fails_the_host_and_touches_nothing(
    sandbox: Any, tmp_path: Path, directory: str, reason: str
) -> None:
    nodes = sandbox.nodes()[:2]
    _plant(sandbox, nodes)
    for node in nodes:
        _on(sandbox, node, "ln -sfn / /tmp/rootlink")
    before = {node.name: _listing(sandbox, node) for node in nodes}

    result = _janitor(
        sandbox,
        tmp_path,
        "start",
        "--dir",
        directory,
        "--interval",
        "1",
        "--min-age",
        "0",
        "--yes",
        *_limit(nodes),
    )

    assert result.code == 3, result.stdout + result.stderr
    hosts = result.final()["hosts"]
    for node in nodes:
        assert hosts[node.name]["outcome"] == "failed"
        (line,) = _out(result, node)
        assert line.startswith("janitor: refused: "), line
        assert reason in line, line
        assert hosts[node.name]["last_line"] == line
        assert _listing(sandbox, node) == before[node.name], f"{node.name}: something changed"
        assert _janitor_pids(sandbox, node, directory) == []
        assert _on(sandbox, node, "ls -A /var/lib/fleet/janitor 2>/dev/null; :") == ""


def test_the_janitor_exits_by_itself_when_its_dir_disappears(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[1]
    _on(sandbox, node, f"mkdir -p {CKPT}")
    start = _janitor(
        sandbox, tmp_path, "start", "--dir", CKPT, "--interval", "1", "--yes", "-l", node.name
    )
    pid = _started_pid(start, node)

    _on(sandbox, node, f"rm -rf {CKPT}")

    _poll(lambda: not _alive(sandbox, node, pid), "the janitor to exit")
    assert f"janitor stopped: {CKPT} is gone" in _log(sandbox, node)
    status = _janitor(sandbox, tmp_path, "status", "--dir", CKPT, "-l", node.name)
    assert status.code == 0
    # it ended with no `janitor stop`: dead, not stopped (a replaced dir is no longer cleaned)
    assert _facts(_out(status, node)[0])["janitor"] == "dead"


def test_a_glob_that_takes_final_weights_is_refused_before_connecting(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()[:2]
    _plant(sandbox, nodes)
    before = {node.name: _listing(sandbox, node) for node in nodes}

    result = _janitor(
        sandbox, tmp_path, "run-once", "--dir", CKPT, "--delete", "*.*", "--yes", *_limit(nodes)
    )

    assert result.code == 2, result.stdout + result.stderr
    assert "--delete '*.*' would delete final model weights or configs: *.safetensors" in (
        result.stderr
    )
    assert "hint: " in result.stderr
    for node in nodes:
        assert _listing(sandbox, node) == before[node.name], f"{node.name}: something changed"


def test_a_hand_written_playbook_s_glob_is_refused_on_the_node(
    sandbox: Any, tmp_path: Path
) -> None:
    """fleet judges the shipped playbook's vars; a playbook of one's own that feeds janitor.sh
    a literal glob meets the node's own check."""
    node = sandbox.nodes()[1]
    _plant(sandbox, [node])
    before = _listing(sandbox, node)
    playbook = tmp_path / "sweep.yaml"
    playbook.write_text(
        "name: sweep\nsteps:\n  - name: sweep\n    script: janitor.sh\n"
        f"    run: run-once --dir {CKPT} --min-age 0 --delete '*.*'\n"
    )

    result = run_fleet(sandbox, "run", str(playbook), "--json", "-l", node.name, log_dir=tmp_path)

    assert result.code == 3, result.stdout + result.stderr
    (line,) = _out(result, node)
    assert line.startswith(
        "janitor: refused: --delete '*.*' would delete final model weights or configs: "
    ), line
    assert "adapter_config.json" in line
    assert _listing(sandbox, node) == before, "the refused glob deleted something"


def test_allow_weights_reaches_the_node(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[2]
    _plant(sandbox, [node])
    weights = f"{STEP}/adapter_model.safetensors"

    result = _janitor(
        sandbox,
        tmp_path,
        "run-once",
        "--dir",
        CKPT,
        "--delete",
        "*.safetensors",
        "--keep",
        "none",
        "--allow-weights",
        "--yes",
        "-l",
        node.name,
    )

    assert result.code == 0, result.stdout + result.stderr
    assert f"deleted: {weights} (8000 bytes)" in _out(result, node)
    assert _present(sandbox, node, [weights]) == {weights: False}


# --------------------------------------------------------------------------- launch --janitor

LAUNCH_STATE = "/var/lib/fleet/launch"  # realtorch.STATE: the launch's own state on a node


def _launch(box: Any, log_dir: Path, nodes: Sequence[Any], *args: str) -> FleetResult:
    """`fleet launch --janitor` whose job, /bin/echo, ends at once: every node's start fails."""
    return run_fleet(
        box,
        "launch", "--plain", "--force", "--janitor", "--dir", CKPT, "--launcher", "/bin/echo",
        *args, *_limit(nodes), "--", "hi",
        log_dir=log_dir,
    )  # fmt: skip


@pytest.fixture
def no_launch_state(sandbox: Any) -> Iterator[None]:
    """The failed launches' run records on the nodes are removed afterwards."""
    yield
    for node in sandbox.nodes():
        sandbox.run_on(node, f"rm -rf {LAUNCH_STATE}")


def test_launch_janitor_asks_as_janitor_start_does(
    sandbox: Any, tmp_path: Path, no_launch_state: None
) -> None:
    """--janitor makes a launch destructive: with no terminal and no --yes, it is refused with
    the warning `fleet janitor start` gives, before anything runs on any node."""
    nodes = sandbox.nodes()[:2]
    for node in nodes:
        _on(sandbox, node, f"mkdir -p {CKPT}")

    result = _launch(sandbox, tmp_path, nodes)

    assert result.code == 2, result.stdout + result.stderr
    assert "exact resume" in result.stderr  # janitor start's warning, said first
    assert "'launch' with --janitor is destructive and would run on 2 hosts" in result.stderr
    assert "pass --yes" in result.stderr
    for node in nodes:
        assert _janitor_pids(sandbox, node) == [], f"{node.name}: a janitor was started"
        assert _on(sandbox, node, "ls -A /var/lib/fleet/janitor 2>/dev/null; :") == ""
        assert _on(sandbox, node, f"ls -A {LAUNCH_STATE} 2>/dev/null; :") == ""


def test_a_failed_launch_stops_the_janitor_it_started_and_only_that(
    sandbox: Any, tmp_path: Path, no_launch_state: None
) -> None:
    """The rollback stops the janitor where this launch started it; one that was running before
    the launch keeps running, and fleet says which is which."""
    before, fresh = sandbox.nodes()[:2]
    for node in (before, fresh):
        _on(sandbox, node, f"mkdir -p {CKPT}")
    first = _janitor(sandbox, tmp_path, "start", "--dir", CKPT, "--yes", "-l", before.name)
    assert first.code == 0, first.stdout + first.stderr
    running = _janitor_pids(sandbox, before)
    assert len(running) == 1

    result = _launch(sandbox, tmp_path, [before, fresh], "--yes")

    assert result.code == 3, result.stdout + result.stderr
    assert "rolled back" in result.stderr
    assert f"janitor started by this launch stopped on {fresh.name}" in result.stderr
    assert f"janitor left running on {before.name}: it was running before" in result.stderr
    assert _janitor_pids(sandbox, fresh) == [], "the launch's own janitor survived the rollback"
    assert _janitor_pids(sandbox, before) == running, "the rollback stopped another's janitor"
    status = _janitor(sandbox, tmp_path, "status", "--dir", CKPT, *_limit([before, fresh]))
    assert _facts(_out(status, before)[-1])["janitor"] == "running"
    assert _facts(_out(status, fresh)[-1])["janitor"] == "stopped"
