"""plan_pull: what a node's listing becomes on the bastion, whatever the node says."""

from __future__ import annotations

from fleet.transfer import node
from fleet.transfer.files import Action, plan_pull
from fleet.transfer.node import Entry


def test_a_file_root_is_the_one_entry_with_an_empty_name() -> None:
    plan = plan_pull([Entry("f", 5, b"")])
    assert plan.files == (Entry("f", 5, b""),)
    assert plan.refused == ()


def test_an_empty_name_past_the_root_is_refused_not_pulled() -> None:
    """A hostile listing: names that are empty after the root's would be written as nothing
    (before, the host ended as an internal error); each is refused as unsafe."""
    listing = [Entry("d", 0, b""), Entry("f", 3, b"a"), Entry("f", 9, b""), Entry("d", 0, b"")]
    plan = plan_pull(listing)
    assert plan.files == (Entry("f", 3, b"a"),)
    assert plan.dirs == ()
    assert [(r.rel, r.action, r.error) for r in plan.refused] == [
        ("", Action.REFUSED, "unsafe name"),
        ("", Action.REFUSED, "unsafe name"),
    ]


def test_a_part_file_in_the_tree_is_refused_not_pulled() -> None:
    """A push cut short leaves `.fleet-part-<hash of model.bin>` beside model.bin on the node.
    Pulled as a file, it landed on the name model.bin's own part is written under locally: it
    was reported copied, then truncated and renamed to model.bin. Named as REMOTE itself, it
    is the operator's choice and pulled."""
    part = node.part_name(b"model.bin")
    plan = plan_pull([Entry("d", 0, b""), Entry("f", 9, part), Entry("f", 4, b"model.bin")])
    assert plan.files == (Entry("f", 4, b"model.bin"),)
    assert [(r.rel, r.action) for r in plan.refused] == [(part.decode(), Action.REFUSED)]
    assert "part file" in plan.refused[0].error
    assert plan_pull([Entry("f", 9, b"")]).files == (Entry("f", 9, b""),)
