"""The OpenSSH client config, looked up per host without walking every Host block.

paramiko's `SSHConfig.lookup` tests every block of the file against the host, twice (a first pass,
then the final one), with fnmatch and a `getpass.getuser()` per block. Cluster configs are often
generated with one `Host` block per node, so a run over N nodes costs N x N block tests: at 128
nodes that was half of fleet's client CPU in the benchmark's profile.

`IndexedSSHConfig` gives the same answers faster: a block whose Host patterns are all plain names
(no `*`, `?`, `[`, no `!`) can only apply to a host of one of those names, so it is indexed by
name. A lookup hands paramiko only the blocks that could apply (the indexed ones for this name, cut
down to that name, plus every block with a wildcard, a negation or a Match), in file order, and
paramiko's own rules (first value wins, identity files accumulate, Match, token expansion) do the
rest. With CanonicalizeHostname anywhere in the file the host name can change between the passes,
so such a file is looked up whole.
"""

from __future__ import annotations

from typing import Any

import paramiko

_GLOB_CHARS = frozenset("*?[")


def _plain_names(block: dict[str, Any]) -> list[str] | None:
    """The names a Host block applies to, if it only lists plain names; else None."""
    if "matches" in block or "host" not in block:
        return None
    patterns = block["host"]
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    names = []
    for pattern in patterns:
        if not pattern or pattern.startswith("!") or _GLOB_CHARS & set(pattern):
            return None
        names.append(pattern)
    return names


class IndexedSSHConfig:
    """A parsed ssh config whose `lookup(hostname)` equals paramiko's, in time independent of the
    number of plain-name Host blocks."""

    def __init__(self, config: paramiko.SSHConfig) -> None:
        self.config = config
        blocks = getattr(config, "_config", None)
        self._blocks: list[dict[str, Any]] = blocks if isinstance(blocks, list) else []
        self._by_name: dict[str, list[int]] = {}
        self._always: list[int] = []
        self._indexed = isinstance(blocks, list) and not any(
            "canonicalizehostname" in block.get("config", {}) for block in self._blocks
        )
        if not self._indexed:
            return
        for i, block in enumerate(self._blocks):
            names = _plain_names(block)
            if names is None:
                self._always.append(i)
            else:
                for name in dict.fromkeys(names):
                    self._by_name.setdefault(name, []).append(i)

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        if not self._indexed:
            return self.config.lookup(hostname)
        named = self._by_name.get(hostname, [])
        blocks = [(i, self._blocks[i]) for i in self._always]
        # A plain-name block that lists this host applies to it just as a block naming only it
        # does; paramiko would test every name of it (a generated `Host node01 ... node999`).
        blocks += [(i, {**self._blocks[i], "host": [hostname]}) for i in named]
        subset = paramiko.SSHConfig()
        subset._config = [b for _, b in sorted(blocks, key=lambda ib: ib[0])]  # type: ignore[attr-defined]
        return subset.lookup(hostname)
