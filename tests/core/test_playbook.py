"""Playbooks: steps as data, validated up front; every error names the file, the place and a fix."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.errors import ExitCode, PlaybookError
from fleet.core.playbook import (
    _PLAYBOOK_KEYS,
    _STEP_KEYS,
    PACKAGE_DIR,
    OnError,
    Playbook,
    adhoc,
    builtin_dir,
    builtin_names,
    load_playbook,
    load_shipped,
)
from fleet.core.shell import render

Load = Callable[[str], Playbook]

MINIMAL = """\
name: show
steps:
  - name: list gpus
    run: nvidia-smi -L
"""


def raises_at(load: Load, text: str, *, line: int | None, place: str) -> PlaybookError:
    """Load `text`, expecting a PlaybookError at `file:line: place` (no line for a missing key)."""
    with pytest.raises(PlaybookError) as info:
        load(text)
    error = info.value
    at = f"book\\.yaml:{line}" if line else r"book\.yaml"
    assert re.search(rf"{at}: {re.escape(place)}: ", error.message), error.message
    assert error.hint.strip()
    assert error.exit_code is ExitCode.FLEET_ERROR
    return error


# ---------------------------------------------------------------- the shipped cleanup playbook


def test_cleanup_is_shipped() -> None:
    assert "cleanup" in builtin_names()
    assert (builtin_dir() / "cleanup.yaml").is_file()


def test_cleanup_parses_into_one_step() -> None:
    pb = load_playbook("cleanup")
    assert pb.name == "cleanup"
    assert pb.confirm is True
    assert pb.description
    assert [s.name for s in pb.steps] == ["clean node"]


def test_cleanup_step_is_the_cleanup_op_under_sudo_with_a_deadline() -> None:
    (step,) = load_playbook("cleanup").steps
    assert step.op == "cleanup"
    assert step.script is None
    assert step.sudo is True
    assert step.timeout_s is not None
    assert step.timeout_s > 0


def test_cleanup_default_vars() -> None:
    v = load_playbook("cleanup").vars
    assert v["patterns"] == ["torchrun", r"train\.py"]
    assert v["grace"] == 10
    assert v["port"] == 39500
    assert v["kill_gpu_holders"] is False
    assert "/dev/shm/torch_*" in v["state_paths"]


def test_cleanup_and_preflight_look_for_what_torch_leaves() -> None:
    # the seed's paths, and what torchrun, DataLoader workers, torch_shm_manager, NCCL and
    # inductor leave on a node (docs/guides/cleanup.md); preflight warns about the same list
    # less what every clean run leaves (torchrun's log dirs, inductor's cache)
    seed = ["/tmp/.torch_distributed_*", "/dev/shm/torch_*", "/tmp/cuda_*", "~/.nv"]
    torch = ["/tmp/torchelastic_*", "/tmp/pymp-*", "/tmp/torch-shm-dir-*", "/dev/shm/sem.mp-*"]
    torch += ["/dev/shm/nccl-*", "/tmp/watchdog_timer_*", "/tmp/torchinductor_*"]
    cleanup = load_playbook("cleanup").vars["state_paths"]
    assert cleanup == seed + torch
    every_run = {"/tmp/torchelastic_*", "/tmp/torchinductor_*"}
    assert load_playbook("preflight").vars["state_paths"] == [
        p for p in cleanup if p not in every_run
    ]


def test_cleanup_reads_its_own_defaults() -> None:
    from fleet.node.ops import cleanup_spec

    pb = load_playbook("cleanup")
    spec = cleanup_spec(pb.vars)
    assert [p.source for p in spec.patterns] == ["torchrun", r"train\.py"]
    assert (spec.grace_s, spec.port, spec.kill_gpu_holders) == (10, 39500, False)
    assert spec.state_paths == tuple(pb.vars["state_paths"])
    assert (spec.allow_any_path, spec.max_kill_share) == (False, 0.5)


def test_a_name_with_a_yaml_suffix_is_a_file_not_a_shipped_playbook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_playbook("cleanup").name == "cleanup"
    with pytest.raises(PlaybookError, match=r"'cleanup\.yaml': no such file"):
        load_playbook("cleanup.yaml")


@pytest.mark.parametrize("verb", ["status", "logs", "preflight", "stop", "cleanup", "janitor"])
def test_a_file_in_the_working_directory_never_replaces_a_shipped_playbook(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """A YAML file called `status` planted in the cwd made `fleet status` run its command as
    root: a bare name is always the shipped playbook (as `ansible-playbook` takes a path)."""
    path = write(verb, MINIMAL)
    write(f"{verb}.yaml", MINIMAL)
    monkeypatch.chdir(path.parent)
    assert load_playbook(verb).path == builtin_dir() / f"{verb}.yaml"
    assert load_shipped(verb).path == builtin_dir() / f"{verb}.yaml"
    assert load_playbook(verb).name != "show"


def test_a_script_named_like_a_verb_does_not_break_it(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write("kill-docker", "#!/bin/sh\nexit 0\n")
    monkeypatch.chdir(path.parent)
    assert load_shipped("kill-docker").name == "kill-docker"


@pytest.mark.parametrize("spelling", ["./cleanup", "book.yaml", "book.yml", "./book.yaml"])
def test_a_path_the_operator_wrote_is_a_file(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    path = write(spelling.removeprefix("./"), MINIMAL)
    monkeypatch.chdir(path.parent)
    assert load_playbook(spelling).name == "show"
    assert load_playbook(str(path)).name == "show"


def test_a_missing_path_is_not_looked_up_among_shipped_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlaybookError, match="no such file") as info:
        load_playbook("./cleanup")
    assert "./" in info.value.hint or "shipped" in info.value.hint


def test_an_unknown_bare_name_says_how_to_name_a_file() -> None:
    with pytest.raises(PlaybookError, match="no shipped playbook") as info:
        load_playbook("mybook")
    assert "./mybook" in info.value.hint


# ---------------------------------------------------------------- parsing


def test_minimal_playbook_defaults(playbook: Load) -> None:
    pb = playbook(MINIMAL)
    (step,) = pb.steps
    assert (step.name, step.run, step.sudo, step.timeout_s, step.on_error) == (
        "list gpus",
        "nvidia-smi -L",
        False,
        None,
        OnError.STOP,
    )
    assert step.script is None
    assert pb.confirm is False
    assert pb.vars == {}


def test_name_defaults_to_file_stem(playbook: Load) -> None:
    assert playbook("steps: [{name: a, run: b}]\n").name == "book"


def test_step_fields(playbook: Load) -> None:
    pb = playbook(
        """\
        name: x
        vars: {port: 1}
        steps:
          - name: free port
            run: fuser -k ${port}/tcp
            sudo: true
            timeout: 2.5
            on_error: continue
        """
    )
    (step,) = pb.steps
    assert (step.sudo, step.timeout_s, step.on_error) == (True, 2.5, OnError.CONTINUE)
    assert pb.vars == {"port": 1}


def test_script_is_found_beside_the_playbook(write: Callable[[str, str], Path]) -> None:
    write("helper.sh", "#!/bin/sh\necho helper\n")
    path = write("book.yaml", "name: x\nsteps:\n  - name: a\n    script: helper.sh\n")
    (step,) = load_playbook(str(path)).steps
    assert step.script == "#!/bin/sh\necho helper\n"
    assert step.script_name == "helper.sh"
    assert step.run == ""


@pytest.mark.parametrize("name", ["/etc/hostname", "../secret.sh", "sub/../../secret.sh"])
def test_script_must_stay_in_the_playbooks_directory(tmp_path: Path, name: str) -> None:
    """`script:` could send any file the operator can read (a private key) to the nodes."""
    (tmp_path / "secret.sh").write_text("echo secret\n")
    book = tmp_path / "books" / "book.yaml"
    (book.parent / "sub").mkdir(parents=True)
    book.write_text(f"name: x\nsteps:\n  - name: leak\n    script: {name}\n")
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(book))
    message = info.value.message
    assert re.search(r"book\.yaml:4: steps\.0\.script: ", message), message
    assert name in message
    assert "outside" in message
    assert "secret" not in message.replace(name, "")


def test_script_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "id_rsa").write_text("PRIVATE KEY\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "key.sh").symlink_to(tmp_path / "id_rsa")
    (books / "book.yaml").write_text("name: x\nsteps:\n  - name: leak\n    script: key.sh\n")
    with pytest.raises(PlaybookError, match=r"book\.yaml:4: steps\.0\.script: .*key\.sh.*outside"):
        load_playbook(str(books / "book.yaml"))


def test_script_symlink_inside_the_directory_is_fine(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "real.sh").write_text("echo ok\n")
    (tmp_path / "step.sh").symlink_to(tmp_path / "lib" / "real.sh")
    (tmp_path / "book.yaml").write_text("name: x\nsteps:\n  - {name: a, script: step.sh}\n")
    (step,) = load_playbook(str(tmp_path / "book.yaml")).steps
    assert step.script == "echo ok\n"


@pytest.mark.parametrize("form", ["# fleet:source {}", "# fleet:include {} as KEY"])
def test_an_include_may_not_lead_out_either(tmp_path: Path, form: str) -> None:
    (tmp_path / "id_rsa").write_text("PRIVATE KEY\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "lib.sh").symlink_to(tmp_path / "id_rsa")
    (books / "step.sh").write_text(form.format("lib.sh") + "\necho hi\n")
    (books / "book.yaml").write_text("name: x\nsteps:\n  - name: a\n    script: step.sh\n")
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(books / "book.yaml"))
    message = info.value.message
    assert re.search(r"book\.yaml:4: steps\.0\.script: step\.sh: .*lib\.sh.*outside", message)
    assert "PRIVATE" not in message


def test_a_script_that_is_not_utf8_is_a_playbook_error(tmp_path: Path) -> None:
    (tmp_path / "step.sh").write_bytes(b"echo \xff\n")
    (tmp_path / "book.yaml").write_text("name: x\nsteps:\n  - name: a\n    script: step.sh\n")
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(tmp_path / "book.yaml"))
    message = info.value.message
    assert re.search(r"book\.yaml:4: steps\.0\.script: script 'step\.sh' is not UTF-8", message)
    assert "codec" not in message
    assert "include" not in info.value.hint


def test_a_script_fleet_cannot_read_is_a_playbook_error_not_an_internal_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's script another user left mode 600 (root reads any file: so simulated)."""
    (tmp_path / "step.sh").write_text("echo hi\n")
    (tmp_path / "book.yaml").write_text("name: x\nsteps:\n  - name: a\n    script: step.sh\n")
    real = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "step.sh":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(tmp_path / "book.yaml"))
    message = info.value.message
    assert re.search(r"book\.yaml:4: steps\.0\.script: script 'step\.sh' cannot be read", message)
    assert "Permission denied" in message


