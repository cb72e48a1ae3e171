"""The frame around fleet's own output on a node (fleet/core/frame.py, shell.framed): only what the
command printed between its start and end lines is read, whatever a login shell prints around it;
a frame that never started or never ended is a failure with a reason, never a crash.

The parser is fed through the transport's real line reader, in chunks split anywhere; the framed
command runs through the real shells a login shell may be (dash, bash, busybox sh, zsh when
installed), each made to talk the way it would over ssh.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.frame import BEGIN, END, NOISE_KEEP_LINES, STDIN_LOST, Frame, marker, new_token
from fleet.core.shell import PID_MARKER, STDIN_MARK, framed, wrap
from fleet.ssh.transport import _Reader

TOKEN = "0123456789abcdef0123456789abcdef"
OTHER = "ffffffffffffffffffffffffffffffff"


def framed_output(body: str, *, before: str = "", after: str = "", end: bool = True) -> str:
    """One stream as the frame prints it around `body`, with a login shell's noise around."""
    text = f"{before}\n{marker(TOKEN, BEGIN)}\n{body}"
    if end:
        text += f"\n{marker(TOKEN, END)}\n{after}"
    return text


def read(streams: dict[str, str], cuts: list[int] | None = None) -> tuple[_Reader, Frame, dict]:
    """Both streams through a framed _Reader, in chunks cut at `cuts`; the lines it passed on."""
    frame = Frame(TOKEN)
    got: dict[str, list[str]] = {"stdout": [], "stderr": []}
    reader = _Reader(lambda stream, line: got[stream].append(line), frame)
    for stream, text in streams.items():
        data = text.encode()
        points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts or [])})
        for a, b in itertools.pairwise(points):
            reader.feed(stream, data[a:b])
    reader.flush()
    return reader, frame, got


def lines_of(body: str) -> list[str]:
    """The lines a reader of `body` alone would see."""
    lines = body.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def both(text: str) -> dict[str, str]:
    return {"stdout": text, "stderr": framed_output("")}


