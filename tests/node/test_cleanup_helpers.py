"""The node side's shared shell helpers (fleet/remote/lib.sh), run in each node shell, and how
they reach the scripts: `# fleet:source lib.sh` puts lib.sh's text in place, once."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.errors import PlaybookError
from fleet.core.playbook import load_playbook, remote_dir, shipped_script

SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]
LIB = (remote_dir() / "lib.sh").read_text()


def sh(shell: list[str], program: str, *args: str) -> str:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    result = subprocess.run(
        [*shell, "-c", LIB + program, "sh", *args], capture_output=True, check=True
    )
    return result.stdout.decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_parse_stat_splits_after_the_last_parenthesis_of_comm(shell: list[str]) -> None:
    fields = " ".join(str(n) for n in range(4, 53))
    line = f"42 (a) b\n1 (c) S {fields}"
    out = sh(shell, 'parse_stat "$1" && echo "$PS_STATE $PS_PPID $PS_SID $PS_START|$PS_COMM"', line)
    assert out == "S 4 6 22|a) b\n1 (c\n"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_proc_stat_reads_a_live_process_and_fails_for_a_gone_one(shell: list[str]) -> None:
    out = sh(shell, 'proc_stat $$ && echo "$PS_STATE"; proc_stat 999999999 || echo gone')
    assert out == "R\ngone\n"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_real_path_resolves_directories_but_keeps_a_symlink_itself(
    shell: list[str], tmp_path: Path
) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "dir" / "f").write_text("x")
    real = tmp_path.resolve()
    program = 'for p; do real_path "$p"; printf "%s\\n" "$REAL"; done'
    out = sh(
        shell, program, f"{tmp_path}/to-dir", f"{tmp_path}/to-dir/f", f"{tmp_path}/to-dir/", "/"
    )
    assert out.splitlines() == [f"{real}/to-dir", f"{real}/dir/f", f"{real}/dir", "/"]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
@settings(max_examples=40, deadline=None)
@given(text=st.binary(max_size=200).filter(lambda b: b"\0" not in b))
def test_to_hex_carries_any_bytes(shell: list[str], text: bytes) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    result = subprocess.run(
        [*shell, "-c", LIB + "to_hex; printf '%s' \"$HEX\""], input=text, capture_output=True,
        check=True,
    )  # fmt: skip
    assert result.stdout.decode() == (text.hex() or "-")


# ---------------------------------------------------------------------- how scripts get lib.sh


def test_source_puts_lib_sh_in_place_once_and_include_still_works(tmp_path: Path) -> None:
    (tmp_path / "helper.sh").write_text("# helper\nhelp() { :; }\n")
    (tmp_path / "inner.sh").write_text("# fleet:source helper.sh\necho inner\n")
    (tmp_path / "step.sh").write_text(
        "#!/bin/sh\n# fleet:source helper.sh\n# fleet:source helper.sh\n"
        "# fleet:include inner.sh as INNER\necho step\n"
    )
    (tmp_path / "book.yaml").write_text("name: b\nsteps:\n  - {name: s, script: step.sh}\n")
    (step,) = load_playbook(str(tmp_path / "book.yaml")).steps
    assert step.script is not None
    assert step.script.count("help() { :; }") == 2  # once in the script, once in INNER's text
    assert step.script.startswith("#!/bin/sh\n# helper\nhelp() { :; }\nINNER=$(cat <<'")
    assert "# fleet:source" not in step.script


def test_a_missing_or_looping_source_is_a_playbook_error(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text("# fleet:source b.sh\n")
    (tmp_path / "b.sh").write_text("# fleet:source a.sh\n")
    (tmp_path / "c.sh").write_text("# fleet:source nowhere.sh\n")
    for script, why in (("a.sh", "loop: a.sh -> b.sh -> a.sh"), ("c.sh", "'nowhere.sh' not found")):
        (tmp_path / "book.yaml").write_text(f"name: b\nsteps:\n  - {{name: s, script: {script}}}\n")
        with pytest.raises(PlaybookError, match=re.escape(why)):
            load_playbook(str(tmp_path / "book.yaml"))


def functions(path: Path) -> list[str]:
    return re.findall(r"^([a-z_]+)\(\) \{", path.read_text(), re.M)


def test_the_shipped_scripts_carry_lib_sh_and_define_each_function_once() -> None:
    defined = Counter[str]()
    for name in ("lib.sh", "facts.sh", "act.sh"):
        defined.update(functions(remote_dir() / name))
    assert [name for name, count in defined.items() if count > 1] == []
    own = set(functions(remote_dir() / "facts.sh")) | set(functions(remote_dir() / "act.sh"))
    for other in remote_dir().glob("*.sh"):
        if other.name not in ("lib.sh", "facts.sh", "act.sh"):
            assert own.isdisjoint(functions(other)), other.name
    for name in ("facts.sh", "act.sh"):
        own_text = shipped_script(name).split("FACTS_SH=$(cat <<")[0]  # act.sh carries facts.sh
        assert own_text.count("parse_stat() {") == 1
        assert own_text.count("to_hex() {") == 1
