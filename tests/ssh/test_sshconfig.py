"""The ssh config as fleet reads it: lookups, Include, -F /dev/null, refusals, tokens, proxies.

First, IndexedSSHConfig answers exactly what paramiko's SSHConfig.lookup answers, for every host:
the config below mixes what operators write: per-node Host blocks (plain names, several per line),
wildcards, negations, a Match block, identity files that accumulate, first-value-wins overrides and
%-tokens; the answers are compared with paramiko's own walk over the whole file.

Then, through SSHTransport.target (what `fleet` itself uses, no connection made): Include as
OpenSSH reads it, OpenSSH's "no config", files that are not configs (never echoed), options fleet
cannot honour (refused, naming file:line), ProxyCommand/ProxyJump precedence and token expansion.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.errors import ConfigError
from fleet.core.hosts import Host
from fleet.ssh.config import OPTIONS, IndexedSSHConfig, expand_tokens
from fleet.ssh.settings import SshSettings
from fleet.ssh.sshconfig import SSHConfig, _matches, split_words
from fleet.ssh.transport import SSHTransport, Target

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


def _ours(text: str) -> SSHConfig:
    config = SSHConfig()
    config.parse(io.StringIO(text))
    return config


@pytest.mark.parametrize("host", HOSTS)
def test_fleets_own_lookup_answers_as_paramiko_does(host: str) -> None:
    """fleet looks hosts up without paramiko (fleet/ssh/sshconfig.py): same answers."""
    ours = _ours(CONFIG)
    assert ours.lookup(host) == _parse(CONFIG).lookup(host)
    assert IndexedSSHConfig(ours).lookup(host) == _parse(CONFIG).lookup(host)


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


_match_criteria = st.sampled_from(
    [
        "host n*",
        "host !n2",
        "originalhost n1,x.*",
        "!originalhost n3",
        "user alice",
        "user root,alice",
        "!user bob",
        "localuser *",
        "!localuser nobody",
        "final",
        "!final",
        "canonical",
        "all",
        "canonical all",
    ]
)
_values = {
    "User": st.sampled_from(["alice", "bob", "root"]),
    "Port": st.sampled_from(["22", "2202"]),
    "HostName": st.sampled_from(["10.0.0.1", "%h.example.com", "node-%h"]),
    "IdentityFile": st.sampled_from(["~/.ssh/id", "%d/k-%h", "/k/%r@%h:%p-%u", "/k/%L-%C", "/k/x"]),
    "ConnectTimeout": st.sampled_from(["3", "7"]),
    "ProxyCommand": st.sampled_from(["none", "ssh -W %h:%p gw", '"nc %h %p"']),
    "ControlPath": st.sampled_from(["/tmp/c-%C", "~/.c/%r@%h:%p"]),
}
_option = st.sampled_from(sorted(_values)).flatmap(lambda k: st.tuples(st.just(k), _values[k]))
_any_block = st.tuples(
    st.one_of(
        st.lists(_patterns, min_size=1, max_size=3).map(lambda p: "Host " + " ".join(p)),
        st.lists(_match_criteria, min_size=1, max_size=2).map(lambda c: "Match " + " ".join(c)),
    ),
    st.lists(_option, min_size=1, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    leading=st.lists(_option, max_size=2),
    blocks=st.lists(_any_block, max_size=6),
    host=_names,
)
def test_fleets_own_lookup_agrees_with_paramiko_on_random_configs(
    leading: list[tuple[str, str]], blocks: list[tuple[str, list[tuple[str, str]]]], host: str
) -> None:
    """Host and Match blocks, negations, first value wins, IdentityFile accumulating, %-tokens
    and ~ in the options paramiko expands them in, ProxyCommand none: as paramiko answers."""
    text = "".join(f"{k} {v}\n" for k, v in leading)
    for header, options in blocks:
        text += header + "\n" + "".join(f"    {k} {v}\n" for k, v in options)
    try:
        expected = _parse(text).lookup(host)
    except paramiko.ssh_exception.ConfigParseError:
        with pytest.raises(ValueError, match="Match"):
            _ours(text)
        return
    assert _ours(text).lookup(host) == expected
    assert IndexedSSHConfig(_ours(text)).lookup(host) == expected


_text = st.text(alphabet=st.sampled_from(list("ab*?[]!-. \t\"'\\\x0b\u00a0#")), max_size=16)


@settings(max_examples=500, deadline=None)
@given(value=_text)
def test_split_words_is_shlex_split(value: str) -> None:
    """The fast path for plain Host lines answers as shlex.split, or fails as it does."""
    try:
        expected = shlex.split(value)
    except ValueError:
        with pytest.raises(ValueError, match=r"quotation|escape"):
            split_words(value)
        return
    assert split_words(value) == expected


@settings(max_examples=500, deadline=None)
@given(
    name=st.text(alphabet="ab.-[]!*?", max_size=6),
    pattern=st.text(alphabet="ab.-[]!*?", max_size=6),
)
def test_a_pattern_matches_as_fnmatch_says(name: str, pattern: str) -> None:
    """Literal patterns are compared as they are (no regular expression per host name)."""
    import fnmatch

    assert _matches(name, pattern) == fnmatch.fnmatch(name, pattern)


# ---------------------------------------------------------------- reading: Include, -F /dev/null,
# refusals. Driven through SSHTransport (what `fleet` itself uses), no connection is made.


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own, with ~/.ssh: Include's relative paths resolve there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path / "home"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _target(config: Path | str | None, name: str = "gpu01", **host: object) -> Target:
    path = Path(config) if config is not None else None
    transport = SSHTransport(SshSettings(ssh_config=path))
    return transport.target(Host(name=name, address=str(host.pop("address", name)), **host))  # type: ignore[arg-type]


def _error(config: Path | str, name: str = "gpu01") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _target(config, name)
    return info.value


def test_include_is_read_relative_to_dot_ssh_with_globs_in_lexical_order(home: Path) -> None:
    _write(home / ".ssh" / "conf.d" / "20-late.conf", "Host gpu01\n    User late\n    Port 2202\n")
    _write(home / ".ssh" / "conf.d" / "10-early.conf", "Host gpu01\n    User early\n")
    _write(home / ".ssh" / "conf.d" / "not-matched.txt", "Host gpu01\n    User never\n")
    config = _write(home / "cfg", "Include conf.d/*.conf\nHost *\n    User fallback\n")

    target = _target(config)

    assert (target.user, target.port) == ("early", 2202)


def test_nested_includes_with_tilde_and_env_and_missing_patterns(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TEST_SSH_DIR", str(home / "elsewhere"))
    _write(home / "elsewhere" / "inner", "Host gpu01\n    HostName 10.9.9.9\n")
    _write(home / ".ssh" / "middle", "Include ${FLEET_TEST_SSH_DIR}/inner\n")
    config = _write(home / "cfg", "Include ~/.ssh/middle no-such-file-* %d/.ssh/none\n")

    assert _target(config).address == "10.9.9.9"


def test_an_included_host_block_ends_with_its_file(home: Path) -> None:
    """OpenSSH scopes Host/Match per file: after the Include, the includer's block is back."""
    _write(home / ".ssh" / "other", "Host other\n    User other-user\n")
    config = _write(home / "cfg", "Host gpu01\n    Include other\n    User gpu-user\n")

    assert _target(config).user == "gpu-user"
    assert _target(config, "other").user == "other-user"


