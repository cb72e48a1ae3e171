"""Shell text: every value is quoted unless the template opts out, and the remote wrapper is a real
POSIX sh command (checked here by running it through the local /bin/sh)."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.shell import (
    KILL_AFTER_S,
    PID_MARKER,
    STDIN_FOLLOWS,
    BadTemplate,
    UndefinedVariable,
    kill_command,
    names_in,
    quote,
    render,
    to_text,
    wrap,
)

SH = "/bin/sh"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def sh(
    script: str, *, stdin: str = "", env: dict[str, str] | None = None, timeout_s: float = 10
) -> Ran:
    """Run `script` with the real /bin/sh; bounded so a hung command fails the test, never hangs it.

    Bytes in and out: text mode would translate a `\r` the shell printed into `\n`.
    """
    result = subprocess.run(
        [SH, "-c", script],
        input=stdin.encode(),
        capture_output=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    return Ran(result.returncode, result.stdout.decode(), result.stderr.decode())


def printed(value: str) -> str:
    """What the shell makes of one rendered `${v}`: printf it back."""
    result = sh("printf '%s' " + render("${v}", {"v": value}))
    assert result.returncode == 0, result.stderr
    return result.stdout


# ---------------------------------------------------------------- quoting

NASTY = [
    "a; touch /tmp/pwned",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "line1\nline2",
    "it's",
    'say "hi"',
    "two  spaces ",
    "",
    "*",
    "~",
    "$HOME",
    "${HOME}",
    "a|b&c>d<e",
    "-n",
    "\\",
    "\t",
    "é ü ☃",
]


@pytest.mark.parametrize("value", NASTY)
def test_rendered_value_reaches_the_shell_as_one_exact_word(value: str) -> None:
    assert printed(value) == value


@pytest.mark.parametrize("value", NASTY)
def test_rendered_value_is_a_single_shell_word(value: str) -> None:
    result = sh("set -- " + render("${v}", {"v": value}) + '; printf "%s" "$#"')
    assert result.stdout == "1"


def test_plain_words_are_not_decorated_with_quotes() -> None:
    assert render("docker kill ${name}", {"name": "trainer-1"}) == "docker kill trainer-1"


def test_every_occurrence_is_rendered() -> None:
    assert render("${a}-${b}-${a}", {"a": "x y", "b": 1}) == "'x y'-1-'x y'"


def test_scalars_render_as_an_operator_writes_them() -> None:
    assert render(
        "${t} ${f} ${n} ${i} ${x}", {"t": True, "f": False, "n": None, "i": 3, "x": 0.5}
    ) == ("true false '' 3 0.5")
    assert to_text(True) == "true"


def test_list_becomes_separately_quoted_words() -> None:
    rendered = render("ls ${paths}", {"paths": ["/tmp/a b", "/dev/shm/torch_*", 7]})
    assert rendered == "ls '/tmp/a b' '/dev/shm/torch_*' 7"
    assert quote(("x", "y z")) == "x 'y z'"


def test_list_words_survive_the_shell_exactly() -> None:
    words = ["a b", "$(x)", "", "it's"]
    result = sh("printf '<%s>' " + render("${w}", {"w": words}))
    assert result.stdout == "<a b><$(x)><><it's>"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("torchrun", ["torchrun"]),
        (
            "/opt/venv/bin/python -m torch.distributed.run",
            ["/opt/venv/bin/python", "-m", "torch.distributed.run"],
        ),
        ("'/opt/my venv/bin/torchrun' --no-python", ["/opt/my venv/bin/torchrun", "--no-python"]),
        (
            ["/opt/my venv/bin/python", "-m", "x; rm -rf /"],
            ["/opt/my venv/bin/python", "-m", "x; rm -rf /"],
        ),
        ("run $(id) `id`", ["run", "$(id)", "`id`"]),
    ],
)
def test_words_filter_splits_a_string_like_the_shell_and_quotes_every_word(
    value: object, words: list[str]
) -> None:
    result = sh(
        "for w in " + render("${v|words}", {"v": value}) + "; do printf '<%s>' \"$w\"; done"
    )
    assert result.stdout == "".join(f"<{w}>" for w in words)


def test_words_filter_refuses_unbalanced_quotes() -> None:
    with pytest.raises(BadTemplate, match="'launcher' = \"'/opt/x\" is not valid shell words"):
        render("${launcher|words}", {"launcher": "'/opt/x"})


def test_raw_filter_inserts_shell_text_unquoted() -> None:
    assert render("${cmd|raw}", {"cmd": "echo a; echo b"}) == "echo a; echo b"
    assert render("x ${l|raw}", {"l": ["a", "b c", True]}) == "x a b c true"


def test_opt_filter_repeats_the_flag_before_each_quoted_value() -> None:
    rendered = render("kill ${p|opt:--pattern}", {"p": ["torchrun", r"train\.py"]})
    assert rendered == r"kill --pattern torchrun --pattern 'train\.py'"


def test_opt_filter_on_a_scalar_and_an_empty_list() -> None:
    assert render("${p|opt:-p}", {"p": "a b"}) == "-p 'a b'"
    assert render("x ${p|opt:--path}", {"p": []}) == "x "


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, "--force"), ("yes", "--force"), ("on", "--force"), ("1", "--force"), (1, "--force")],
)
def test_flag_filter_is_the_flag_when_true(value: object, expected: str) -> None:
    assert render("${f|flag:--force}", {"f": value}) == expected


@pytest.mark.parametrize("value", [False, "false", "no", "0", "", None, 0])
def test_flag_filter_is_nothing_when_false(value: object) -> None:
    assert render("rm ${f|flag:--force}", {"f": value}) == "rm "


def test_default_filter_applies_only_when_undefined() -> None:
    assert render("${port|default:39500}", {}) == "39500"
    assert render("${port|default:39500}", {"port": 2}) == "2"


def test_default_value_is_quoted_too() -> None:
    assert render("${x|default:a b;c}", {}) == "'a b;c'"


def test_default_combines_with_opt() -> None:
    assert render("${p|default:torchrun|opt:--pattern}", {}) == "--pattern torchrun"


def test_double_dollar_brace_writes_a_literal_placeholder() -> None:
    assert render("echo $${HOME} ${x}", {"x": "y"}) == "echo ${HOME} y"
    assert names_in("echo $${HOME} ${x}") == ["x"]


def test_plain_dollar_variables_are_left_for_the_shell() -> None:
    assert render('echo "$HOME" $1 $$', {}) == 'echo "$HOME" $1 $$'


def test_names_in_lists_variables_in_order() -> None:
    assert names_in("${a} ${b|raw} ${a|opt:--x}") == ["a", "b", "a"]


def test_undefined_variable_names_the_variable() -> None:
    with pytest.raises(UndefinedVariable) as info:
        render("echo ${here} ${missing}", {"here": 1})
    assert info.value.name == "missing"


def test_undefined_variable_is_raised_even_with_other_filters() -> None:
    with pytest.raises(UndefinedVariable):
        render("${p|opt:--pattern}", {})


@pytest.mark.parametrize(
    ("template", "value"),
    [("echo ${x}", "a\0b; touch /tmp/p"), ("echo ${x|raw}", "a\0b"), ("f ${x|opt:--y}", ["\0"])],
)
def test_a_value_holding_a_nul_is_refused(template: str, value: object) -> None:
    """sshd gives the command to the login shell as a C string: a NUL would end it there, with
    the frame cut off (the run then blamed the node's rc file)."""
    with pytest.raises(BadTemplate, match="'x' holds a NUL byte"):
        render(template, {"x": value})


def test_a_command_holding_a_nul_is_refused() -> None:
    with pytest.raises(BadTemplate, match="holds a NUL byte"):
        render("echo a\0b", {})


def test_unknown_filter_is_a_bad_template_naming_it() -> None:
    with pytest.raises(BadTemplate, match="upper"):
        render("${x|upper}", {"x": "a"})


@pytest.mark.parametrize("template", ["${x|raw|bogus}", "${x|opt:--a|bogus}", "${x|bogus|raw}"])
def test_unknown_filter_anywhere_in_the_chain_is_refused(template: str) -> None:
    """A typo after a filter that ends the chain must not be silently ignored."""
    with pytest.raises(BadTemplate, match="bogus"):
        render(template, {"x": "a"})


@pytest.mark.parametrize(
    "template",
    [
        "${x|opt:; rm -rf /}",
        "${x|opt:--a b}",
        "${x|opt:}",
        "${x|flag:$(reboot)}",
        "${x|flag:---}",
        "${x|opt:--a=$(id)}",
    ],
)
def test_flag_must_be_a_plain_flag(template: str) -> None:
    with pytest.raises(BadTemplate, match="not a plain --flag"):
        render(template, {"x": "a"})


@pytest.mark.parametrize("template", ["echo ${port", "echo ${port:-1}"])
def test_malformed_placeholder_is_refused_not_passed_to_the_shell(template: str) -> None:
    """`${` starts a placeholder (`$${` is the literal); a broken one must not reach the node
    verbatim, where the remote shell would expand it from its own environment."""
    with pytest.raises(BadTemplate):
        render(template, {"port": 39500})


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_any_text_round_trips_through_real_sh(value: str) -> None:
    assert printed(value) == value


# ---------------------------------------------------------------- wrap: the remote wrapper


def pid_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(PID_MARKER)]


