"""Host ranges: both conventions expand the same way, and folded names expand back to themselves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core import nodeset
from fleet.core.nodeset import RangeError, expand, fold, is_range


def gpus(*numbers: str) -> list[str]:
    return [f"gpu{n}" for n in numbers]


GPU_01_TO_16 = gpus(*(f"{i:02d}" for i in range(1, 17)))


def split_terms(folded: str) -> list[str]:
    """Split a folded set at commas outside brackets (what `--limit` does)."""
    terms, depth, current = [], 0, ""
    for ch in folded:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    return [*terms, current]


# ---------------------------------------------------------------- expand


def test_plain_name_expands_to_itself() -> None:
    assert expand("login-1.cluster") == ["login-1.cluster"]
    assert not is_range("login-1.cluster")


@pytest.mark.parametrize("pattern", ["gpu[01:16]", "gpu[01-16]"])
def test_ansible_and_slurm_ranges_expand_alike(pattern: str) -> None:
    assert is_range(pattern)
    assert expand(pattern) == GPU_01_TO_16


def test_zero_padding_of_the_start_is_kept() -> None:
    assert expand("gpu[08-11]") == gpus("08", "09", "10", "11")
    assert expand("gpu[008:010]") == gpus("008", "009", "010")
    assert expand("gpu[8-11]") == gpus("8", "9", "10", "11")


def test_padding_stops_mattering_once_numbers_are_wider() -> None:
    assert expand("n[098-101]") == ["n098", "n099", "n100", "n101"]


def test_comma_list_mixes_ranges_and_single_numbers() -> None:
    assert expand("gpu[01-04,09]") == gpus("01", "02", "03", "04", "09")
    assert expand("gpu[01:02,07,10-11]") == gpus("01", "02", "07", "10", "11")


def test_single_padded_number_in_brackets_is_kept_verbatim() -> None:
    assert expand("gpu[007]") == ["gpu007"]


@pytest.mark.parametrize("pattern", ["n[1:9:2]", "n[1-9/2]"])
def test_strides_in_both_conventions(pattern: str) -> None:
    assert expand(pattern) == ["n1", "n3", "n5", "n7", "n9"]


def test_stride_keeps_padding() -> None:
    assert expand("n[01-10/3]") == ["n01", "n04", "n07", "n10"]


def test_letter_range() -> None:
    assert expand("rack[a:c]") == ["racka", "rackb", "rackc"]
    assert expand("rack[a:e:2]") == ["racka", "rackc", "racke"]


def test_ansible_range_with_an_empty_start_begins_at_zero() -> None:
    """Ansible's `[:3]` is `[0:3]` (its inventory ranges), unpadded."""
    assert expand("www[:3]") == ["www0", "www1", "www2", "www3"]
    assert expand("www[:10:5]") == ["www0", "www5", "www10"]


def test_multiple_groups_expand_as_a_product_in_order() -> None:
    assert expand("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]


def test_range_with_suffix() -> None:
    assert expand("gpu[1-2].dc1") == ["gpu1.dc1", "gpu2.dc1"]


def test_duplicates_in_a_range_appear_once_in_first_order() -> None:
    assert expand("gpu[03,01-03]") == gpus("03", "01", "02")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("gpu[16-01]", "backwards"),
        ("gpu[16:01]", "backwards"),
        ("rack[c:a]", "backwards"),
        ("gpu[]", "empty"),
        ("gpu[01,]", "empty"),
        ("gpu[,01]", "empty"),
        ("gpu[01-16", "bracket"),
        ("gpu01-16]", "bracket"),
        ("gpu]01[", "bracket"),
        ("gpu[[01-02]]", ""),
        ("gpu[1-1000000]", "larger"),
        ("a[1-1000]b[1-1000]", "more than"),
        ("gpu[1-9/0]", "stride"),
        ("gpu[1:9:0]", "stride"),
        ("gpu[1-x]", "bad range"),
        ("gpu[a-c]", "bad range"),
        ("gpu[ab:c]", "bad range"),
    ],
)
def test_bad_patterns_raise_range_error_naming_the_pattern(pattern: str, words: str) -> None:
    with pytest.raises(RangeError) as info:
        expand(pattern)
    message = str(info.value)
    assert f"'{pattern}'" in message
    assert words in message