def test_every_shipped_playbook_still_loads_its_scripts() -> None:
    for name in builtin_names():
        assert load_shipped(name).steps


def test_script_falls_back_to_fleets_own(playbook: Load) -> None:
    (step,) = playbook("name: x\nsteps:\n  - {name: a, script: status.sh, run: gpus}\n").steps
    assert step.script_name == "status.sh"
    assert step.run == "gpus"


def test_adhoc_command_is_shell_text_not_a_template() -> None:
    pb = adhoc('echo "${HOME}" $((1+1))', sudo=True, timeout_s=5)
    (step,) = pb.steps
    assert render(step.run, {}) == 'echo "${HOME}" $((1+1))'
    assert (step.sudo, step.timeout_s) == (True, 5)


# ---------------------------------------------------------------- validation errors


def test_unknown_top_level_key(playbook: Load) -> None:
    error = raises_at(playbook, MINIMAL + "stpes: []\n", line=5, place="stpes")
    assert "unknown key 'stpes'" in error.message
    assert "steps" in error.hint


def test_unknown_step_key_lists_the_allowed_ones(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    run: b\n    sudoo: true\n"
    error = raises_at(playbook, text, line=5, place="steps.0.sudoo")
    assert "sudo" in error.hint
    assert "on_error" in error.hint


def test_every_key_a_playbook_may_have_is_in_the_reference() -> None:
    """The hint for an unknown key lists them all: the reference says what each one does."""
    text = (PACKAGE_DIR.parent / "docs" / "reference" / "playbooks.md").read_text(encoding="utf-8")
    for key in sorted(_STEP_KEYS | _PLAYBOOK_KEYS):
        assert f"`{key}" in text, key


def test_missing_step_name(playbook: Load) -> None:
    raises_at(
        playbook, "name: x\nsteps:\n  - {name: a, run: b}\n  - run: c\n", line=4, place="steps.1"
    )


def test_blank_step_name(playbook: Load) -> None:
    raises_at(playbook, "name: x\nsteps:\n  - name: '  '\n    run: b\n", line=3, place="steps.0")


def test_missing_run(playbook: Load) -> None:
    error = raises_at(playbook, "name: x\nsteps:\n  - name: a\n", line=3, place="steps.0.run")
    assert "'a'" in error.message


@pytest.mark.parametrize("run", ["''", "[a, b]", "5"])
def test_run_must_be_a_non_empty_string(playbook: Load, run: str) -> None:
    raises_at(
        playbook, f"name: x\nsteps:\n  - name: a\n    run: {run}\n", line=4, place="steps.0.run"
    )


@pytest.mark.parametrize(
    "value",
    ["soon", "0", "-1", "true", "[1]", ".nan", ".NaN", ".inf", "-.inf", "{a: 1}", "9" * 400],
)
def test_bad_timeout(playbook: Load, value: str) -> None:
    text = f"name: x\nsteps:\n  - name: a\n    run: b\n    timeout: {value}\n"
    error = raises_at(playbook, text, line=5, place="steps.0.timeout")
    assert "positive number of seconds" in error.message


@pytest.mark.parametrize(("value", "said"), [(".nan", ".nan"), (".inf", ".inf"), ("-2.5", "-2.5")])
def test_a_bad_timeout_is_shown_as_written(playbook: Load, value: str, said: str) -> None:
    text = f"name: x\nsteps:\n  - name: a\n    run: b\n    timeout: {value}\n"
    error = raises_at(playbook, text, line=5, place="steps.0.timeout")
    assert error.message.endswith(f"got {said}")


def test_a_tiny_timeout_is_kept(playbook: Load) -> None:
    """Enforced as 1 ms on the node (fleet.core.shell), never read as none."""
    text = "name: x\nsteps:\n  - name: a\n    run: b\n    timeout: 1.0e-9\n"
    assert playbook(text).steps[0].timeout_s == 1e-9


@pytest.mark.parametrize("value", ["ignore", "true", "Stop", "[stop]", "{stop: 1}", "1"])
def test_bad_on_error(playbook: Load, value: str) -> None:
    text = f"name: x\nsteps:\n  - name: a\n    run: b\n    on_error: {value}\n"
    error = raises_at(playbook, text, line=5, place="steps.0.on_error")
    assert "stop or continue" in error.message


@pytest.mark.parametrize("value", ["[cleanup]", "{a: 1}", "1", "true", "reboot"])
def test_bad_op(playbook: Load, value: str) -> None:
    """A list or mapping is not hashable: `op not in OPS` raised TypeError (an internal error)."""
    text = f"name: x\nsteps:\n  - name: a\n    op: {value}\n"
    error = raises_at(playbook, text, line=4, place="steps.0.op")
    assert "op must be one of" in error.message


def test_bad_sudo(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    run: b\n    sudo: please\n"
    raises_at(playbook, text, line=5, place="steps.0.sudo")


def test_bad_helper(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    run: b\n    helper: yes please\n"
    raises_at(playbook, text, line=5, place="steps.0.helper")


def test_every_status_step_is_marked_as_fleet_s_own_and_its_command_carries_the_mark() -> None:
    from fleet.core.hosts import Host
    from fleet.engine.plan import build_plan

    status = load_playbook("status")
    assert [step.helper for step in status.steps] == [True] * len(status.steps)
    assert not any(step.helper for step in load_playbook("launch").steps)
    (host_plan,) = build_plan([Host(name="n1", address="10.0.0.1")], status, {}).hosts
    assert all("FLEET_NODE_HELPER=1" in ps.cmd.command for ps in host_plan.steps)


def test_unknown_script(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    script: nope.sh\n"
    error = raises_at(playbook, text, line=4, place="steps.0.script")
    assert "nope.sh" in error.message


@pytest.mark.parametrize("name", ["'rm -rf /'", "'a;b'", "[a]"])
def test_script_must_be_a_file_name(playbook: Load, name: str) -> None:
    raises_at(
        playbook,
        f"name: x\nsteps:\n  - name: a\n    script: {name}\n",
        line=4,
        place="steps.0.script",
    )


def test_unknown_template_filter(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    run: echo ${x|upper}\n"
    error = raises_at(playbook, text, line=4, place="steps.0.run")
    assert "unknown filter 'upper'" in error.message


def test_bad_flag_in_template(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - name: a\n    run: echo ${x|opt:;reboot}\n"
    error = raises_at(playbook, text, line=4, place="steps.0.run")
    assert "not a plain --flag" in error.message


@pytest.mark.parametrize(
    "run",
    [
        'echo "model=${model}"',
        'if [ ${host_index} = 0 ]; then echo "rank 0: ${model|default:x}"; fi',
        "cat > /etc/job.cfg <<EOF\nmodel=${model}\nEOF\nsystemctl restart job",
        "cat > /etc/job.cfg <<-END\n\tmodel=${model}\n\tEND",
    ],
)
def test_a_placeholder_in_double_quotes_or_a_here_document_is_refused(
    playbook: Load, run: str
) -> None:
    """There the value's single quotes are plain text: `$(...)` or backquotes in it would run
    (`"${model}"` with model=$(reboot) ran reboot)."""
    text = f"name: x\nsteps:\n  - name: a\n    run: {json.dumps(run)}\n"
    error = raises_at(playbook, text, line=4, place="steps.0.run")
    assert "double quotes or a here-document" in error.message
    assert "|raw" in error.hint


@pytest.mark.parametrize(
    "run",
    [
        "echo model=${model}",
        'echo "$(hostname) ${model|raw}" ${flag|flag:--on}',
        'echo "$(cat ${file})"',
        "cat > f <<'EOF'\nmodel=${model}\nEOF",
        "echo '\"' ${model} '\"'  # \"${model}\"",
        'echo "$${HOME}"',
    ],
)
def test_a_placeholder_where_its_quoting_holds_is_fine(playbook: Load, run: str) -> None:
    text = f"name: x\nsteps:\n  - name: a\n    run: {json.dumps(run)}\n"
    assert playbook(text).steps[0].run == run


def test_template_error_found_in_a_later_step(playbook: Load) -> None:
    text = "name: x\nsteps:\n  - {name: a, run: b}\n  - name: c\n    run: ${d|nope}\n"
    raises_at(playbook, text, line=5, place="steps.1.run")


def test_undefined_variables_are_not_a_parse_error(playbook: Load) -> None:
    """Their values come from the inventory and --var: checked per host when planning."""
    assert playbook("name: x\nsteps:\n  - {name: a, run: 'echo ${anything}'}\n").steps


@pytest.mark.parametrize(
    ("text", "line", "place"),
    [
        ("name: x\nsteps: []\n", 2, "steps"),
        ("name: x\nsteps: echo\n", 2, "steps"),
        ("name: x\n", None, "steps"),
        ("name: x\nvars: [a]\nsteps:\n  - {name: a, run: b}\n", 2, "vars"),
        ("name: x\nvars: {bad-name: 1}\nsteps:\n  - {name: a, run: b}\n", 2, "vars.bad-name"),
        ("name: ''\nsteps:\n  - {name: a, run: b}\n", 1, "name"),
        ("name: x\nconfirm: maybe\nsteps:\n  - {name: a, run: b}\n", 2, "confirm"),
        ("name: x\ndescription: [a]\nsteps:\n  - {name: a, run: b}\n", 2, "description"),
        ("name: x\nsteps:\n  - echo hi\n", 3, "steps.0"),
    ],
)
def test_bad_playbook_shapes(playbook: Load, text: str, line: int, place: str) -> None:
    raises_at(playbook, text, line=line, place=place)


@pytest.mark.parametrize("text", ["- a\n- b\n", "", "just text\n"])
def test_playbook_must_be_a_mapping(playbook: Load, text: str) -> None:
    with pytest.raises(PlaybookError) as info:
        playbook(text)
    assert "book.yaml" in info.value.message
    assert info.value.hint


def test_malformed_yaml_names_the_line(playbook: Load) -> None:
    with pytest.raises(PlaybookError) as info:
        playbook("name: x\nsteps:\n  - {name: a, run: b\n")
    assert re.search(r"book\.yaml:\d+", info.value.message)
    assert "invalid YAML" in info.value.message
    assert info.value.hint


def test_a_file_that_is_no_yaml_at_all_says_what_to_check_not_fix_the_yaml(
    tmp_path: Path,
) -> None:
    book = tmp_path / "book.yaml"
    book.write_bytes(b"\x7fELF\xff\xfe")
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(book))
    assert "not UTF-8" in info.value.message
    assert "line" not in info.value.hint
    assert "check the path" in info.value.hint


def test_duplicate_step_key(playbook: Load) -> None:
    with pytest.raises(PlaybookError) as info:
        playbook("name: x\nsteps:\n  - name: a\n    run: b\n    run: c\n")
    assert "book.yaml:5" in info.value.message
    assert "duplicate key 'run'" in info.value.message


def test_unknown_playbook_lists_the_shipped_ones() -> None:
    with pytest.raises(PlaybookError) as info:
        load_playbook("no-such-playbook")
    assert "no-such-playbook" in info.value.message
    assert "cleanup" in info.value.hint
