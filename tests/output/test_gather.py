"""Gathering the hosts' output (clush -b / dshbak -c): grouping, order, bounds, printing."""

from __future__ import annotations

import dataclasses
import io
import json

from hypothesis import given
from hypothesis import strategies as st

from fleet.core.events import (
    GAP,
    HostFinished,
    Outcome,
    OutputLine,
    RunFinished,
    RunStarted,
    RunSummary,
    StepStarted,
)
from fleet.output import gather
from fleet.output.gather import Gatherer
from fleet.output.plain import TextPrinter, print_summary

HOSTS = tuple(f"node{i:02d}" for i in range(1, 7))


def _run(outputs: dict[str, list[tuple[str, str]]], hosts: tuple[str, ...] = HOSTS) -> Gatherer:
    g = Gatherer()
    g.handle(RunStarted(run_id="r", playbook="exec", hosts=hosts, forks=4, run_dir=""))
    for host in hosts:
        g.handle(StepStarted(host=host, step="exec", index=0, command="x"))
    for host, lines in outputs.items():
        for stream, text in lines:
            g.handle(OutputLine(host=host, step="exec", stream=stream, line=text))
    for host in reversed(hosts):  # finishing order must not matter
        g.handle(HostFinished(host=host, outcome=Outcome.OK, duration_s=0.1))
    return g


def test_identical_outputs_are_one_group_most_hosts_first() -> None:
    out = {h: [("stdout", "535.104.05")] for h in HOSTS}
    out["node04"] = [("stdout", "550.54.14")]
    out["node06"] = [("stdout", "550.54.14")]
    out["node05"] = [("stdout", "535.104.05"), ("stderr", "warning: ECC errors")]
    groups = _run(out).result()
    assert [(g.folded, [ln.text for ln in g.lines]) for g in groups] == [
        ("node[01-03]", ["535.104.05"]),
        ("node[04,06]", ["550.54.14"]),
        ("node05", ["535.104.05", "warning: ECC errors"]),
    ]
    assert groups[2].lines[1].stream == "stderr"


def test_stream_and_line_boundaries_are_part_of_the_identity() -> None:
    out = {
        "node01": [("stdout", "a b")],
        "node02": [("stdout", "a"), ("stdout", "b")],
        "node03": [("stderr", "a b")],
    }
    groups = _run(out, hosts=("node01", "node02", "node03")).result()
    assert len(groups) == 3


def test_hosts_that_print_nothing_are_listed_apart() -> None:
    g = _run({"node01": [("stdout", "x")]}, hosts=("node01", "node02", "node03"))
    assert [grp.folded for grp in g.result()] == ["node01"]
    assert g.silent_hosts() == ("node02", "node03")


def test_a_flood_is_kept_bounded_but_still_compared_whole() -> None:
    big = [("stdout", "x" * 1000) for _ in range(500)]
    other = [*big[:-1], ("stdout", "y" * 1000)]  # differs only after the kept part
    groups = _run({"node01": big, "node02": big, "node03": other}, ("node01", "node02", "node03"))
    result = groups.result()
    assert [g.folded for g in result] == ["node[01-02]", "node03"]
    kept = sum(len(ln.text) for ln in result[0].lines)
    assert kept <= gather.KEEP_BYTES
    assert result[0].more_lines == 500 - len(result[0].lines)


@given(
    st.dictionaries(
        st.sampled_from(HOSTS),
        st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.sampled_from(["a", "b", ""]))),
    )
)
def test_groups_partition_the_hosts_by_exact_output(
    outputs: dict[str, list[tuple[str, str]]],
) -> None:
    g = _run(outputs)
    groups = g.result()
    seen = [h for grp in groups for h in grp.hosts] + list(g.silent_hosts())
    assert sorted(seen) == sorted(HOSTS)
    for grp in groups:
        expected = [(ln.stream, ln.text) for ln in grp.lines]
        assert all(outputs.get(h, []) == expected for h in grp.hosts)
    keys = [tuple((ln.stream, ln.text) for ln in grp.lines) for grp in groups]
    assert len(set(keys)) == len(keys)
    sizes = [len(grp.hosts) for grp in groups]
    assert sizes == sorted(sizes, reverse=True)


def _summary(outputs: dict[str, list[tuple[str, str]]]) -> RunSummary:
    g = _run(outputs, hosts=tuple(outputs))
    return RunSummary(
        run_id="r",
        playbook="exec",
        results=tuple(HostFinished(host=h, outcome=Outcome.OK, duration_s=0.1) for h in outputs),
        duration_s=1.0,
        output=g.result(),
        silent=g.silent_hosts(),
    )


def _printed(summary: RunSummary, mode: str) -> str:
    buf = io.StringIO()
    print_summary(TextPrinter(buf), summary, None, mode)
    return buf.getvalue()


