"""fleet/remote/janitor.sh (with janitor-loop.sh inlined, exactly as fleet ships it), run on this
machine against directories in tmp_path, under dash, bash --posix and busybox sh.

The script is fed on stdin (`sh -s -- ACTION ...`), HOME and FLEET_NODE_STATE (the janitor's
state dir) point into tmp_path, and every daemon a test starts is found by its command line
(which names the test's own tmp_path) and killed by pid afterwards. Needs Linux (/proc) and setsid.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import builtin_dir, load_playbook, remote_dir

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir() or shutil.which("setsid") is None,
    reason="the janitor reads /proc and starts its daemon with setsid (Linux, util-linux)",
)

SCRIPT = load_playbook(builtin_dir() / "janitor.yaml").steps[0].script or ""
DELETE = [
    "*_optim_states.pt",
    "*_model_states.pt",
    "zero_pp_rank_*_model_states.pt",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state*.pth",
]
KEEP = ["adapter_model.safetensors", "adapter_config.json"]
SHELLS = {"dash": ["dash"], "bash": ["bash", "--posix"], "busybox": ["busybox", "sh"]}
OLD = time.time() - 3600


def _globs(delete: list[str] = DELETE, keep: list[str] = KEEP) -> list[str]:
    out: list[str] = []
    for g in delete:
        out += ["--delete", g]
    for g in keep:
        out += ["--keep", g]
    return out


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(params=list(SHELLS))
def shell(request: pytest.FixtureRequest) -> list[str]:
    argv = SHELLS[request.param]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    return argv


def _daemons(marker: str) -> list[int]:
    """Pids of janitor daemons whose command line contains marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "janitor-loop.sh loop" in cmd and marker in cmd:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _fd_targets(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            out.append(os.readlink(fd))
    return out


def _children(parent: int, comm: str) -> set[int]:
    """Pids of `parent`'s children named `comm`, now."""
    found = set()
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            line = entry.read_text()
        except OSError:
            continue
        name, rest = line[line.index("(") + 1 : line.rindex(")")], line[line.rindex(")") + 2 :]
        if name == comm and int(rest.split()[1]) == parent:
            found.add(int(entry.parent.name))
    return found


def _poll(check: Callable[[], bool], timeout_s: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    """run(*args, shell=[...]) -> CompletedProcess: janitor.sh fed on stdin, HOME in tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "FLEET_NODE_STATE": str(tmp_path / "node-state"),  # not the host's /var/lib/fleet
    }

    def _run(*args: str, shell: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*(shell or ["dash"]), "-s", "--", *args],
            input=SCRIPT,
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )

    try:
        yield _run
    finally:
        for pid in _daemons(str(tmp_path)):  # a test that failed half-way: kill by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _file(path: Path, size: int = 1000, mtime: float | None = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, list[Path]]:
    """A ZeRO-3 + PEFT checkpoint dir, plus things outside it reached through symlinks."""
    ckpt = tmp_path / "ckpt"
    outside = tmp_path / "outside"
    step = ckpt / "checkpoint-2"
    doomed = [
        _file(step / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", 4000),
        _file(step / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt", 4000),
        _file(step / "global_step2" / "zero_pp_rank_0_mp_rank_00_model_states.pt", 2000),
        _file(step / "optimizer.pt", 3000),
        _file(step / "scheduler.pt", 100),
        _file(step / "rng_state_0.pth", 50),
        _file(ckpt / "odd names" / "-rf \\ x_optim_states.pt", 10),
    ]
    kept = [
        _file(step / "adapter_model.safetensors", 500),
        _file(step / "adapter_config.json", 20),
        _file(step / "trainer_state.json", 30),
        _file(step / "global_step2" / "latest", 5),
        _file(outside / "precious_optim_states.pt", 7),
        _file(outside / "shared" / "optimizer.pt", 7),
        _file(ckpt / "new\nline_optim_states.pt", 7),  # one path per line: left alone
    ]
    (step / "link_optim_states.pt").symlink_to(outside / "precious_optim_states.pt")
    (step / "linked_dir").symlink_to(outside / "shared")
    kept += [step / "link_optim_states.pt", step / "linked_dir"]
    return {"doomed": doomed, "kept": kept}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if not p.is_dir() or p.is_symlink()
    }


# ----------------------------------------------------------------------------- refusals


def _refusals(tmp_path: Path) -> list[tuple[str, str]]:
    home = tmp_path / "home"
    (tmp_path / "to-root").symlink_to("/")
    (tmp_path / "to-home").symlink_to(home)
    (tmp_path / "to-usr").symlink_to("/usr")
    (tmp_path / "a-file").write_text("x")
    return [
        ("", "--dir is empty"),
        ("ckpt", "is relative"),
        ("./ckpt", "is relative"),
        ("/", "root directory"),
        ("//", "root directory"),
        ("/usr", "system directory"),
        ("/usr/lib", "inside a system directory"),
        ("/etc/", "system directory"),
        ("/proc/1", "inside a system directory"),
        ("/tmp", "system directory"),
        ("/root", "system directory"),
        (str(home), "home directory"),
        (f"{home}/", "home directory"),
        ("~", "home directory"),
        (str(tmp_path / "to-root"), "resolves to / is the root directory"),
        (str(tmp_path / "to-home"), "home directory"),
        (str(tmp_path / "to-usr") + "/lib", "inside a system directory"),
        (str(tmp_path / "ckpt") + "/.." * 30, "resolves to / is the root directory"),
        (str(tmp_path / "no-such-dir"), "no such directory on this host"),
        (str(tmp_path / "a-file"), "is not a directory"),
    ]


@pytest.mark.parametrize("action", ["start", "run-once", "stop"])
def test_unsafe_or_missing_dirs_are_refused_and_nothing_is_touched(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]], action: str
) -> None:
    before = _snapshot(tmp_path / "ckpt")
    for given, reason in _refusals(tmp_path):
        if action == "stop" and reason in ("no such directory on this host",):
            continue  # nothing runs for a dir that does not exist: see the test below
        result = run(action, "--dir", given, "--min-age", "0", *_globs())
        lines = result.stdout.splitlines()
        assert result.returncode == 1, (given, result)
        assert len(lines) == 1, (given, lines)
        assert lines[0].startswith("janitor: refused: "), (given, lines)
        assert reason in lines[0], (given, lines[0])
        assert result.stderr == "", (given, result.stderr)
    assert _snapshot(tmp_path / "ckpt") == before
    assert _daemons(str(tmp_path)) == []
    assert not (tmp_path / "node-state").exists(), "a refused run wrote state"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--interval", "0"], "more than 0"),
        (["--interval", "1s"], "not a number"),
        (["--min-age", "-1"], "not a number"),
        (["--min-age", "1.2.3"], "not a number"),
        (["--delete", "a/optimizer.pt"], "not paths"),
        (["--delete", "*"], "matches every file"),
        (["--delete", "?*"], "matches every file"),
        (["--keep", "x/y"], "not paths"),
        (["--delete", "*_{optim,model}_states.pt"], "no {a,b} alternatives"),
        (["--keep", "{best,final}_optim_states.pt"], "give one --keep per alternative"),
    ],
)
def test_bad_options_are_refused(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]], args: list[str], reason: str
) -> None:
    result = run("start", "--dir", str(tmp_path / "ckpt"), *_globs(), *args)
    assert result.returncode == 1
    assert reason in result.stdout
    assert _daemons(str(tmp_path)) == []


def test_start_without_a_delete_glob_is_refused(run: Run, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    result = run("start", "--dir", str(tmp_path / "ckpt"))
    assert result.returncode == 1
    assert "nothing to delete" in result.stdout


def test_stop_and_status_of_a_dir_that_does_not_exist_answer_without_failing(
    run: Run, tmp_path: Path
) -> None:
    # `fleet status` asks before the first run has created the output dir
    missing = tmp_path / "not-yet"
    stop = run("stop", "--dir", str(missing))
    assert stop.returncode == 0
    assert stop.stdout == f"janitor: not running for {missing} (no such directory on this host)\n"
    status = run("status", "--dir", str(missing))
    assert status.returncode == 0
    assert status.stdout == f"janitor=none dir={missing} reason=no-such-directory\n"


def test_a_fractional_min_age_is_rounded_up(run: Run, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    result = run("start", "--dir", str(tmp_path / "ckpt"), "--min-age", "2.5", *_globs())
    assert "files older than 3s" in result.stdout
    run("stop", "--dir", str(tmp_path / "ckpt"))


def test_usage_errors_exit_2(run: Run) -> None:
    assert run().returncode == 2
    assert run("explode", "--dir", "/x").returncode == 2
    assert run("status", "--bogus").returncode == 2
    assert run("start", "--dir").returncode == 2


# ----------------------------------------------------------------------------- one pass


def test_run_once_dry_run_lists_every_doomed_file_and_deletes_nothing(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]], shell: list[str]
) -> None:
    before = _snapshot(tmp_path)
    result = run("run-once", "--dir", str(tmp_path / "ckpt"), *_globs(), "--dry-run", shell=shell)

    assert result.returncode == 0, result
    listed = re.findall(r"^would delete: (.*) \((\d+) bytes\)$", result.stdout, re.M)
    assert sorted(p for p, _ in listed) == sorted(str(p) for p in tree["doomed"])
    assert {p: int(n) for p, n in listed} == {str(p): p.stat().st_size for p in tree["doomed"]}
    total = sum(p.stat().st_size for p in tree["doomed"])
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"janitor: would delete {len(tree['doomed'])} files ({total} bytes")
    assert _snapshot(tmp_path) == before


@pytest.mark.root
def test_a_strangers_open_fd_does_not_keep_a_file_not_theirs_the_owners_does(
    run: Run, tmp_path: Path, shell: list[str]
) -> None:
    """Any user may open a shard they can read: counted as in use, a stranger's reader kept the
    run's shards for good and the disk filled. A hold counts from root, the janitor's uid or the
    file's owner (a reader of a deleted file keeps reading it through its fd)."""
    ckpt = tmp_path / "ckpt"
    roots = _file(ckpt / "a_optim_states.pt")
    theirs = _file(ckpt / "b_optim_states.pt")
    os.chown(theirs, 4242, 4242)
    with open(roots, "rb") as fa, open(theirs, "rb") as fb:
        stranger = subprocess.Popen(
            ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "sleep", "60"],
            pass_fds=[fa.fileno(), fb.fileno()],
        )
    try:

        def holding() -> bool:
            proc = Path(f"/proc/{stranger.pid}")
            held = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            return str(theirs) in held and (proc / "exe").resolve().name == "sleep"

        _poll(holding, what="the stranger's sleep holding the shard")
        result = run("run-once", "--dir", str(ckpt), "--min-age", "0", *_globs(), shell=shell)
    finally:
        stranger.kill()
        stranger.wait()
    assert result.returncode == 0, result
    assert not roots.exists(), result.stdout
    assert theirs.exists()
    assert f"skipped (in use by pid {stranger.pid}): {theirs}" in result.stdout


@pytest.mark.root
def test_an_unreadable_subdirectory_is_logged_once_not_every_pass(run: Run, tmp_path: Path) -> None:
    """find's complaint about a directory the janitor cannot read (another user's, lost+found on
    a disk's root) went to the log on every pass: a line every 3 s for as long as it ran."""
    ckpt = tmp_path / "ckpt"
    locked = ckpt / "locked"
    locked.mkdir(parents=True)
    os.chown(locked, 4242, 4242)
    locked.chmod(0o700)
    # root without the capabilities that read any directory: as a login that is not root
    blind = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "dash"]
    result = run("start", "--dir", str(ckpt), "--interval", "0.2", "--min-age", "0",
                 *_globs(), shell=blind)  # fmt: skip
    assert result.returncode == 0, result
    for name in ("a", "b", "c"):  # each gone: at least three passes saw the locked dir
        doomed = _file(ckpt / f"{name}_optim_states.pt")
        _poll(lambda d=doomed: not d.exists(), what=f"{doomed} to go")
    run("stop", "--dir", str(ckpt))
    text = next((tmp_path / "node-state" / "janitor").glob("*/log")).read_text()
    said = rf"^\S+Z find: .{re.escape(str(locked))}.: Permission denied$"
    assert len(re.findall(said, text, re.M)) == 1, text