@pytest.mark.parametrize(
    "pattern", ["", "gpu 01", "gpu;rm", "root:$y$j9T$Q0secrethash:19000:0:99999:7:::"]
)
def test_a_pattern_with_foreign_characters_is_refused_without_being_echoed(pattern: str) -> None:
    """It may be a line of a file that is not an inventory (-i /etc/shadow): say what is wrong,
    never repeat the text."""
    with pytest.raises(RangeError) as info:
        expand(pattern)
    message = str(info.value)
    assert "not a host name" in message
    assert not pattern or pattern not in message
    assert "secrethash" not in message


def test_huge_range_fails_fast_without_building_names() -> None:
    with pytest.raises(RangeError, match="larger than"):
        expand("gpu[0-99999999999]")


# ---------------------------------------------------------------- fold


def test_fold_lists_non_adjacent_numbers() -> None:
    assert fold(["gpu03", "gpu07"]) == "gpu[03,07]"


def test_fold_joins_adjacent_numbers_into_a_range() -> None:
    assert fold(gpus("01", "02", "03", "05")) == "gpu[01-03,05]"


def test_fold_is_order_and_duplicate_insensitive() -> None:
    assert fold(["gpu07", "gpu03", "gpu07"]) == "gpu[03,07]"


def test_fold_of_one_name_is_the_name() -> None:
    assert fold(["login"]) == "login"


def test_fold_of_nothing_is_empty() -> None:
    assert fold([]) == ""


def test_fold_folds_several_axes() -> None:
    assert fold(["r1n1", "r1n2", "r2n1", "r2n2"]) == "r[1-2]n[1-2]"


def test_fold_keeps_different_prefixes_as_separate_terms() -> None:
    folded = fold(["cpu1", "gpu01", "gpu02"])
    assert split_terms(folded) == ["cpu1", "gpu[01-02]"]


def test_fold_output_of_one_prefix_expands_back() -> None:
    names = gpus("01", "02", "03", "05", "09", "10")
    assert expand(fold(names)) == names


# ---------------------------------------------------------------- round trip property

PREFIXES = st.sampled_from(["gpu", "n", "rack-a", "node.", "x_"])


@st.composite
def padded_names(draw: st.DrawFn, prefix: st.SearchStrategy[str] = PREFIXES) -> str:
    """prefix + a zero-padded integer, e.g. gpu007."""
    return draw(prefix) + str(draw(st.integers(0, 2000))).zfill(draw(st.integers(1, 4)))


@settings(max_examples=150, deadline=None)
@given(
    prefix=PREFIXES,
    numbers=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 4)), min_size=1, max_size=40),
)
def test_one_prefix_folds_into_one_pattern_that_expands_back(
    prefix: str, numbers: list[tuple[int, int]]
) -> None:
    names = [prefix + str(n).zfill(width) for n, width in numbers]
    folded = fold(names)
    assert sorted(expand(folded)) == sorted(set(names))


@settings(max_examples=150, deadline=None)
@given(names=st.lists(padded_names(), min_size=1, max_size=40))
def test_any_fold_expands_back_term_by_term(names: list[str]) -> None:
    """Several prefixes fold to comma-separated terms, one pattern each (what --limit takes)."""
    folded = fold(names)
    expanded = [name for term in split_terms(folded) for name in expand(term)]
    assert sorted(expanded) == sorted(set(names))
    assert len(expanded) == len(set(expanded))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 2), st.integers(0, 30), st.integers(1, 3)),
        min_size=1,
        max_size=30,
    )
)
def test_two_axis_names_fold_and_expand_back(items: list[tuple[int, int, int, int]]) -> None:
    names = [f"r{str(r).zfill(rw)}n{str(n).zfill(nw)}" for r, rw, n, nw in items]
    expanded = [name for term in split_terms(fold(names)) for name in expand(term)]
    assert sorted(expanded) == sorted(set(names))