def test_wrapper_prints_pid_marker_on_stderr_first_and_runs_the_body() -> None:
    result = sh(wrap("echo out; echo err >&2", sudo=False, timeout_s=None, script=False))
    assert result.returncode == 0
    assert result.stdout == "out\n"
    lines = result.stderr.splitlines()
    assert lines[0].startswith(PID_MARKER)
    assert lines[1:] == ["err"]


def test_pid_marker_is_the_pid_the_command_runs_as() -> None:
    """The body is exec'd, so the marked pid is the process fleet must signal."""
    result = sh(wrap('echo "$$"', sudo=False, timeout_s=None, script=False))
    (marker,) = pid_lines(result.stderr)
    assert marker == f"{PID_MARKER}{result.stdout.strip()}"


def test_wrapper_passes_the_exit_code_through() -> None:
    assert sh(wrap("exit 7", sudo=False, timeout_s=None, script=False)).returncode == 7
    assert sh(wrap("exit 3", sudo=False, timeout_s=30, script=False)).returncode == 3


def test_wrapper_body_is_one_quoted_argument() -> None:
    body = render("printf '%s' ${v}", {"v": "a'b; $(echo no)"})
    result = sh(wrap(body, sudo=False, timeout_s=None, script=False))
    assert result.stdout == "a'b; $(echo no)"