def test_run_once_deletes_exactly_the_unwanted_files(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]], shell: list[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    fresh = _file(ckpt / "checkpoint-4" / "optimizer.pt", 9, mtime=None)  # being written
    held = _file(ckpt / "checkpoint-4" / "scheduler.pt", 9)
    mapped = _file(ckpt / "checkpoint-4" / "rng_state_1.pth", 4096)
    keep_wins = _file(ckpt / "checkpoint-4" / "keep_optim_states.pt", 9)
    total = sum(p.stat().st_size for p in tree["doomed"])
    with open(mapped, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)  # mapped; no fd once closed
    try:
        with open(held, "rb"):
            result = run(
                "run-once",
                "--dir",
                str(ckpt) + "/",
                "--min-age",
                "60",
                *_globs(keep=[*KEEP, "keep_*"]),
                shell=shell,
            )
    finally:
        mm.close()

    assert result.returncode == 0, result
    out = result.stdout
    for p in tree["doomed"]:
        assert not os.path.lexists(p), f"{p} survived"
        assert re.search(rf"^deleted: {re.escape(str(p))} \(\d+ bytes\)$", out, re.M)
    for p in [*tree["kept"], fresh, held, mapped, keep_wins]:
        assert os.path.lexists(p), f"{p} was deleted"
    assert (tmp_path / "outside" / "precious_optim_states.pt").is_file()
    assert (tmp_path / "outside" / "shared" / "optimizer.pt").is_file()
    assert re.search(rf"^skipped \(modified \d+s ago\): {re.escape(str(fresh))}$", out, re.M)
    assert f"skipped (in use by pid {os.getpid()}): {held}" in out
    assert f"skipped (in use by pid {os.getpid()}): {mapped}" in out
    assert out.splitlines()[-1] == (
        f"janitor: deleted {len(tree['doomed'])} files ({total} bytes, {total / 1000:.1f} kB)"
        "; skipped 2 in use, 1 modified in the last 60s"
    )


def test_sizes_shown_to_people_are_human_and_exact_in_bytes(run: Run, tmp_path: Path) -> None:
    big = tmp_path / "ckpt" / "global_step9" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as fh:  # sparse: 53 GB of size, no disk
        fh.truncate(53_000_000_000)
    os.utime(big, (OLD, OLD))

    result = run("run-once", "--dir", str(tmp_path / "ckpt"), *_globs())

    assert result.stdout.splitlines()[-1] == (
        "janitor: deleted 1 file (53000000000 bytes, 53.0 GB)"
    )


# ----------------------------------------------------------------------------- the daemon


def _start(run: Run, ckpt: Path, *extra: str) -> int:
    result = run("start", "--dir", str(ckpt), "--interval", "0.2", "--min-age", "1", *extra)
    assert result.returncode == 0, result
    m = re.fullmatch(
        rf"janitor: started for {re.escape(str(ckpt))} \(pid (\d+), every 0\.2s, files older "
        r"than 1s, deleting .*, keeping .*\)\n",
        result.stdout,
    )
    assert m, result.stdout
    return int(m.group(1))


def _status(run: Run, ckpt: Path | None = None) -> list[dict[str, str]]:
    result = run("status", *(["--dir", str(ckpt)] if ckpt else []))
    assert result.returncode == 0, result
    return [dict(kv.split("=", 1) for kv in line.split()) for line in result.stdout.splitlines()]


def test_start_status_stop(run: Run, tmp_path: Path, tree: dict[str, list[Path]]) -> None:
    ckpt = tmp_path / "ckpt"
    assert _status(run) == [{"janitor": "none"}]

    pid = _start(run, ckpt, *_globs())

    # Detached: its own session, output to its log. The caller has returned although it
    # captured stdout and stderr, so the daemon holds neither pipe (PITFALLS 12). (fds are not
    # checked one by one: dash points them elsewhere for a moment around a here-document or a
    # redirected builtin, keeping the original on a high fd.)
    assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) == pid
    fds = _fd_targets(pid)
    assert any(target.endswith("/log") for target in fds), fds
    _poll(lambda: not any(os.path.lexists(p) for p in tree["doomed"]), what="doomed files")
    assert all(os.path.lexists(p) for p in tree["kept"])

    again = run("start", "--dir", f"{ckpt}/", "--interval", "5", "--min-age", "1", *_globs())
    assert again.returncode == 0
    assert re.fullmatch(
        rf"janitor: already running for {re.escape(str(ckpt))} \(pid {pid}, up \d+s\)\n",
        again.stdout,
    )
    assert _daemons(str(tmp_path)) == [pid]

    total = len(tree["doomed"])
    freed = 4000 + 4000 + 2000 + 3000 + 100 + 50 + 10
    _poll(lambda: _status(run, ckpt)[0].get("deleted") == str(total), what="stats")
    (status,) = _status(run, ckpt)
    assert status["janitor"] == "running"
    assert status["pid"] == str(pid)
    assert status["dir"] == str(ckpt)
    assert status["freed_bytes"] == str(freed)
    assert int(status["free_bytes"]) > 0
    assert int(status["uptime_s"]) >= 0
    assert [(s["dir"], s["pid"]) for s in _status(run)] == [(str(ckpt), str(pid))]

    late = _file(ckpt / "checkpoint-6" / "optimizer.pt", 11, mtime=None)
    _poll(lambda: not late.exists(), what="the late file to age past min-age and go")

    stop = run("stop", "--dir", str(ckpt))
    assert stop.returncode == 0
    assert stop.stdout == (
        f"janitor: stopped for {ckpt} (pid {pid}; deleted {total + 1} files, freed 13.2 kB)\n"
    )
    assert not _alive(pid)
    assert _daemons(str(tmp_path)) == []
    assert run("stop", "--dir", str(ckpt)).stdout == f"janitor: not running for {ckpt}\n"
    (after,) = _status(run, ckpt)
    assert after["janitor"] == "stopped"
    assert after["deleted"] == str(total + 1)
    log = next((tmp_path / "node-state" / "janitor").glob("*/log"))
    text = log.read_text()
    for p in [*tree["doomed"], late]:
        assert re.search(rf"^\S+Z deleted {re.escape(str(p))} \(\d+ bytes\)$", text, re.M), p
    assert re.search(rf"^\S+Z skipped \(modified [01]s ago\): {re.escape(str(late))}$", text, re.M)