line_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
)
noise_lines = st.lists(
    st.one_of(
        line_text,
        st.sampled_from(
            [
                "facts 1",
                "end",
                f"{PID_MARKER}1",
                marker(OTHER, BEGIN),
                marker(OTHER, END),
                marker(TOKEN, "begun"),
                "run=ghost state=running",
            ]
        ),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.lists(line_text, max_size=8).map("\n".join),
    newline_at_end=st.booleans(),
    before=noise_lines,
    partial_before=line_text,
    after=noise_lines,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
)
def test_only_the_framed_lines_are_the_commands_whatever_is_printed_around_them(
    body: str,
    newline_at_end: bool,
    before: list[str],
    partial_before: str,
    after: list[str],
    cuts: list[int],
) -> None:
    if newline_at_end and body:
        body += "\n"
    noise_before = "".join(f"{x}\n" for x in before) + partial_before
    text = framed_output(body, before=noise_before, after="\n".join(after))
    _, frame, got = read(both(text), cuts)
    assert got["stdout"] == lines_of(body)
    assert frame.problem() is None
    noisy = [x for x in [*before, partial_before] if x.strip()]
    assert frame.noise.count == len(noisy)
    assert frame.noise.lines == tuple(x[:200] for x in noisy[:NOISE_KEEP_LINES])
    late = [x for x in after if x.strip()]  # after the end: no login shell's, said apart
    assert frame.noise.late_count == len(late)
    assert frame.noise.late_lines == tuple(x[:200] for x in late[:NOISE_KEEP_LINES])


def test_noise_inside_the_frame_is_the_commands_even_when_it_forges_a_frame_line() -> None:
    body = f"{marker(OTHER, END)}\nfleet-frame {TOKEN} ended\n{marker(TOKEN, END)} \nlast"
    _, frame, got = read(both(framed_output(body)))
    assert got["stdout"] == body.split("\n")
    assert frame.problem() is None


def test_empty_lines_of_the_command_survive_only_the_frames_own_is_dropped() -> None:
    _, _, got = read(both(framed_output("\n\na\n\n")))
    assert got["stdout"] == ["", "", "a", ""]


def test_the_pid_line_counts_only_inside_the_frame() -> None:
    stderr = framed_output(f"{PID_MARKER}4242\nerr", before=f"{PID_MARKER}1\n")
    reader, _, got = read({"stdout": framed_output("out"), "stderr": stderr})
    assert reader.pid == 4242
    assert got["stderr"] == ["err"]


def test_a_forged_pid_line_before_the_frame_is_never_taken() -> None:
    stderr = f"{PID_MARKER}1\n" + framed_output("")  # the real wrapper's line was lost
    reader, _, _ = read({"stdout": framed_output(""), "stderr": stderr})
    assert reader.pid is None


def test_output_cut_short_is_a_failure_with_a_reason() -> None:
    _, frame, got = read(both(framed_output("facts 1\nself 2\n", end=False)))
    assert got["stdout"] == ["facts 1", "self 2"]
    assert "without its end frame" in (frame.problem() or "")


def test_a_frame_that_never_started_is_a_failure_and_all_of_it_noise() -> None:
    _, frame, got = read({"stdout": "Welcome\n", "stderr": ""})
    assert got == {"stdout": [], "stderr": []}
    assert "did not run fleet's command" in (frame.problem() or "")
    assert frame.noise.lines == ("Welcome",)


def test_a_lost_stdin_mark_is_a_failure_that_says_so() -> None:
    text = framed_output(f"\n{marker(TOKEN, STDIN_LOST)}")
    _, frame, got = read(both(text))
    assert got["stdout"] == []
    assert "stdin" in (frame.problem() or "")


def test_noise_is_bounded_however_much_there_is() -> None:
    frame = Frame(TOKEN)
    for i in range(100_000):
        frame.take("stdout", f"banner {i} " + "x" * 1000)
    assert frame.noise.count == 100_000
    assert len(frame.noise.lines) == NOISE_KEEP_LINES
    assert all(len(x) <= 200 for x in frame.noise.lines)


def test_output_after_the_end_is_late_never_the_login_shells_and_bounded() -> None:
    """A background child the command left keeps writing after the end frame: its lines are
    counted apart from the rc files' noise, a bounded sample kept."""
    frame = Frame(TOKEN)
    for stream in ("stdout", "stderr"):
        frame.take(stream, marker(TOKEN, BEGIN))
    frame.take("stdout", f"{marker(TOKEN, END)} 0")
    frame.take("stderr", marker(TOKEN, END))
    for i in range(10_000):
        frame.take("stdout", f"bg{i} " + "x" * 1000)
    assert (frame.noise.count, frame.noise.late_count) == (0, 10_000)
    assert frame.noise.late_lines[0].startswith("bg0 ")
    assert len(frame.noise.late_lines) == NOISE_KEEP_LINES
    assert all(len(x) <= 200 for x in frame.noise.late_lines)


def test_a_forged_end_line_loses_to_the_frames_own_which_comes_last() -> None:
    """The command can read the token from its parent's argv and print an end line itself:
    the frame's own comes after it, and its status is the one kept (no noise, no late line)."""
    frame = Frame(TOKEN)
    for stream in ("stdout", "stderr"):
        frame.take(stream, marker(TOKEN, BEGIN))
    frame.take("stdout", f"{marker(TOKEN, END)} 0")
    frame.take("stderr", marker(TOKEN, END))
    assert (frame.ended, frame.status, frame.end_lines) == (True, 0, 2)
    frame.take("stdout", "")
    frame.take("stdout", f"{marker(TOKEN, END)} 7")
    frame.take("stderr", "")
    frame.take("stderr", marker(TOKEN, END))
    assert (frame.status, frame.end_lines) == (7, 4)
    assert (frame.noise.count, frame.noise.late_count) == (0, 0)


def test_the_tail_wait_after_the_end_frame_does_not_restart_on_output() -> None:
    """Once both end lines are in, what still comes is a leftover's: the wait ends TAIL_WAIT_S
    after the last end line however much arrives (a child writing forever held the step); a
    new end line restarts it. Without an end frame, output restarts it, up to TAIL_MAX_S."""
    from fleet.ssh.transport import TAIL_MAX_S, TAIL_WAIT_S, _TailWait

    frame = Frame(TOKEN)
    for stream in ("stdout", "stderr"):
        frame.take(stream, marker(TOKEN, BEGIN))
    unended = _TailWait()
    assert not unended.over(True, 0.0, frame)
    assert not unended.over(True, TAIL_MAX_S, frame)
    assert unended.over(True, TAIL_MAX_S + 1, frame)
    assert not _TailWait().over(False, 0.0, frame)

    frame.take("stdout", f"{marker(TOKEN, END)} 0")
    frame.take("stderr", marker(TOKEN, END))
    tail = _TailWait()
    assert not tail.over(True, 100.0, frame)
    assert not tail.over(True, 100.0 + TAIL_WAIT_S, frame)
    assert tail.over(True, 100.0 + TAIL_WAIT_S + 0.1, frame)
    frame.take("stdout", f"{marker(TOKEN, END)} 7")
    assert not tail.over(True, 110.0, frame)
    assert tail.over(True, 110.0 + TAIL_WAIT_S + 0.1, frame)


def test_tokens_are_fresh_and_long() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(t) == 32 for t in tokens)


