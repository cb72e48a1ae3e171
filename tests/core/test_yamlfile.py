"""fleet's YAML loader (built from parser events, for speed and bounds) reads what PyYAML's safe
loader reads, and remembers the line of every key and list item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.yamlfile import YamlFileError, loads

CORPUS = [
    "a: 1\nb: [1, 2.5, -3, 0x10, 0o7, .inf, ~, null, true, no, 'yes', \"x\\ty\"]\n",
    "all:\n  vars: &v {a: 1, b: [x, y]}\n  hosts:\n    h1: *v\n    h2:\n      <<inline: 1\n",
    "s: |\n  line one\n  line two\n\nf: >-\n  folded\n  text\nq: 'it''s'\n",
    "- a\n- - b\n  - c\n- {k: v, 'n': [1, {m: 2}]}\n",
    "d: 2001-12-14\nt: 2001-12-14t21:59:43.10-05:00\nbin: !!binary aGVsbG8=\n",
    "i: !!str 123\nj: !!int '7'\nk: !!float '1'\nm: ! 12\n",
    "? complex plain key\n: value\n1: one\n2.5: x\nfalse: f\n~: n\n",
    "anchor: &x [1, 2]\nuse1: *x\nnested: {deep: *x}\nlist: [*x, *x]\n",
    "",
    "# only a comment\n",
    "---\nplain\n...\n",
]


@pytest.mark.parametrize("text", CORPUS)
def test_data_equals_pyyaml_safe_load(text: str) -> None:
    assert loads(text, Path("x.yaml")).data == yaml.safe_load(text)


def test_lines_of_keys_and_items() -> None:
    doc = loads("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n", Path("x.yaml"))
    assert doc.lines == {
        ("a",): 1,
        ("a", "b"): 2,
        ("a", "c"): 3,
        ("a", "c", 0): 4,
        ("a", "c", 1): 5,
        ("a", "c", 1, "d"): 5,
    }
    assert doc.at(("a", "c", 1, "d")) == "x.yaml:5: a.c.1.d"


def test_an_alias_is_a_copy_not_a_shared_object() -> None:
    data = loads("a: &x {k: [1]}\nb: *x\n", Path("x.yaml")).data
    assert data["a"] == data["b"]
    assert data["a"] is not data["b"]
    assert data["a"]["k"] is not data["b"]["k"]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a: 1\na: 2\n", 2, "duplicate key 'a' (first defined on line 1)"),
        ("base: &b {x: 1}\nc:\n  <<: *b\n", 3, "merge keys"),
        ("? [a, b]\n: 1\n", 1, "plain value"),
        ("k: &a [1]\n? *a\n: 2\n", 2, "plain value"),
    ],
)
def test_refusals_point_at_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(YamlFileError) as info:
        loads(text, Path("x.yaml"))
    assert f"x.yaml:{line}: " in str(info.value)
    assert words in str(info.value)


def test_syntax_errors_keep_line_and_column_but_not_the_text() -> None:
    with pytest.raises(YamlFileError) as info:
        loads("ok: 1\nbad: [secret-value, \n  x: y: z\n", Path("x.yaml"))
    message = str(info.value)
    assert message.startswith("x.yaml:3:")
    assert "invalid YAML" in message
    assert "secret" not in message


def test_a_parser_that_caps_nesting_itself_gets_the_same_plain_words(mocker: Any) -> None:
    """Some libyaml builds stop at depth 1000 with their own wording before our check runs."""
    mark = yaml.Mark("x.yaml", 0, 0, 1004, None, None)
    capped = yaml.parser.ParserError(None, None, "exceeded maximum nesting depth", mark)
    mocker.patch("fleet.core.yamlfile.yaml.parse", side_effect=capped)
    with pytest.raises(YamlFileError) as info:
        loads("all: [[[]]]\n", Path("x.yaml"))
    assert str(info.value) == (
        "x.yaml:1:1005: invalid YAML: nested too many levels deep (flatten the structure)"
    )


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
_data = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(data=_data, flow=st.sampled_from([None, True, False]))
def test_random_documents_read_back_as_pyyaml_reads_them(data: Any, flow: bool | None) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True)
    assert loads(text, Path("x.yaml")).data == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "root:$y$j9T$Hs1kT0pSecr3tHash:19700:0:99999:7:::\n_apt:*:19700:0:99999:7:::\n",
        "name: x\nsteps:\n  - name: a\n    run: echo\n    timeout: $y$Hs1kT0pSecr3tHash\n",
        "name: x\nsteps:\n  - {name: a, run: echo, sudo: '$Hs1kT0pSecr3tHash'}\n",
        "name: x\nsteps:\n  - {name: a, run: echo, on_error: '$Hs1kT0pSecr3tHash'}\n",
    ],
)
def test_a_playbook_path_at_another_file_is_named_never_echoed(tmp_path: Path, text: str) -> None:
    """`fleet run /etc/shadow` printed a shadow line in its "unknown key" error."""
    from fleet.core.errors import PlaybookError
    from fleet.core.playbook import load_playbook

    path = tmp_path / "not-a-playbook"
    path.write_text(text)
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(path))
    assert str(path) in info.value.message
    assert "Hs1kT0pSecr3t" not in info.value.message + info.value.hint