def test_an_fd_inherited_from_the_caller_does_not_pin_a_file(run: Run, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    held = _file(ckpt / "optimizer.pt", 10)
    # the caller starts the janitor while it holds the file on fd 7, then exits
    result = subprocess.run(
        ["sh", "-c", 'exec 7<"$1"; shift; exec dash -s -- "$@"', "sh", str(held), "start",
         "--dir", str(ckpt), "--interval", "0.2", "--min-age", "0", *_globs()],
        input=SCRIPT, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
             "FLEET_NODE_STATE": str(tmp_path / "node-state")},
    )  # fmt: skip
    assert result.returncode == 0, result
    _poll(lambda: not held.exists(), what="the janitor to delete the file the caller held")
    run("stop", "--dir", str(ckpt))


def test_a_recycled_pid_is_never_signalled(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]]
) -> None:
    ckpt = tmp_path / "ckpt"
    _start(run, ckpt, *_globs())
    run("stop", "--dir", str(ckpt))
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        state = next((tmp_path / "node-state" / "janitor").iterdir())
        (state / "pid").write_text(f"{bystander.pid}\n")
        (state / "starttime").write_text("1\n")  # what the janitor's pid had, not this one's

        # pid files no stop removed: the janitor died and its pid went to another process
        assert _status(run, ckpt)[0]["janitor"] == "dead"
        assert run("stop", "--dir", str(ckpt)).stdout == f"janitor: not running for {ckpt}\n"
        assert bystander.poll() is None, "stop signalled a process that is not the janitor"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_second_start_with_other_globs_is_refused_not_reported_running(
    run: Run, tmp_path: Path
) -> None:
    """The start warning says: for ZeRO 0-2 pass globs of your own (the default
    *_model_states.pt takes the weights). Started again with them, the janitor said `already
    running`, exit 0, and the first one went on deleting with the defaults."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pid = _start(run, ckpt, *_globs())
    mine = ["--delete", "*_optim_states.pt"]
    again = run("start", "--dir", str(ckpt), "--interval", "0.2", "--min-age", "1", *mine)
    assert again.returncode == 1, again
    assert again.stdout == (
        f"janitor: refused: already running for {ckpt} with other globs or min-age (pid {pid}: "
        "delete=*_model_states.pt delete=*_optim_states.pt delete=optimizer.pt "
        "delete=rng_state*.pth delete=scheduler.pt delete=zero_pp_rank_*_model_states.pt "
        "keep=adapter_config.json keep=adapter_model.safetensors min_age=1): "
        "stop it first to change them\n"
    )
    fewer_keeps = run("start", "--dir", str(ckpt), "--min-age", "1", *_globs(keep=KEEP[:1]))
    assert fewer_keeps.returncode == 1, fewer_keeps
    # --min-age is the guard for a file being written: one asking for 60 s is not served by 1 s
    older = run("start", "--dir", str(ckpt), "--min-age", "60", *_globs())
    assert older.returncode == 1, older
    assert "with other globs or min-age" in older.stdout
    # the same globs in another order, another interval: that janitor, already running
    same = run("start", "--dir", str(ckpt), "--interval", "9", "--min-age", "1",
               *_globs(delete=DELETE[::-1], keep=KEEP[::-1]))  # fmt: skip
    assert same.returncode == 0, same
    assert same.stdout.startswith(f"janitor: already running for {ckpt} (pid {pid}, up ")
    assert _daemons(str(tmp_path)) == [pid]
    run("stop", "--dir", str(ckpt))
    pid = _start(run, ckpt, *mine)
    assert _status(run, ckpt)[0]["pid"] == str(pid)
    run("stop", "--dir", str(ckpt))


def test_a_janitor_that_died_is_dead_not_stopped(run: Run, tmp_path: Path) -> None:
    """Killed (the OOM killer, kill -9) or lost in a reboot, the janitor no longer keeps the disk
    bounded: status says so until an operator stops or starts it again."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pid = _start(run, ckpt, *_globs())
    os.kill(pid, signal.SIGKILL)
    _poll(lambda: not _alive(pid), what="the janitor to die")
    assert _status(run, ckpt)[0]["janitor"] == "dead"
    assert [s["janitor"] for s in _status(run)] == ["dead"]
    assert run("stop", "--dir", str(ckpt)).stdout == f"janitor: not running for {ckpt}\n"
    assert _status(run, ckpt)[0]["janitor"] == "stopped"
    again = _start(run, ckpt, *_globs())
    assert _status(run, ckpt)[0]["janitor"] == "running"
    run("stop", "--dir", str(ckpt))
    assert not _alive(again)
    assert _status(run, ckpt)[0]["janitor"] == "stopped"


