"""What the operator asked to see, as one frozen value: light to import (no rich), built once by
the CLI and handed to whatever picks the reporters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputSettings:
    """--json, --plain, and what the summary shows of the hosts' output."""

    json: bool = False
    plain: bool = False
    # What the summary shows of the hosts' output: "gather" (run, exec), "last" (verbs that
    # print a report per host), "none". --no-gather turns "gather" into "per-host".
    output: str = "last"
    gather: bool = True

    @property
    def shown(self) -> str:
        """The output mode the reporters use, --no-gather applied."""
        if self.gather:
            return self.output
        return "per-host" if self.output == "gather" else self.output