def test_deadline_kills_the_command_on_the_node() -> None:
    started = time.monotonic()
    result = sh(wrap("sleep 30", sudo=False, timeout_s=0.5, script=False), timeout_s=10)
    elapsed_s = time.monotonic() - started
    assert result.returncode == 124
    assert elapsed_s < 5
    assert pid_lines(result.stderr)


def test_deadline_kills_the_whole_process_group() -> None:
    """A grandchild holding stdout open would keep the pipe (and the SSH channel) alive."""
    started = time.monotonic()
    result = sh(wrap("sleep 30 & sleep 30; wait", sudo=False, timeout_s=0.5, script=False))
    assert result.returncode == 124
    assert time.monotonic() - started < 5


def test_fractional_and_integer_deadlines_are_written_for_timeout() -> None:
    assert "timeout -k 5 0.500 " in wrap("x", sudo=False, timeout_s=0.5, script=False)
    assert "timeout -k 5 60 " in wrap("x", sudo=False, timeout_s=60.0, script=False)
    assert "timeout" not in wrap("x", sudo=False, timeout_s=None, script=False)


@pytest.mark.parametrize("tiny", [0.0004, 0.0001, 1e-9, 5e-324])
def test_a_tiny_deadline_is_never_written_as_none(tiny: float) -> None:
    """`timeout 0` means no limit: 0.0001 s printed as 0.000 let the step run unbounded."""
    command = wrap("x", sudo=False, timeout_s=tiny, script=False)
    assert f"timeout -k {KILL_AFTER_S} 0.001 " in command