# ------------------------------------------------------------- the framed command, really run

SHELLS = [s for s in ("dash", "bash", "busybox", "zsh") if shutil.which(s)]


def login(shell: str, home: Path, command: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`command` through `shell` as sshd runs it, after an rc file that talks on both streams
    (bash: BASH_ENV, as ~/.bashrc over ssh; zsh: ~/.zshenv; dash and busybox read none, so the
    noise goes before the command, as sshd's ~/.ssh/rc would print it)."""
    rc = home / "rc"
    rc.write_text("echo 'Welcome'; echo 'facts 1'; echo 'noise' >&2; printf 'no newline'\n")
    (home / ".zshenv").write_text(rc.read_text())
    argv = {"busybox": ["busybox", "sh"]}.get(shell, [shell])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "BASH_ENV": str(rc), "ZDOTDIR": str(home)}
    if shell in ("dash", "busybox"):
        command = f". {rc}\n{command}"
    return subprocess.run(
        [*argv, "-c", command],
        input=stdin.encode(),
        capture_output=True,
        env=env,
        timeout=20,
        check=False,
    )


def parsed(proc: subprocess.CompletedProcess, token: str) -> tuple[Frame, dict]:
    frame = Frame(token)
    got: dict[str, list[str]] = {"stdout": [], "stderr": []}
    reader = _Reader(lambda stream, line: got[stream].append(line), frame)
    reader.feed("stdout", proc.stdout)
    reader.feed("stderr", proc.stderr)
    reader.flush()
    return frame, got


@pytest.mark.parametrize("shell", SHELLS)
def test_through_a_talking_login_shell_only_the_commands_output_is_read(
    shell: str, tmp_path: Path
) -> None:
    token = new_token()
    command = framed(
        wrap("echo out; echo err >&2; printf tail; exit 7", sudo=False, timeout_s=30, script=False),
        token,
        helper=False,
        stdin_mark=False,
    )
    proc = login(shell, tmp_path, command)
    frame, got = parsed(proc, token)
    assert proc.returncode == 7
    assert got == {"stdout": ["out", "tail"], "stderr": ["err"]}
    assert frame.problem() is None
    assert "Welcome" in frame.noise.lines
    assert "noise" in frame.noise.lines


@pytest.mark.parametrize("shell", SHELLS)
def test_a_step_killed_by_a_signal_still_dies_of_it_through_the_frame(
    shell: str, tmp_path: Path
) -> None:
    """sshd reports the session's own death by signal (exit-signal): fleet says "killed by
    SIGKILL" for a step the OOM killer ended, so the frame dies of the same signal."""
    token = new_token()
    body = wrap('kill -KILL "$$"', sudo=False, timeout_s=None, script=False)
    proc = login(shell, tmp_path, framed(body, token, helper=False, stdin_mark=False))
    assert proc.returncode == -9
    frame, _ = parsed(proc, token)
    assert frame.problem() is None  # the end frame came first


@pytest.mark.parametrize("shell", SHELLS)
def test_a_script_on_stdin_arrives_whole_after_the_mark(shell: str, tmp_path: Path) -> None:
    token = new_token()
    command = framed(
        wrap("", sudo=False, timeout_s=None, script=True), token, helper=True, stdin_mark=True
    )
    script = 'echo first\necho "helper=$FLEET_NODE_HELPER"\n'
    proc = login(shell, tmp_path, command, stdin=f"{STDIN_MARK} {token}\n{script}")
    frame, got = parsed(proc, token)
    assert proc.returncode == 0, proc.stderr
    assert got["stdout"] == ["first", "helper=1"]
    assert frame.problem() is None


def test_an_rc_file_that_eats_stdin_runs_nothing_and_says_so(tmp_path: Path) -> None:
    token = new_token()
    rc = tmp_path / "eats"
    rc.write_text("IFS= read -r eaten\n")
    command = framed(
        wrap("", sudo=False, timeout_s=None, script=True), token, helper=False, stdin_mark=True
    )
    proc = subprocess.run(
        ["bash", "-c", command],
        input=f"{STDIN_MARK} {token}\necho ran\n".encode(),
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "BASH_ENV": str(rc)},
        timeout=20,
        check=False,
    )
    frame, got = parsed(proc, token)
    assert got["stdout"] == []
    assert "stdin" in (frame.problem() or "")