def _unless_gone_already(
    func: object, path: str, exc: tuple[type[BaseException], BaseException, object]
) -> None:
    if not isinstance(exc[1], FileNotFoundError):
        raise exc[1]


def test_the_daemon_exits_when_its_dir_disappears(
    run: Run, tmp_path: Path, tree: dict[str, list[Path]]
) -> None:
    ckpt = tmp_path / "ckpt"
    pid = _start(run, ckpt, *_globs())
    ckpt.rename(tmp_path / "going")  # at once; an rmtree in place races the janitor's deletions
    # A pass under way finishes inside the renamed dir (it is cd'd there): what it deletes
    # meanwhile is gone already, not an error of this removal.
    shutil.rmtree(tmp_path / "going", onerror=_unless_gone_already)
    _poll(lambda: not _alive(pid), what="the janitor to notice its dir is gone")
    (status,) = _status(run, ckpt)
    assert status["janitor"] == "dead"  # no operator stopped it: the disk fills from now on
    assert status["free_bytes"] == "unknown"
    log = next((tmp_path / "node-state" / "janitor").glob("*/log"))
    assert f"janitor stopped: {ckpt} is gone" in log.read_text()


def test_each_dir_gets_its_own_janitor(run: Run, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pa, pb = _start(run, a, *_globs()), _start(run, b, *_globs())
    assert pa != pb
    assert sorted(s["dir"] for s in _status(run)) == [str(a), str(b)]
    run("stop", "--dir", str(a))
    assert not _alive(pa)
    assert _alive(pb)
    assert {s["dir"]: s["janitor"] for s in _status(run)} == {str(a): "stopped", str(b): "running"}


# ----------------------------------------------------------------------------- deletion scope

LOOP_SCRIPT = (remote_dir() / "janitor-loop.sh").read_text()
UNSHARE = ["unshare", "--mount", "--propagation", "private"]


def _mount_namespaces_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


_mounts_work = pytest.mark.skipif(
    not _mount_namespaces_work(), reason="bind mounts need root and unshare --mount"
)


def needs_mounts(test: Callable[..., None]) -> Callable[..., None]:
    """Root, and a private mount namespace to bind-mount in."""
    return pytest.mark.root(_mounts_work(test))  # type: ignore[no-any-return]


def _in_mount_namespace(
    setup: str, argv: list[str], tmp_path: Path, stdin: str = SCRIPT
) -> subprocess.CompletedProcess[str]:
    """Run `setup` (sh, as root) then argv in a private mount namespace: its mounts vanish
    with it and are never seen outside."""
    return subprocess.run(
        [*UNSHARE, "sh", "-c", f'{setup}\nexec "$@"', "sh", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path / "home"),
            "FLEET_NODE_STATE": str(tmp_path / "node-state"),
        },
        cwd=tmp_path,
        timeout=60,
        check=False,
    )