def test_printed_gathered_and_per_host() -> None:
    summary = _summary(
        {
            "gpu01": [("stdout", "v1")],
            "gpu02": [("stdout", "v1")],
            "gpu03": [("stdout", "v2\x1b]0;owned\x07")],
            "gpu04": [],
        }
    )
    gathered = _printed(summary, "gather")
    assert "gpu[01-02] (2)\n" in gathered
    assert gathered.index("gpu[01-02]") < gathered.index("gpu03 (1)")
    assert "\x1b" not in gathered
    assert "  | v2\\x1b]0;owned\\x07\n" in gathered
    assert "no output: gpu04" in gathered
    per_host = _printed(summary, "per-host")
    titles = [ln for ln in per_host.splitlines() if ln.startswith(("gpu", "no output"))]
    assert titles == ["gpu01", "gpu02", "gpu03", "no output: gpu04"]
    assert per_host.count("v1") == 2


def test_json_run_finished_carries_the_groups() -> None:
    summary = _summary({"a1": [("stdout", "x")], "a2": [("stdout", "x")], "a3": []})
    doc = json.loads(json.dumps(RunFinished(summary=summary).to_dict()))
    assert doc["output"] == [
        {
            "hosts": "a[1-2]",
            "count": 2,
            "lines": [{"step": "exec", "stream": "stdout", "text": "x"}],
            "more_lines": 0,
        }
    ]
    assert doc["no_output"] == "a3"


def test_last_mode_folds_ok_hosts_by_their_last_line() -> None:
    from fleet.output.plain import HostView, RunView

    view = RunView()
    lasts = {"n1": "killed 2, removed 4 paths", "n2": "killed 2, removed 4 paths", "n3": "clean"}
    view.hosts = {h: HostView(h, state="ok", last_line=line) for h, line in lasts.items()}
    summary = RunSummary(
        run_id="r",
        playbook="cleanup",
        results=tuple(HostFinished(host=h, outcome=Outcome.OK, duration_s=0.1) for h in lasts),
        duration_s=1.0,
    )
    buf = io.StringIO()
    print_summary(TextPrinter(buf), summary, view, "last")
    text = buf.getvalue()
    assert "n[1-2]: killed 2, removed 4 paths" in text
    assert "n3: clean" in text
    assert "everywhere" not in text


def test_node_lines_sit_behind_a_gutter_so_none_poses_as_a_block_title() -> None:
    """A node printing a rule and another group's title: at the margin only fleet's own."""
    forged = ["", "-" * 15, "n[1,3] (2)", "-" * 15, "FAILED: disk corrupt"]
    summary = _summary(
        {
            "n1": [("stdout", "all good")],
            "n2": [("stdout", "all good"), *[("stdout", ln) for ln in forged], ("stderr", "x")],
            "n3": [("stdout", "all good")],
        }
    )
    printed = _printed(summary, "gather").splitlines()
    titles = [ln for ln in printed if ln and not ln.startswith(("-", " "))]
    assert titles[:2] == ["n[1,3] (2)", "n2 (1)"]
    assert "n[1,3] (2)" not in titles[2:]
    assert [f"  | {ln}" for ln in forged] == [
        printed[i] for i in range(printed.index("n2 (1)") + 3, printed.index("n2 (1)") + 8)
    ]
    assert "  ! x" in printed


def _long_line_outputs(after: bool) -> dict[str, list[tuple[str, str]]]:
    lines = [("stdout", "before"), ("stdout", "b" * gather.KEEP_BYTES)]
    return {"n1": lines + ([("stdout", "after")] if after else [])}


def test_a_line_that_cannot_be_shown_is_marked_where_it_was() -> None:
    """A line too long for what is left of the group's bytes: a gap marker in its place, never
    the lines around it shown as if adjacent."""
    (group,) = _run(_long_line_outputs(after=True), hosts=("n1",)).result()
    assert [(ln.stream, ln.text) for ln in group.lines] == [
        ("stdout", "before"),
        (GAP, "1 line not shown: 16.4 kB"),
        ("stdout", "after"),
    ]
    assert group.more_lines == 0
    printed = _printed(_summary(_long_line_outputs(after=True)), "gather").splitlines()
    at = printed.index("  | before")
    assert printed[at + 1 : at + 3] == ["  [... 1 line not shown: 16.4 kB ...]", "  | after"]
    assert "more line" not in "\n".join(printed)


def test_lines_left_out_at_the_end_are_counted_with_what_the_record_holds() -> None:
    """Nothing shown after them: counted under the group, pointing to the run record and
    saying it holds each line cut at 16 KiB (not the whole line)."""
    (group,) = _run(_long_line_outputs(after=False), hosts=("n1",)).result()
    assert [ln.text for ln in group.lines] == ["before"]
    assert group.more_lines == 1
    summary = dataclasses.replace(_summary(_long_line_outputs(after=False)), run_dir="/r/x")
    printed = _printed(summary, "gather")
    assert "... 1 more line in the run record (each line cut at 16 KiB): /r/x\n" in printed