def test_a_tiny_deadline_is_enforced() -> None:
    result = sh(wrap("sleep 3; echo done", sudo=False, timeout_s=0.0001, script=False))
    assert result.returncode == 124
    assert "done" not in result.stdout


def test_script_mode_feeds_the_script_on_stdin_with_rendered_args() -> None:
    body = render("kill ${p|opt:--pattern} --grace ${g}", {"p": ["a b", "$(x)"], "g": 10})
    script = 'printf "<%s>\\n" "$@"\n'
    result = sh(wrap(body, sudo=False, timeout_s=5, script=True), stdin=script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "<kill>",
        "<--pattern>",
        "<a b>",
        "<--pattern>",
        "<$(x)>",
        "<--grace>",
        "<10>",
    ]
    assert pid_lines(result.stderr)


@pytest.fixture
def shims(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A PATH with fake `id` and `sudo`: sudo logs its argv and the password line, then runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(
        "#!/bin/sh\n"
        'printf "%s\\n" "$@" > "$SHIM_DIR/sudo.args"\n'
        'case " $* " in *" -S "*)\n'
        '  IFS= read -r pw; printf "%s" "$pw" > "$SHIM_DIR/sudo.pw" ;;\n'
        "esac\n"
        'case " $* " in *" -v "*) exit 0 ;; esac\n'
        'while [ "$1" != "--" ]; do shift; done; shift\n'
        'exec "$@"\n'
    )
    (bin_dir / "sudo").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SHIM_DIR=str(tmp_path))
    return bin_dir, env


def fake_uid(bin_dir: Path, uid: int) -> None:
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "id").chmod(0o755)