@needs_mounts
def test_a_bind_mount_inside_the_dir_is_never_entered(
    tmp_path: Path, tree: dict[str, list[Path]], shell: list[str]
) -> None:
    """A bind mount of the same filesystem has the dir's device number, so -xdev walks into
    it: the janitor must stop at every mount point and leave what is behind it alone."""
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    (tmp_path / "home").mkdir(exist_ok=True)
    bound = _file(outside / "shared" / "optimizer.pt", 9)
    odd = _file(outside / "odd [dir]*" / "scheduler.pt", 9)
    setup = " && ".join(
        f"mkdir -p {_sh(mp)} && mount --bind {_sh(src)} {_sh(mp)}"
        for src, mp in [
            (outside / "shared", ckpt / "checkpoint-2" / "bound"),
            (outside / "odd [dir]*", ckpt / "odd [dir]*"),
        ]
    )
    before = _snapshot(outside)

    result = _in_mount_namespace(
        setup, [*shell, "-s", "--", "run-once", "--dir", str(ckpt), *_globs()], tmp_path
    )

    assert result.returncode == 0, result
    assert bound.exists(), f"deleted {bound} through a bind mount:\n{result.stdout}"
    assert odd.exists(), f"deleted {odd} through a bind mount:\n{result.stdout}"
    assert _snapshot(outside) == before
    assert "bound" not in result.stdout
    for p in tree["doomed"]:
        assert not os.path.lexists(p), f"{p} survived"


