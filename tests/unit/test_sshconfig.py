"""IndexedSSHConfig answers exactly what paramiko's SSHConfig.lookup answers, for every host.

The config below mixes what operators write: per-node Host blocks (plain names, several per line),
wildcards, negations, a Match block, identity files that accumulate, first-value-wins overrides and
%-tokens; the answers are compared with paramiko's own walk over the whole file.
"""

from __future__ import annotations

import io

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.sshconfig import IndexedSSHConfig

CONFIG = """
Host gpu01
    HostName 10.0.0.1
    User alice
Host gpu02 gpu03
    HostName 10.0.0.%h
    Port 2202
    IdentityFile ~/.ssh/gpu23
Host gpu0?
    User bob
    IdentityFile ~/.ssh/gpu
Host *.example.com !bad.example.com
    ProxyJump bastion
Host gpu03
    Port 9999
    IdentityFile ~/.ssh/gpu3-only
Match host login*
    User carol
Host gpu01 gpu04
    ConnectTimeout 3
Host *
    StrictHostKeyChecking accept-new
    IdentityFile ~/.ssh/id_ed25519
"""

HOSTS = [
    "gpu01",
    "gpu02",
    "gpu03",
    "gpu04",
    "gpu10",
    "a.example.com",
    "bad.example.com",
    "login1",
    "other",
    "10.0.0.1",
]


def _parse(text: str) -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_file(io.StringIO(text))


@pytest.mark.parametrize("host", HOSTS)
def test_lookup_equals_paramikos_own(host: str) -> None:
    config = _parse(CONFIG)
    assert IndexedSSHConfig(config).lookup(host) == config.lookup(host)


def test_plain_name_blocks_are_indexed_and_wildcards_always_tested() -> None:
    indexed = IndexedSSHConfig(_parse(CONFIG))
    assert indexed._indexed
    # Plain names only, each pointing at its own blocks (gpu03: two of them).
    assert set(indexed._by_name) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert len(indexed._by_name["gpu03"]) == 2
    # "gpu0?", the *.example.com line (wildcard and negation), Match, "*" and paramiko's own
    # leading "Host *" block.
    assert len(indexed._always) == 5


def test_canonicalization_anywhere_means_the_whole_file_is_walked() -> None:
    config = _parse("Host *\n    CanonicalizeHostname yes\n    CanonicalDomains example.com\n")
    indexed = IndexedSSHConfig(config)
    assert not indexed._indexed
    assert indexed.lookup("gpu01") == config.lookup("gpu01")


_names = st.sampled_from(["n1", "n2", "n3", "x.y", "n10"])
_patterns = st.one_of(
    _names, st.sampled_from(["n*", "!n2", "*", "n?", "x.*", "!x.y", "[n]1", "n1*"])
)
_blocks = st.lists(
    st.tuples(
        st.lists(_patterns, min_size=1, max_size=3),
        st.sampled_from(["User", "Port", "IdentityFile", "HostName", "ConnectTimeout"]),
        st.integers(min_value=1, max_value=99),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(blocks=_blocks, host=_names)
def test_random_configs_agree_with_paramiko(
    blocks: list[tuple[list[str], str, int]], host: str
) -> None:
    text = "".join(f"Host {' '.join(p)}\n    {k} {v}\n" for p, k, v in blocks)
    config = _parse(text)
    assert IndexedSSHConfig(config).lookup(host) == config.lookup(host)