def test_include_inside_a_host_block_is_conditional(home: Path) -> None:
    _write(home / ".ssh" / "gpu-only", "User gpu-user\n")
    config = _write(home / "cfg", "Host gpu*\n    Include gpu-only\nHost *\n    User default\n")

    assert _target(config, "gpu01").user == "gpu-user"
    assert _target(config, "cpu01").user == "default"


def test_an_include_loop_is_refused_at_its_line(home: Path) -> None:
    _write(home / ".ssh" / "a", "# a\nInclude b\n")
    _write(home / ".ssh" / "b", "Include a\n")
    error = _error(_write(home / "cfg", "Include a\n"))
    assert "Include nested more than 16 deep" in error.message
    assert f"{home / '.ssh'}/" in error.message
    assert error.hint


@pytest.mark.parametrize("no_config", ["/dev/null", "none"])
def test_dash_F_dev_null_means_no_config(home: Path, no_config: str) -> None:
    _write(home / ".ssh" / "config", "Host *\n    User from-default-config\n    Port 2222\n")
    target = _target(no_config, address="10.0.0.1")
    assert (target.address, target.port, target.proxy_jump) == ("10.0.0.1", 22, ())
    assert target.user != "from-default-config"


SHADOW_LINE = "root:$y$j9T$Hs1kT0pSecr3tSalt$Hs1kT0pSecr3tHash0123456789:19700:0:99999:7:::\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(SHADOW_LINE, id="shadow"),
        pytest.param("Hs1kT0pSecr3t and more words\n", id="unknown-keyword"),
        pytest.param("Host gpu01\n    User 'Hs1kT0pSecr3t\nHost 'Hs1kT0pSecr3t\n", id="quotes"),
    ],
)
def test_a_file_that_is_not_an_ssh_config_is_named_never_echoed(home: Path, text: str) -> None:
    """`-F /etc/shadow` printed root's hash (paramiko's "Unparsable line ...")."""
    config = _write(home / "secret", text)
    error = _error(config)
    assert error.message.startswith(f"{config}:")
    assert "Hs1kT0pSecr3t" not in error.message + error.hint