def test_sudo_step_as_non_root_runs_under_non_interactive_sudo(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = shims
    fake_uid(bin_dir, 1000)
    result = sh(wrap("echo ran", sudo=True, timeout_s=None, script=False), env=env)
    assert result.stdout == "ran\n"
    assert (tmp_path / "sudo.args").read_text().splitlines()[:2] == ["-n", "--"]
    assert pid_lines(result.stderr)


def test_sudo_password_is_read_by_sudo_not_the_step(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = shims
    fake_uid(bin_dir, 1000)
    command = wrap("cat", sudo=True, timeout_s=None, script=False, password_on_stdin=True)
    result = sh(command, stdin=f"s3cret\n{STDIN_FOLLOWS}\nstep input\n", env=env)
    assert (tmp_path / "sudo.pw").read_text() == "s3cret"
    assert result.stdout == "step input\n"


def test_a_wrong_K_password_is_tried_once_and_no_other_line_is_offered_as_one(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """sudo -S reads another line after a wrong password (passwd_tries, 3 by default): it must
    find none, or STDIN_FOLLOWS and a script's first line count as two more failed attempts (and
    pam_faillock locks the account on every node)."""
    bin_dir, env = shims
    fake_uid(bin_dir, 1000)
    (bin_dir / "sudo").write_text(
        "#!/bin/sh\n"
        "n=0\n"
        "while [ $n -lt 3 ] && IFS= read -r pw; do\n"
        '  echo "$pw" >> "$SHIM_DIR/sudo.tries"\n'
        '  [ "$pw" = right ] && break\n'
        "  n=$((n+1)); pw=\n"
        "done\n"
        '[ "$pw" = right ] || { echo "sudo: $n incorrect password attempts" >&2; exit 1; }\n'
        'case " $* " in *" -v "*) exit 0 ;; esac\n'
        'while [ "$1" != "--" ]; do shift; done; shift\n'
        'exec "$@"\n'
    )
    command = wrap("cat", sudo=True, timeout_s=None, script=True, password_on_stdin=True)
    result = sh(command, stdin=f"wrong\n{STDIN_FOLLOWS}\necho step ran\n", env=env)
    assert result.returncode == 1
    assert (tmp_path / "sudo.tries").read_text() == "wrong\n"
    assert "step ran" not in result.stdout
    (tmp_path / "sudo.tries").unlink()
    result = sh(command, stdin=f"right\n{STDIN_FOLLOWS}\necho step ran\n", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "step ran\n"
    assert "right" not in result.stdout + result.stderr


def test_with_nopasswd_sudo_the_unread_password_never_reaches_the_step(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """sudo with NOPASSWD does not read the password line: the wrapper must skip it."""
    bin_dir, env = shims
    fake_uid(bin_dir, 1000)
    (bin_dir / "sudo").write_text(
        '#!/bin/sh\ncase " $* " in *" -v "*) exit 0 ;; esac\n'
        'while [ "$1" != "--" ]; do shift; done; shift\nexec "$@"\n'
    )
    command = wrap("cat", sudo=True, timeout_s=None, script=False, password_on_stdin=True)
    result = sh(command, stdin=f"s3cret\n{STDIN_FOLLOWS}\nstep input\n", env=env)
    assert result.stdout == "step input\n"
    assert "s3cret" not in result.stdout + result.stderr


def test_sudo_step_as_root_runs_directly(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = shims
    fake_uid(bin_dir, 0)
    result = sh(wrap("echo ran", sudo=True, timeout_s=None, script=False), env=env)
    assert result.stdout == "ran\n"
    assert not (tmp_path / "sudo.args").exists()


def test_as_root_the_password_line_never_reaches_the_step(
    shims: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = shims
    fake_uid(bin_dir, 0)
    command = wrap("cat", sudo=True, timeout_s=None, script=False, password_on_stdin=True)
    result = sh(command, stdin=f"s3cret\n{STDIN_FOLLOWS}\nstep input\n", env=env)
    assert result.stdout == "step input\n"
    assert "s3cret" not in result.stdout + result.stderr


def test_kill_command_stops_a_wrapped_command_and_its_group() -> None:
    """Start a wrapped `sleep`, read its pid marker, run kill_command: everything exits promptly."""
    proc = subprocess.Popen(
        [SH, "-c", wrap("sleep 30 & sleep 30", sudo=False, timeout_s=60, script=False)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as under sshd: the wrapper leads its own session and group
    )
    try:
        assert proc.stderr is not None
        marker = proc.stderr.readline()
        assert marker.startswith(PID_MARKER)
        pid = int(marker[len(PID_MARKER) :])
        # Reap the wrapped command while the killer polls it (a zombie still answers `kill -0`).
        killer = subprocess.Popen([SH, "-c", kill_command(pid)])
        proc.communicate(timeout=10)
        assert killer.wait(timeout=10) == 0
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_mapping_inside_a_value_is_rendered_as_json_not_pythons_repr() -> None:
    """A mapping is NAME=VALUE words (`env ${env} cmd`); a mapping inside it, or inside a list
    (a DeepSpeed config in the inventory), reaches the step as JSON a node's tools read, one
    quoted word, not Python's repr ({'stage': 3}, which no parser takes)."""
    env = {"CFG": {"zero_optimization": {"stage": 3}, "note": "it's"}, "N": 2}
    got = shlex.split(render("env ${e} run", {"e": env}))
    assert got == ["env", 'CFG={"zero_optimization":{"stage":3},"note":"it\'s"}', "N=2", "run"]
    got = shlex.split(render("${l}", {"l": [{"a": 1}, {"b": None, "c": True}]}))
    assert got == ['{"a":1}', '{"b":null,"c":true}']
    assert json.loads(got[1]) == {"b": None, "c": True}
    # a YAML date inside it is its text
    assert to_text({"d": datetime.date(2026, 1, 2)}) == '{"d":"2026-01-02"}'
