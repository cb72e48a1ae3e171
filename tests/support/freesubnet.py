"""Bring a sandbox up on the first candidate subnet nothing on this machine uses yet.

A subnet can be taken by another test session, a benchmark, an operator's `fleet sandbox up`,
or a sandbox left behind by a session that was killed (its bridge and namespaces outlive it).
None of those is ours to take down, so a test moves on to the next candidate instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from fleet.sandbox import SandboxError

T = TypeVar("T")


def on_a_free_subnet(subnets: Sequence[str], bring_up: Callable[[str], T]) -> tuple[T, list[str]]:
    """`bring_up(subnet)` on each candidate in turn until one is not refused as "already in use".

    Returns what it returned and the refusals met before it (empty when the first was free).
    Any other failure is raised as it is. `bring_up` cleans up after its own failed attempt.
    """
    refused: list[str] = []
    for subnet in subnets:
        try:
            return bring_up(subnet), refused
        except SandboxError as exc:
            if "already in use" not in exc.message:
                raise
            refused.append(exc.message)
    pytest.fail("no free subnet for a sandbox: " + "; ".join(refused))