def test_unknown_options_are_refused_unless_ignored(home: Path) -> None:
    config = _write(home / "cfg", "Host gpu01\n    User u\n    FrobnicateTheWidget yes\n")
    error = _error(config)
    assert error.message == f"{config}:3: not an OpenSSH client option"
    ignored = _write(home / "cfg2", "IgnoreUnknown Frob*\nHost gpu01\n    FrobnicateTheWidget 1\n")
    assert _target(ignored).name == "gpu01"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("Match localnetwork 10.0.0.0/8", "Match localnetwork: fleet cannot evaluate"),
        ("Match tagged x", "Match tagged"),
        ("Match host", "lacks its argument"),
        ('Match exec "test %C"', "Match exec: unknown token %C"),
        ("ProxyCommand nc %h %p %k", "ProxyCommand: unknown token %k"),
        ("ProxyJump %x", "ProxyJump: unknown token %x"),
    ],
)
def test_what_paramiko_or_fleet_would_get_wrong_is_refused_at_its_line(
    home: Path, line: str, words: str
) -> None:
    config = _write(home / "cfg", f"Host *\n    User u\n{line}\n")
    error = _error(config)
    assert error.message.startswith(f"{config}:3: "), error.message
    assert words in error.message


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("ProxyUseFdpass yes", "ProxyUseFdpass"),
        ("KnownHostsCommand /bin/true", "KnownHostsCommand"),
        ("RevokedHostKeys ~/.ssh/revoked", "RevokedHostKeys"),
        ("IdentityAgent /tmp/other-agent.sock", "IdentityAgent"),
        ("BindInterface eth1", "BindInterface"),
        ("PKCS11Provider /usr/lib/opensc-pkcs11.so", "PKCS11Provider"),
        ("RequiredRSASize 3072", "RequiredRSASize"),
    ],
)
def test_an_option_fleet_cannot_honour_is_refused_naming_its_file_and_line(
    home: Path, option: str, name: str
) -> None:
    _write(home / ".ssh" / "site.conf", f"# site policy\nHost gpu*\n    {option}\n")
    config = _write(home / "cfg", "Host gpu01\n    User u\nInclude site.conf\n")

    error = _error(config)

    assert error.message.startswith(f"{home / '.ssh' / 'site.conf'}:3: {name} "), error.message
    assert "fleet cannot honour it" in error.message
    assert "host gpu01" in error.message
    assert error.hint
    # The same option for a host fleet does not connect to is none of its business.
    assert _target(config, "cpu01").name == "cpu01"


@pytest.mark.parametrize(
    "option",
    [
        "ProxyUseFdpass no",
        "IdentityAgent none",
        "IdentityAgent SSH_AUTH_SOCK",
        "PKCS11Provider none",
    ],
)
def test_harmless_values_of_those_options_are_fine(home: Path, option: str) -> None:
    config = _write(home / "cfg", f"Host gpu01\n    {option}\n")
    target = _target(config)
    assert target.allow_agent == (option != "IdentityAgent none")


def test_every_option_openssh_knows_is_classified() -> None:
    """`ssh -G` lists OpenSSH's options; each one is honoured, harmless or refused, with a why."""
    ssh = shutil.which("ssh")
    if ssh is None:
        pytest.skip("no OpenSSH client here")
    out = subprocess.run(
        [ssh, "-G", "-F", "/dev/null", "localhost"], capture_output=True, text=True, check=True
    ).stdout
    known = {line.split()[0].lower() for line in out.splitlines() if line.strip()}
    assert known - set(OPTIONS) == set()
    assert all(option.why for option in OPTIONS.values())


# ---------------------------------------------------------------- ProxyCommand and ProxyJump


