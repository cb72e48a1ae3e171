"""Gathering the hosts' output (clush -b / dshbak -c): grouping, order, bounds, printing."""

from __future__ import annotations

import io
import json

from hypothesis import given
from hypothesis import strategies as st

from fleet.core.events import (
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
    assert "v2\\x1b]0;owned\\x07" in gathered
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
