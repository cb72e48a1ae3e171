"""plan_pull: what a node's listing becomes on the bastion, whatever the node says."""

from __future__ import annotations

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