def test_proxy_command_tokens_use_the_final_values_and_are_shell_quoted(home: Path) -> None:
    config = _write(
        home / "cfg",
        "Host *\n    ProxyCommand ssh -W %h:%p -l %r jump # %n %% %%h\n    Port 2200\n",
    )
    target = _target(config, address="10.0.0.5$(touch /tmp/x)", user="o'brien", port=2222)
    assert target.proxy_command == (
        "ssh -W '10.0.0.5$(touch /tmp/x)':2222 -l 'o'\"'\"'brien' jump"
        " # '10.0.0.5$(touch /tmp/x)' % %h"
    )
    assert target.proxy_jump == ()
    # The quoting holds up in a real shell: each value is one word, nothing runs.
    words = shlex.split(target.proxy_command.split(" #")[0])
    assert words == ["ssh", "-W", "10.0.0.5$(touch /tmp/x):2222", "-l", "o'brien", "jump"]


def test_proxy_command_from_hostname_alias(home: Path) -> None:
    config = _write(
        home / "cfg",
        "Host gpu01\n    HostName 10.1.2.3\nHost *\n    ProxyCommand nc %h %p\n",
    )
    assert _target(config).proxy_command == "nc 10.1.2.3 22"


@pytest.mark.parametrize(
    ("text", "command", "jump"),
    [
        ("ProxyCommand nc %h %p\n    ProxyJump j1", "nc gpu01 22", ()),
        ("ProxyJump j1\n    ProxyCommand nc %h %p", None, ("j1",)),
        ("ProxyCommand none\n    ProxyJump j1", None, ()),
        ("ProxyJump none\n    ProxyCommand nc %h %p", None, ()),
        (
            "ProxyJump alice@j1:2201,ssh://j2,[fe80::1]:22",
            None,
            ("alice@j1:2201", "ssh://j2", "[fe80::1]:22"),
        ),
    ],
)
def test_the_first_of_proxycommand_and_proxyjump_wins_as_in_openssh(
    home: Path, text: str, command: str | None, jump: tuple[str, ...]
) -> None:
    config = _write(home / "cfg", f"Host gpu01\n    {text}\n")
    target = _target(config)
    assert (target.proxy_command, target.proxy_jump) == (command, jump)


def test_a_bad_proxyjump_hop_is_refused_at_its_line(home: Path) -> None:
    config = _write(home / "cfg", "Host gpu01\n    ProxyJump j1,,j2\n")
    error = _error(config)
    assert error.message.startswith(f"{config}:2: ProxyJump: ")


def test_each_hop_gets_its_own_config_and_reaches_through_the_previous(home: Path) -> None:
    config = _write(
        home / "cfg",
        """\
        Host gpu01
            ProxyJump bastion,inner
        Host bastion
            HostName 10.0.0.1
            User jumper
            IdentityFile ~/.ssh/bastion_key
            ProxyCommand should-not-be-used-for-a-later-hop
        Host inner
            HostName 10.0.1.1
            Port 2222
            ProxyJump somewhere-else
            StrictHostKeyChecking accept-new
        """,
    )
    transport = SSHTransport(SshSettings(ssh_config=config))
    first = transport._hop_target("bastion", ())
    second = transport._hop_target("inner", ("bastion",))
    assert (first.address, first.user, first.key_files) == (
        "10.0.0.1",
        "jumper",
        (str(home / ".ssh" / "bastion_key"),),
    )
    assert first.proxy_command == "should-not-be-used-for-a-later-hop"  # the first hop: its own
    assert (second.address, second.port, second.policy) == ("10.0.1.1", 2222, "accept-new")
    assert (second.proxy_jump, second.proxy_command) == (("bastion",), None)


def test_a_jump_loop_is_refused_before_connecting(home: Path) -> None:
    config = _write(
        home / "cfg",
        "Host gpu01\n    ProxyJump j1\nHost j1\n    ProxyJump j2\nHost j2\n    ProxyJump j1\n",
    )
    transport = SSHTransport(SshSettings(ssh_config=config))
    with pytest.raises(ConfigError) as info:
        transport.check([Host(name="gpu01", address="gpu01")])
    assert info.value.message == "ProxyJump loop: gpu01 -> j1 -> j2 -> j1"