# ------------------------------------------------------------------------ the warning, once


def test_the_noise_warning_is_said_once_per_host_across_runs_escaped_and_bounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleet.core.events import ShellNoiseIgnored
    from fleet.engine.runner import NoiseWarnings

    warned: set[str] = set()
    lines = ("Welcome \x1b]0;pwned\x07", "facts 1", "end", "more", "and more")
    for _ in range(2):  # a verb's second run (launch: preflight, then start) says nothing new
        handler = NoiseWarnings(warned)
        for host in ("gpu01", "gpu02", "gpu01"):
            handler.handle(ShellNoiseIgnored(host=host, step="s", lines=lines, count=9))
        handler.close()
    err = capsys.readouterr().err.splitlines()
    assert [x.split(":")[2].strip() for x in err] == ["gpu01", "gpu02"]
    assert "\x1b" not in err[0]
    assert "Welcome \\x1b]0;pwned\\x07 | facts 1 | end (and 6 more)" in err[0]


def test_late_output_is_said_as_a_leftover_s_not_an_rc_file_s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleet.core.events import LateOutputIgnored, ShellNoiseIgnored
    from fleet.engine.runner import NoiseWarnings

    handler = NoiseWarnings(set(), set())
    handler.handle(LateOutputIgnored(host="gpu01", step="s", lines=("bg1", "bg2"), count=20))
    handler.handle(ShellNoiseIgnored(host="gpu01", step="s", lines=("Welcome",), count=1))
    handler.handle(LateOutputIgnored(host="gpu01", step="t", lines=("bg1",), count=3))
    handler.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "20 lines came after fleet's command had ended" in err[0]
    assert "background process" in err[0]
    assert "bashrc" not in err[0]
    assert "bg1 | bg2 (and 18 more)" in err[0]
    assert "the login shell printed 1 line" in err[1]


def test_the_stdout_end_line_carries_the_status_and_only_a_real_one_counts() -> None:
    stdout = f"\n{marker(TOKEN, BEGIN)}\nout\n\n{marker(TOKEN, END)} 143\nafter"
    _, frame, got = read({"stdout": stdout, "stderr": framed_output("")})
    assert frame.status == 143
    assert got["stdout"] == ["out"]
    assert frame.problem() is None

    for tail in ("", " ", " x", " 1234", " -1", " ١٢"):  # none of these is a status
        text = f"\n{marker(TOKEN, BEGIN)}\nout\n{marker(TOKEN, END)}{tail}\n"
        _, frame, got = read({"stdout": text, "stderr": framed_output("")})
        assert frame.status is None, tail
        closed = tail == ""
        assert (frame.problem() is None) is closed, tail
        assert got["stdout"] == (["out"] if closed else ["out", f"{marker(TOKEN, END)}{tail}"])


def test_the_frame_reports_the_commands_own_status_on_a_real_shell() -> None:
    for body, status in (("true", 0), ("exit 7", 7), ("kill -TERM $$", 143)):
        step = wrap(body, sudo=False, timeout_s=None, script=False)
        text = framed(step, TOKEN, helper=False, stdin_mark=False)
        done = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=False)
        _, frame, _ = read({"stdout": done.stdout, "stderr": done.stderr})
        assert frame.status == status, (body, done.stdout)
