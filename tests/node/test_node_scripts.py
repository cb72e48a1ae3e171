"""The node-side sh under fleet/ as a whole: each shell function is defined in one script only
(a helper two scripts need lives in fleet/remote/lib.sh, put in place by `# fleet:source
lib.sh`), and all of it stays within the line budget of issue 9."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import fleet

# was 1500; issue 17 added ~120 lines: node state, secrets off argv, who may wear fleet's marks,
# lists of any length; issue 19 added fleet/checkpoints/probe.sh (54 lines: free space, files
# open for writing, sha256, zip CRC); the CRC check's bounds (a member count judged before zipfile
# reads the directory, a 1 GiB address-space cap) added 15, python run from probe.sh; facts.sh
# reports the parent of a process not root's (another user's daemon name is believed only when
# root's daemon started it): 3; and each state path match's owner (another user's hold on a
# path not theirs does not keep it): 1; the janitor counts a file in use only when root, its uid
# or the file's owner holds it: 9; janitor status tells a janitor that died (killed, its dir
# gone, a reboot) from one stopped: 5; `{a,b}` in a glob refused (find matches it literally): 1;
# find's complaints (an unreadable subdirectory) logged once while they last, not every pass: 3;
# a start asking for other globs or min-age than the running janitor's is refused: 5
LINE_BUDGET = 1730
PACKAGE = Path(fleet.__file__).resolve().parent
# `name() {` at the start of a line, indented or not: every way the scripts define a function
DEFINITION = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(\)[ \t]*\{", re.M)


def scripts() -> list[Path]:
    return sorted(PACKAGE.rglob("*.sh"))


def test_the_scripts_are_found() -> None:
    names = {path.name for path in scripts()}
    assert {"lib.sh", "facts.sh", "act.sh", "janitor-loop.sh", "launch.sh"} <= names


def test_the_definition_pattern_sees_every_form_the_scripts_use() -> None:
    text = "a() {\n    b() { :; }\nc()  {\n}\nd() { # why\n}\nnot e() {\nf=$(g)\n"
    assert DEFINITION.findall(text) == ["a", "b", "c", "d"]


def test_no_function_is_defined_in_two_scripts_or_twice_in_one() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in scripts():
        for name in DEFINITION.findall(path.read_text(encoding="utf-8")):
            where[name].append(str(path.relative_to(PACKAGE)))
    assert where, "no function definitions found"
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


def test_the_node_side_sh_stays_within_its_line_budget() -> None:
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in scripts()}
    assert sum(lines.values()) < LINE_BUDGET, lines