def test_a_jump_host_caught_by_its_own_proxyjump_pattern_is_a_loop(home: Path) -> None:
    config = _write(home / "cfg", "Host *\n    ProxyJump bastion\n")
    transport = SSHTransport(SshSettings(ssh_config=config))
    with pytest.raises(ConfigError) as info:
        transport.check([Host(name="gpu01", address="gpu01")])
    assert info.value.message == "ProxyJump loop: gpu01 -> bastion -> bastion"
    assert "!bastion" in info.value.hint


def test_expand_tokens_is_one_pass() -> None:
    assert expand_tokens("%%h %h%%%p", {"h": "a b", "p": "22"}, quote=True) == "%h 'a b'%22"
    assert expand_tokens("%h", {"h": "a b"}, quote=False) == "a b"


def test_host_key_alias_address_family_and_algorithms(home: Path) -> None:
    config = _write(
        home / "cfg",
        "Host gpu01\n    HostKeyAlias cluster-key\n    AddressFamily inet\n"
        "    Ciphers aes256-ctr,aes128-ctr\n    MACs -hmac-sha1*\n    KexAlgorithms +foo\n",
    )
    target = _target(config)
    assert target.host_key_alias == "cluster-key"
    assert target.address_family == socket.AF_INET
    disabled = dict(target.disabled_algorithms)
    ciphers = paramiko.Transport._preferred_ciphers
    assert set(disabled["ciphers"]) == set(ciphers) - {"aes256-ctr", "aes128-ctr"}
    macs = paramiko.Transport._preferred_macs
    assert set(disabled["macs"]) == {m for m in macs if m.startswith("hmac-sha1")}
    assert "kex" not in disabled


def test_an_algorithm_list_paramiko_cannot_meet_is_refused(home: Path) -> None:
    config = _write(home / "cfg", "Host gpu01\n    Ciphers chacha20-only-in-dreams\n")
    error = _error(config)
    assert error.message.startswith(f"{config}:2: Ciphers: ")


def test_a_config_path_that_is_missing_or_a_directory(home: Path) -> None:
    assert "ssh config not found" in _error(home / "nope").message
    assert "is a directory" in _error(home).message
    binary = home / "bin"
    binary.write_bytes(b"\x7fELF\x02\x01\xff\xfe Hs1kT0pSecr3t")
    error = _error(binary)
    assert "not UTF-8 text" in error.message
    assert "Hs1kT0pSecr3t" not in error.message


def test_the_default_config_is_read_when_present(home: Path) -> None:
    _write(home / ".ssh" / "config", "Host gpu01\n    User from-default\n")
    assert _target(None).user == "from-default"
    os.unlink(home / ".ssh" / "config")
    assert _target(None).user != "from-default"


@pytest.mark.parametrize(
    ("line", "words"),
    [("Port 0x16", "Port: expected a number"), ("AddressFamily ipx", "AddressFamily: expected")],
)
def test_bad_values_name_their_line(home: Path, line: str, words: str) -> None:
    config = _write(home / "cfg", f"Host *\n    User u\nHost gpu01\n    {line}\n")
    error = _error(config)
    assert error.message.startswith(f"{config}:4: {words}"), error.message


def test_match_exec_runs_with_shell_quoted_values(home: Path, tmp_path: Path) -> None:
    """paramiko put %h into the Match exec command line as is: an inventory address with shell
    syntax would have run on this machine."""
    marker = tmp_path / "ran"
    config = _write(
        home / "cfg",
        'Match exec "test %h = gpu01"\n    User matched\nHost *\n    User other\n',
    )
    assert _target(config).user == "matched"
    assert _target(config, "gpu02").user == "other"
    hostile = f"x;touch {marker};$(touch {marker})"
    assert _target(config, "gpu03", address=hostile).user == "other"
    assert not marker.exists()


def test_refuse_connection_is_obeyed(home: Path) -> None:
    config = _write(home / "cfg", "Host gpu01\n    RefuseConnection yes\n")
    error = _error(config)
    assert error.message.startswith(f"{config}:2: RefuseConnection ")


def test_a_nested_include_keeps_the_outer_host_scope(home: Path) -> None:
    """A file included inside `Host gpu*` is in that scope to its end, across its own Includes."""
    _write(home / ".ssh" / "b", "Port 2200\n")
    _write(home / ".ssh" / "a", "Include b\nUser from-a\n")
    config = _write(home / "cfg", "Host gpu*\n    Include a\nHost *\n    User default\n")

    assert (_target(config, "gpu01").user, _target(config, "gpu01").port) == ("from-a", 2200)
    assert (_target(config, "cpu01").user, _target(config, "cpu01").port) == ("default", 22)