@pytest.mark.parametrize(
    ("pattern", "count"),
    [
        ("gpu", 1),
        ("gpu[01-16]", 16),
        ("gpu[01:16:2]", 8),
        ("gpu[1-16/4]", 4),
        ("rack[a:c]n[1-4]", 12),
        ("n[1,3,5-9]", 7),
        ("n[0-99999][0-99999]", 10_000_000_000),
        ("n[0-99999][0-99999][0-99999]", 10**15),
    ],
)
def test_count_is_the_number_of_names_computed_without_building_them(
    pattern: str, count: int
) -> None:
    assert nodeset.count(pattern) == count


@pytest.mark.parametrize(
    "pattern",
    [
        "n[0-99999][0-99999]",
        "n[0-99999,0-99999,0-99999,0-99999,0-99999,0-99999,0-99999,0-99999]",
        "host[000-999][000-999]",
        "a[0-9999]b[0-9999]c[0-9999]d[0-9999]e[0-9999]f[0-9999]g[0-9999]",
    ],
)
def test_hostile_patterns_are_refused_with_their_count(pattern: str) -> None:
    with pytest.raises(RangeError, match=r"expands to ([0-9,]+|about 10\^[0-9]+) names, more "):
        expand(pattern)


def test_a_count_too_long_to_print_is_shown_as_its_magnitude() -> None:
    with pytest.raises(RangeError, match=r"expands to about 10\^50 names, more than 100,000"):
        expand("n" + "[0-9]" * 50)


def test_nested_ranges_are_refused_as_bad_syntax() -> None:
    with pytest.raises(RangeError):
        expand("n[0-9[0-99999]]")
    with pytest.raises(RangeError):
        nodeset.count("n[[0-99999][0-99999]]")


def test_fold_keeps_ipv6_addresses_whole() -> None:
    assert fold(["fd00::2", "gpu01", "fd00::1", "gpu02"]) == "gpu[01-02],fd00::1,fd00::2"


AFFIX = st.text(alphabet="abgnrx-._", max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    prefix=AFFIX,
    suffix=AFFIX,
    numbers=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 4)), min_size=2, max_size=30),
)
def test_names_with_one_number_fold_exactly_as_clustershell_folds_them(
    prefix: str, suffix: str, numbers: list[tuple[int, int]]
) -> None:
    """fold() folds this shape itself (ClusterShell costs ~10 ms to load); it must give NodeSet's
    answer, padding, mixed widths and ranges included."""
    from ClusterShell.NodeSet import NodeSet

    names = [f"{prefix}{str(n).zfill(width)}{suffix}" for n, width in numbers]
    assert fold(names) == str(NodeSet.fromlist(sorted(set(names))))


def test_names_of_other_shapes_are_folded_by_clustershell() -> None:
    assert fold(["r1n1", "r1n2", "r2n1", "r2n2", "login"]) == "login,r[1-2]n[1-2]"
    assert fold(["gpu01", "gpu02", "cpu7"]) == "cpu7,gpu[01-02]"


@settings(max_examples=300, deadline=None)
@given(
    prefix=AFFIX,
    suffix=AFFIX,
    width=st.integers(1, 4),
    numbers=st.lists(st.integers(0, 12_000), min_size=2, max_size=40),
)
def test_names_padded_to_one_width_fold_as_clustershell_folds_them_without_it(
    prefix: str, suffix: str, width: int, numbers: list[int]
) -> None:
    """node01..node128: one padding, and numbers that outgrow it (NodeSet splits the padded
    ones from the wider ones). The common shape of a fleet past 99 nodes: folded here."""
    from ClusterShell.NodeSet import NodeSet

    names = [f"{prefix}{str(n).zfill(width)}{suffix}" for n in numbers]
    assert nodeset._fold_one_number(sorted(set(names))) is not None
    assert fold(names) == str(NodeSet.fromlist(sorted(set(names))))