@needs_mounts
def test_a_mount_made_mid_pass_stops_the_deletion(tmp_path: Path) -> None:
    """delete_one checks the mount of the file's directory again just before it deletes: a
    bind mount made after the pass listed the file leaves it alone (exit 4)."""
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    (ckpt / "sub").mkdir(parents=True)
    target = _file(outside / "optimizer.pt", 9)
    ref = _file(tmp_path / "ref", 0, mtime=time.time())
    functions = "".join(
        re.search(rf"^{name}\(\) {{.*?^}}\n", LOOP_SCRIPT, re.S | re.M).group(0)  # type: ignore[union-attr]
        for name in ("mount_id", "delete_one")
    )
    program = (
        functions
        + 'DIR=$1 REF=$2 DEV=$(stat -c %d "$DIR") MNT=$(mount_id "$DIR")\n'
        + 'mount --bind "$3" "$DIR/sub"\n'
        + 'delete_one "$DIR/sub/optimizer.pt"; echo "rc=$?"\n'
    )
    result = _in_mount_namespace(
        "true", ["dash", "-c", program, "sh", str(ckpt), str(ref), str(outside)], tmp_path, ""
    )
    assert result.stdout == "rc=4\n", result
    assert target.exists()


def _sh(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


@pytest.mark.parametrize(
    ("glob", "names"),
    [
        ("*.*", ["model.safetensors", "pytorch_model.bin", "config.json", "tokenizer.json"]),
        ("[!.]*", ["model.safetensors", "config.json", "merges.txt"]),
        ("*.bin", ["pytorch_model.bin", "model.bin", "adapter_model.bin"]),
    ],
)
@pytest.mark.parametrize("action", ["start", "run-once"])
def test_a_glob_that_takes_final_weights_is_refused_naming_them(
    run: Run, tmp_path: Path, shell: list[str], action: str, glob: str, names: list[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    weights = [_file(ckpt / n, 10) for n in names]
    result = run(action, "--dir", str(ckpt), "--min-age", "0", "--delete", glob, shell=shell)
    assert result.returncode == 1, result
    (line,) = result.stdout.splitlines()
    assert line.startswith(
        f"janitor: refused: --delete '{glob}' would delete final model weights or configs: "
    )
    for name in names:
        assert name in line
    assert line.endswith("narrow the glob, --keep those files, or pass --allow-weights")
    assert all(p.exists() for p in weights)
    assert _daemons(str(tmp_path)) == []


def test_keep_globs_or_allow_weights_let_such_a_glob_run(run: Run, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    weights = _file(ckpt / "pytorch_model.bin", 10)
    args = ["--dir", str(ckpt), "--min-age", "0", "--delete", "*.bin"]
    kept = run("run-once", *args, "--keep", "*model*.bin")
    assert kept.returncode == 0, kept
    assert weights.exists()
    allowed = run("run-once", *args, "--allow-weights")
    assert allowed.returncode == 0, allowed
    assert f"deleted: {weights} (10 bytes)" in allowed.stdout
    assert not weights.exists()


# ----------------------------------------------------------------------------- adversarial


@needs_mounts
def test_a_file_that_cannot_be_deleted_is_logged_once_not_every_pass(
    tmp_path: Path, shell: list[str]
) -> None:
    """A dir whose filesystem went read-only (ext4 errors=remount-ro after a disk error): every
    pass fails on the same files. The daemon says so once, not every few seconds forever."""
    ckpt = tmp_path / "ckpt"
    stuck = _file(ckpt / "optimizer.pt", 9)
    (tmp_path / "home").mkdir()
    setup = f"mount --bind {_sh(ckpt)} {_sh(ckpt)} && mount -o remount,bind,ro {_sh(ckpt)}"
    argv = [*shell, "-s", "--", "start", "--dir", str(ckpt), "--interval", "0.1"]
    result = _in_mount_namespace(setup, [*argv, "--min-age", "0", *_globs()], tmp_path)
    assert result.returncode == 0, result
    try:
        log = next((tmp_path / "node-state" / "janitor").glob("*/log"))
        _poll(lambda: "failed" in log.read_text(), what="a failed deletion")
        (daemon,) = _daemons(str(tmp_path))
        naps: set[int] = set()  # the daemon's `sleep` between passes: one per pass done

        def ten_more_passes() -> bool:
            naps.update(_children(daemon, "sleep"))
            return len(naps) >= 10

        _poll(ten_more_passes, timeout_s=30, what="ten more passes")
        text = log.read_text()
    finally:
        for pid in _daemons(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
    assert stuck.exists()
    assert text.count(f"failed to delete {stuck} (Read-only file system)\n") == 1, text
    assert "rm: " not in text, text


@needs_mounts
def test_a_full_tmp_does_not_stop_the_janitor(tmp_path: Path) -> None:
    """/tmp is every user's: one who fills it (here: no inode left) must not stop the janitor
    from deleting, nor may the janitor put anything there (docs/safety.md: node state)."""
    ckpt = tmp_path / "ckpt"
    doomed = _file(ckpt / "optimizer.pt", 9)
    (tmp_path / "home").mkdir()
    old = "/mnt/old"  # tmp_path, seen through a bind mount: the real /tmp is hidden
    setup = (
        f"mount -t tmpfs none /mnt && mkdir {old} && mount --bind {_sh(tmp_path)} {old} && "
        "mount -t tmpfs -o nr_inodes=3 none /tmp && i=0 && "
        'while touch "/tmp/f$i" 2>/dev/null; do i=$((i + 1)); done && '
        f"export FLEET_NODE_STATE={_sh(Path(old) / 'node-state')}"
    )
    argv = ["dash", "-s", "--", "run-once", "--dir", f"{old}/ckpt", "--min-age", "0", *_globs()]
    result = _in_mount_namespace(setup, argv, tmp_path)
    assert result.returncode == 0, result
    assert f"deleted: {old}/ckpt/optimizer.pt (9 bytes)" in result.stdout
    assert not doomed.exists()


def test_a_dir_or_file_swapped_for_a_symlink_after_the_listing_is_left_alone(
    tmp_path: Path,
) -> None:
    """Between a pass's listing and its deletion, whoever can write under the dir swaps a listed
    file's directory, or the file itself, for a symlink to elsewhere: delete_one touches neither
    the symlink's target nor anything outside the dir (exit 3)."""
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    theirs = _file(outside / "optimizer.pt", 9)
    ref = _file(tmp_path / "ref", 0, mtime=time.time())
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub").rmdir()
    (ckpt / "sub").symlink_to(outside)  # was a dir holding optimizer.pt when listed
    (ckpt / "optimizer.pt").symlink_to(theirs)  # was a regular file when listed
    program = (
        "say() { printf '%s\\n' \"$*\"; }\n"
        + "".join(
            re.search(rf"^{name}\(\) {{.*?^}}\n", LOOP_SCRIPT, re.S | re.M).group(0)  # type: ignore[union-attr]
            for name in ("mount_id", "delete_one")
        )
        + (
            'DIR=$1 REF=$2 DEV=$(stat -c %d "$DIR") MNT=$(mount_id "$DIR")\n'
            'for p in "$DIR/sub/optimizer.pt" "$DIR/optimizer.pt"; do\n'
            '    delete_one "$p"; echo "rc=$?"\n'
            "done\n"
        )
    )
    result = subprocess.run(
        ["dash", "-c", program, "sh", str(ckpt), str(ref)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.stdout == "rc=3\nrc=3\n", result
    assert theirs.is_file()
    assert (ckpt / "optimizer.pt").is_symlink()
