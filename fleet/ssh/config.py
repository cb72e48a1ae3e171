"""The OpenSSH client config: read (with Include), checked against what fleet can honour, and looked
up per host without walking every Host block.

Reading. paramiko's parser had no Include, echoed a line it could not parse in its error (so
`-F /etc/shadow` printed root's hash) and took any keyword. `read_config` reads the file itself,
line by line, and hands the parser (fleet/ssh/sshconfig.py) only lines it has checked:

* `Include` is expanded as OpenSSH does: relative paths are under ~/.ssh (fleet's config is a user
  config, also when given with -F), globs in lexical order, a pattern that matches nothing is
  skipped, `~`, `${VAR}` and `%d %u %i %L %l %%` expanded, nested at most MAX_INCLUDE_DEPTH deep.
  An included file's Host or Match lines end at its end: the includer's block is reopened after
  it, as OpenSSH's per-file scope does;
* `-F /dev/null` and `-F none` are OpenSSH's "no config";
* ~/.ssh/config and every Included file are refused, as OpenSSH refuses them ("Bad owner or
  permissions"), unless owned by the user or root and not writable by group or others; the file
  -F names is read as named;
* every keyword must be one OpenSSH knows (OpenSSH also refuses unknown ones), unless an earlier
  `IgnoreUnknown` names it; Match criteria must be ones paramiko evaluates; the %-tokens of
  ProxyCommand, ProxyJump and Match exec must be ones fleet expands. Errors name file:line and
  never repeat the line (it may not be an ssh_config at all).

What fleet does with each option is in OPTIONS: honoured, harmless to ignore (with the reason), or
refused when it applies to a host fleet connects to (`refusal`), because ignoring it would change
where or how fleet connects. Everything else fleet gets from a lookup follows paramiko's rules
(fleet/ssh/sshconfig.py: first value wins, IdentityFile accumulates, Match, canonicalisation).

Lookup. paramiko's `SSHConfig.lookup` (and sshconfig.py's, which answers the same) tests every
block of the file against the host, twice (a first pass, then the final one), with fnmatch.
Cluster configs are often generated with one `Host` block per node, so a run over N nodes costs
N x N block tests: at 128 nodes that would be half of fleet's client CPU in the benchmark's
profile.

`IndexedSSHConfig` gives the same answers faster: a block whose Host patterns are all plain names
(no `*`, `?`, `[`, no `!`) can only apply to a host of one of those names, so it is indexed by
name. A lookup hands the parser only the blocks that could apply (the indexed ones for this name,
cut down to that name, plus every block with a wildcard, a negation or a Match), in file order,
and the lookup rules do the rest. With CanonicalizeHostname anywhere in the file the host name can
change between the passes, so such a file is looked up whole.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fleet.core import trust, userpath
from fleet.core.digits import is_digits
from fleet.core.errors import ConfigError
from fleet.ssh import workdir
from fleet.ssh.sshconfig import GLOB_CHARS, SETTINGS_REGEX, ConfigDict, SSHConfig, split_words

MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
MAX_BYTES = 64 * 1024 * 1024  # a generated config for 100k nodes is ~10 MB
NO_CONFIG = frozenset({"/dev/null", "none"})
_TOKEN = re.compile(r"%(.)")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
CONFIG_HINT = "fix the line, or give fleet a config of its own with -F (-F /dev/null: none)"

# ---------------------------------------------------------------- what fleet does with options

HONOURED = "honoured"
HARMLESS = "harmless"
REFUSED = "refused"


@dataclass(frozen=True)
class Option:
    """An ssh_config keyword: its spelling, what fleet does with it, and why.

    `refused_if` picks the values fleet cannot honour (None: every value); the others are fine."""

    name: str
    handling: str
    why: str
    refused_if: Callable[[str], bool] | None = None

    def refuses(self, value: str) -> bool:
        if self.handling != REFUSED:
            return False
        return self.refused_if is None or self.refused_if(value.strip().lower())


def _options(handling: str, why: str, names: str, **kw: Any) -> dict[str, Option]:
    return {n.lower(): Option(n, handling, why, **kw) for n in names.split()}


# IdentityAgent values fleet honours: no agent, or the one in $SSH_AUTH_SOCK (paramiko's).
IDENTITY_AGENT_OK = frozenset({"none", "ssh_auth_sock", "$ssh_auth_sock", "${ssh_auth_sock}"})
_ALGORITHMS_WHY = (
    "only paramiko's algorithms in the listed set are negotiated (paramiko cannot add others)"
)
OPTIONS: dict[str, Option] = {
    **_options(HONOURED, "scopes the options that follow", "Host Match"),
    **_options(HONOURED, "read, see above", "Include IgnoreUnknown"),
    **_options(
        HONOURED,
        "where and as whom fleet connects (inventory settings win)",
        "HostName Port User IdentityFile ConnectTimeout",
    ),
    **_options(HONOURED, "fleet runs it, OpenSSH's way", "ProxyCommand ProxyJump"),
    **_options(
        HONOURED,
        "host key checking",
        "StrictHostKeyChecking UserKnownHostsFile GlobalKnownHostsFile HostKeyAlias",
    ),
    **_options(
        HONOURED,
        "paramiko canonicalises as OpenSSH does (it does not follow CNAMEs)",
        "CanonicalizeHostname CanonicalDomains CanonicalizeFallbackLocal CanonicalizeMaxDots "
        "CanonicalizePermittedCNAMEs",
    ),
    **_options(
        HONOURED,
        "applies to fleet's direct TCP connections (the first hop)",
        "AddressFamily BindAddress",
    ),
    **_options(
        HONOURED,
        _ALGORITHMS_WHY,
        "Ciphers MACs KexAlgorithms HostKeyAlgorithms PubkeyAcceptedAlgorithms "
        "PubkeyAcceptedKeyTypes",
    ),
    **_options(
        HONOURED,
        "as ssh: the IdentityFiles (or the default ones) are offered, ssh-agent's keys only "
        "when they are one of those, and ~/.ssh is never scanned when any are listed",
        "IdentitiesOnly",
    ),
    **_options(
        HONOURED,
        "the certificate goes with the identity it certifies (KEY-cert.pub beside an "
        "IdentityFile is used too, as ssh does)",
        "CertificateFile",
    ),
    **_options(
        HARMLESS,
        "fleet authenticates with keys and ssh-agent only and never prompts: a host that needs "
        "another method fails as 'authentication failed', never reached another way",
        "BatchMode PasswordAuthentication KbdInteractiveAuthentication KbdInteractiveDevices "
        "ChallengeResponseAuthentication NumberOfPasswordPrompts PreferredAuthentications "
        "PubkeyAuthentication HostbasedAuthentication GSSAPIAuthentication "
        "GSSAPIDelegateCredentials GSSAPIKeyExchange GSSAPIClientIdentity GSSAPIServerIdentity "
        "GSSAPIRenewalForcesRekey GSSAPITrustDns GSSAPIKexAlgorithms HostbasedAcceptedAlgorithms "
        "HostbasedKeyTypes EnableSSHKeysign CASignatureAlgorithms SecurityKeyProvider "
        "AddKeysToAgent UseKeychain",
    ),
    **_options(
        HARMLESS,
        "fleet opens no forwardings, tunnels, X11 or agent forwarding: these add channels to an "
        "interactive session and change neither the destination nor the login",
        "LocalForward RemoteForward DynamicForward ClearAllForwardings ExitOnForwardFailure "
        "GatewayPorts PermitRemoteOpen StreamLocalBindMask StreamLocalBindUnlink ForwardAgent "
        "ForwardX11 ForwardX11Timeout ForwardX11Trusted XAuthLocation Tunnel TunnelDevice",
    ),
    **_options(
        HARMLESS,
        "fleet makes its own connections (one per host, one per jump host), never through a "
        "master socket; the destination and login are the same",
        "ControlMaster ControlPath ControlPersist",
    ),
    **_options(
        HARMLESS,
        "about an interactive session; fleet runs its own steps, without a TTY or local command",
        "RequestTTY RemoteCommand LocalCommand PermitLocalCommand SessionType StdinNull "
        "ForkAfterAuthentication EscapeChar EnableEscapeCommandline ObscureKeystrokeTiming",
    ),
    **_options(
        HARMLESS,
        "fleet passes environment on the command line (inventory vars, --env); sshd drops "
        "most SSH environment requests anyway (AcceptEnv)",
        "SendEnv SetEnv",
    ),
    **_options(
        HARMLESS,
        "fleet has its own liveness check (15 s of silence, then 30 s for a reply) and retries",
        "ServerAliveInterval ServerAliveCountMax TCPKeepAlive ConnectionAttempts",
    ),
    **_options(
        HARMLESS,
        "fleet checks host keys against known_hosts only, which is at least as strict",
        "CheckHostIP VerifyHostKeyDNS NoHostAuthenticationForLocalhost UpdateHostKeys "
        "HashKnownHosts",
    ),
    **_options(
        HARMLESS,
        "logging, performance or display only",
        "LogLevel LogVerbose SyslogFacility VisualHostKey FingerprintHash Compression IPQoS "
        "RekeyLimit ChannelTimeout Tag WarnWeakCrypto",
    ),
    **_options(
        HARMLESS,
        "deprecated; OpenSSH ignores it too",
        "Protocol Cipher UseRoaming UsePrivilegedPort RSAAuthentication RhostsRSAAuthentication "
        "RhostsAuthentication CompressionLevel FallBackToRsh UseRsh DSAAuthentication "
        "SKeyAuthentication TISAuthentication KerberosAuthentication KerberosTGTPassing "
        "AFSTokenPassing UserKnownHostsFile2 GlobalKnownHostsFile2",
    ),
    **_options(
        REFUSED,
        "fleet cannot run a KnownHostsCommand, so it would check host keys against other keys",
        "KnownHostsCommand",
        refused_if=lambda v: v != "none",
    ),
    **_options(
        REFUSED,
        "fleet cannot check a key revocation list: a revoked host key would be accepted",
        "RevokedHostKeys",
        refused_if=lambda v: v != "none",
    ),
    **_options(
        REFUSED,
        "fleet cannot use PKCS#11 tokens",
        "PKCS11Provider SmartcardDevice",
        refused_if=lambda v: v != "none",
    ),
    **_options(
        REFUSED,
        "fleet cannot receive a connected socket from the proxy command",
        "ProxyUseFdpass",
        refused_if=lambda v: v in {"yes", "true"},
    ),
    **_options(
        REFUSED,
        "fleet uses the agent at $SSH_AUTH_SOCK (paramiko's), or none: it cannot use another "
        "agent socket",
        "IdentityAgent",
        refused_if=lambda v: v not in IDENTITY_AGENT_OK,
    ),
    **_options(
        REFUSED,
        "the config says not to connect to this host",
        "RefuseConnection",
        refused_if=lambda v: v in {"yes", "true"},
    ),
    **_options(
        REFUSED,
        "fleet cannot bind its connections to a network interface",
        "BindInterface",
    ),
    **_options(
        REFUSED,
        "fleet cannot enforce a minimum RSA key size",
        "RequiredRSASize",
        refused_if=lambda v: not is_digits(v) or int(v) > 1024,
    ),
}

# Match criteria paramiko evaluates; the other OpenSSH ones it would treat as matching.
_MATCH_OK = frozenset(
    {"all", "canonical", "final", "host", "originalhost", "user", "localuser", "exec"}
)
_MATCH_OPENSSH = frozenset({"tagged", "localnetwork", "version", "sessiontype", "command"})
# %-tokens fleet expands (OpenSSH's TOKENS section): ProxyCommand/ProxyJump, and Match exec.
PROXY_TOKENS = frozenset("%hnpr")
_EXEC_TOKENS = frozenset("%dhLlnpru")
_INCLUDE_TOKENS = frozenset("%duiLl")


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class Origin:
    """Where a line came from, for messages."""

    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class _Reader:
    """Collects the checked lines of a config and its includes, with their origins."""

    def __init__(self, home: Path, environ: Mapping[str, str] | None = None) -> None:
        self.home = home
        # The environment Include's ${VAR}s read: the fleet command's (a keeper's own is that
        # of the command that started it, fleet/ssh/warm.py).
        self.environ = os.environ if environ is None else environ
        self.lines: list[str] = []
        # Per paramiko block (0: the implicit leading one), where each key was first set.
        self.block_origins: list[dict[str, Origin]] = [{}]
        self.ignore_unknown: list[str] = []

    def emit(self, text: str, origin: Origin, key: str) -> None:
        self.lines.append(text)
        if key in ("host", "match"):
            self.block_origins.append({})
        else:
            self.block_origins[-1].setdefault(key, origin)

    def read(
        self,
        path: Path,
        depth: int,
        inherited: tuple[str, Origin] | None = None,
        checked: bool = True,
    ) -> None:
        """Check and emit every line of `path`, expanding Include in place. `checked`: refuse
        the file unless it passes OpenSSH's owner and mode check (every file but -F's)."""
        # The open Host/Match line: the includer's until this file has one of its own.
        header = inherited
        for number, raw in enumerate(_read_text(path, checked).splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            origin = Origin(path, number)
            match = SETTINGS_REGEX.match(line)
            if match is None:
                raise ConfigError(
                    f"{origin}: not an ssh_config line (expected 'Keyword value')",
                    hint="is -F / FLEET_SSH_CONFIG pointing at an OpenSSH client config?",
                )
            key, value = match.group(1).lower(), match.group(2).strip()
            if key == "include":
                self.include(value, origin, depth, header)
                # The included file's Host/Match ended with it: reopen this file's block.
                text, at = header if header else ("Host *", origin)
                self.emit(text, at, "host")
                continue
            self.check(key, value, origin)
            if key in ("host", "match"):
                header = (line, origin)
            elif key == "ignoreunknown":
                self.ignore_unknown += value.replace(",", " ").split()
            self.emit(line, origin, key)

    def include(
        self, value: str, origin: Origin, depth: int, header: tuple[str, Origin] | None
    ) -> None:
        """Expand one Include line (several patterns, globs) into the files it names."""
        if depth >= MAX_INCLUDE_DEPTH:
            raise ConfigError(
                f"{origin}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a loop?)",
                hint="an included file includes itself, directly or through others",
            )
        try:
            patterns = split_words(value)
        except ValueError:
            raise ConfigError(f"{origin}: Include: unbalanced quotes", hint=CONFIG_HINT) from None
        for pattern in patterns:
            expanded = os.path.expanduser(_include_tokens(pattern, origin, self.home, self.environ))
            if not os.path.isabs(expanded):
                expanded = str(self.home / ".ssh" / expanded)
            for name in sorted(glob.glob(expanded)):
                self.read(Path(name), depth + 1, header)

    def check(self, key: str, value: str, origin: Origin) -> None:
        """Refuse what fleet cannot read correctly: unknown keywords, Match criteria paramiko
        does not evaluate, %-tokens fleet does not expand."""
        option = OPTIONS.get(key)
        if option is None:
            if any(fnmatch.fnmatch(key, p.lower()) for p in self.ignore_unknown):
                return
            # Not named: the "keyword" may be the first word of some other file's line.
            raise ConfigError(
                f"{origin}: not an OpenSSH client option",
                hint="check its spelling (OpenSSH refuses it too), or list it under "
                "IgnoreUnknown before it; is -F pointing at an ssh_config?",
            )
        if key == "host":
            try:
                split_words(value)
            except ValueError:
                raise ConfigError(f"{origin}: Host: unbalanced quotes", hint=CONFIG_HINT) from None
        elif key == "match":
            _check_match(value, origin)
        elif key in ("proxycommand", "proxyjump"):
            check_tokens(value, PROXY_TOKENS, option.name, origin)


def _check_match(value: str, origin: Origin) -> None:
    """Match criteria paramiko evaluates correctly (it treats unknown ones as matching)."""
    try:
        criteria = SSHConfig._get_matches(value)
    except ValueError:
        raise ConfigError(
            f"{origin}: Match: a criterion lacks its argument, or 'all' is mixed with others",
            hint=CONFIG_HINT,
        ) from None
    for criterion in criteria:
        kind = criterion["type"].lower()
        if kind in _MATCH_OPENSSH:
            raise ConfigError(
                f"{origin}: Match {kind}: fleet cannot evaluate this criterion",
                hint="use Host patterns for fleet's hosts, or give fleet its own config with -F",
            )
        if kind not in _MATCH_OK:
            raise ConfigError(f"{origin}: Match: unknown criterion", hint=CONFIG_HINT)
        if kind == "exec":
            check_tokens(criterion["param"], _EXEC_TOKENS, "Match exec", origin)


def check_tokens(value: str, allowed: frozenset[str], what: str, origin: Origin) -> None:
    """Every `%x` in `value` is one fleet expands (OpenSSH stops on an unknown one too)."""
    for token in _TOKEN.findall(value):
        if token not in allowed:
            shown = token if token.isalnum() else "?"
            raise ConfigError(
                f"{origin}: {what}: unknown token %{shown}",
                hint=f"{what} takes %% and %" + " %".join(sorted(allowed - {"%"})),
            )


def _include_tokens(pattern: str, origin: Origin, home: Path, environ: Mapping[str, str]) -> str:
    """`~`-less expansion of Include's tokens and ${VAR}s (from `environ`)."""
    check_tokens(pattern, _INCLUDE_TOKENS, "Include", origin)
    local = socket.gethostname()
    values = {
        "%": "%",
        "d": str(home),
        "u": _local_user(),
        "i": str(os.getuid()),
        "L": local.split(".")[0],
        "l": local,
    }
    expanded = _TOKEN.sub(lambda m: values[m.group(1)], pattern)

    def env(m: re.Match[str]) -> str:
        if m.group(1) not in environ:
            raise ConfigError(
                f"{origin}: Include: environment variable {m.group(1)} is not set",
                hint="set it, or write the path out",
            )
        return environ[m.group(1)]

    return _ENV.sub(env, expanded)


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _open(path: Path, checked: bool) -> BinaryIO:
    """Open a config file; `checked`: as OpenSSH opens ~/.ssh/config and every Included file,
    refusing one owned by someone other than the user or root, or writable by others (on the
    open file: fleet.core.trust). A ProxyCommand or Match exec line in it runs on the bastion."""
    if not checked:
        return path.open("rb")
    try:
        return trust.open_checked(path, directories=False)
    except trust.Untrusted as exc:
        raise ConfigError(
            f"{path}: bad owner or permissions: {exc.reason}",
            hint=f"chown it to yourself and chmod go-w {path}; ssh refuses it too",
        ) from None


def _read_text(path: Path, checked: bool = True) -> str:
    """A config file's text; errors name the file and the problem, never its contents."""
    try:
        with _open(path, checked) as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: ssh config not found", hint="check -F/--ssh-config or FLEET_SSH_CONFIG"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory, not an ssh config", hint="name the config file itself"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{path}: permission denied", hint="check the file's owner and mode"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read: {exc.strerror or type(exc).__name__}", hint=CONFIG_HINT
        ) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB, not an ssh config",
            hint="check -F/--ssh-config or FLEET_SSH_CONFIG",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (invalid byte at offset {exc.start})",
            hint="check -F/--ssh-config or FLEET_SSH_CONFIG: this is not an ssh config",
        ) from None


class FleetSSHConfig(SSHConfig):
    """ssh_config's lookup (fleet.ssh.sshconfig, paramiko's rules), minus the %-expansion of
    ProxyCommand and ProxyJump (fleet expands those itself, with the final port and user and with
    shell quoting), and with Match exec run fleet's way: values shell-quoted (a host name from the
    inventory must not run as a command), through /bin/sh with stdin, stdout and stderr closed to
    it (paramiko's invoke.run read fleet's own stdin), after the criteria before it passed (as
    OpenSSH), once per command."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.exec_cache: dict[str, bool] = {}
        self.environ = environ  # Match exec's environment: the fleet command's (None: ours)

    def _does_match(
        self,
        match_list: list[dict[str, Any]],
        target_hostname: str,
        canonical: bool,
        final: bool,
        options: Any,
    ) -> Any:
        others: list[dict[str, Any]] = []
        for criterion in match_list:
            if criterion["type"] != "exec":
                others.append(criterion)
                continue
            if others and not super()._does_match(
                others, target_hostname, canonical, final, options
            ):
                return False
            command = self._tokenize(options, target_hostname, "match-exec", criterion["param"])
            if self._exec(command) == criterion["negate"]:
                return False
        if not others:
            return list(match_list)
        return super()._does_match(others, target_hostname, canonical, final, options)

    def _exec(self, command: str) -> bool:
        """True if `command` exits 0 (cached: a run looks every host up more than once). It
        runs in the directory the command was started in, as ssh runs it, also from a keeper,
        which has left it (fleet/ssh/workdir.py)."""
        if command not in self.exec_cache:
            import subprocess  # only for a config with `Match exec`: it loads ~3 ms of modules

            cwd = workdir.here()
            try:
                done = subprocess.run(
                    ["/bin/sh", "-c", command],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=False,
                    cwd=cwd,
                    env=self.environ,
                )
            except OSError as exc:  # never the command itself: it may name a secret
                why = workdir.gone(cwd) if cwd and not workdir.exists(cwd) else exc.strerror
                raise ConfigError(
                    f"Match exec: cannot run its command: {why or exc}",
                    hint="run fleet from a directory that exists, or pass --persist 0",
                ) from None
            self.exec_cache[command] = done.returncode == 0
        return self.exec_cache[command]

    TOKENS_BY_CONFIG_KEY = {  # noqa: RUF012 - the base class's attribute, overridden
        k: v
        for k, v in SSHConfig.TOKENS_BY_CONFIG_KEY.items()
        if k not in ("proxycommand", "proxyjump")
    }

    def _tokenize(self, config: Any, target_hostname: str, key: str, value: str) -> str:
        if key != "match-exec":
            return super()._tokenize(config, target_hostname, key, value)
        local = socket.gethostname()
        values = {
            "d": os.path.expanduser("~"),
            "h": str(config.get("hostname", target_hostname)),
            "L": local.split(".")[0],
            "l": local,
            "n": target_hostname,
            "p": str(config.get("port", 22)),
            "r": str(config.get("user", _local_user())),
            "u": _local_user(),
        }
        return expand_tokens(value, values, quote=True)


def expand_tokens(value: str, values: Mapping[str, str], quote: bool) -> str:
    """OpenSSH's %-expansion in one pass (`%%` is `%`, so `%%h` stays `%h`); with `quote`,
    each value is shell-quoted: it goes into a command line."""

    def one(m: re.Match[str]) -> str:
        letter = m.group(1)
        if letter == "%":
            return "%"
        text = values[letter]
        return shlex.quote(text) if quote else text

    return _TOKEN.sub(one, value)


def read_config(
    path: Path | None, home: Path | None = None, environ: Mapping[str, str] | None = None
) -> IndexedSSHConfig:
    """The config fleet uses: `path` (-F), else ~/.ssh/config if it exists, else none.
    `environ`: the fleet command's environment (None: this process's), which Include's ${VAR}s
    and Match exec see: a keeper reads the config of every command it serves in that command's
    environment, not in the one of the command that started it."""
    home = home or Path(os.path.expanduser("~"))
    reader = _Reader(home, environ)
    if path is not None and str(path) in NO_CONFIG:
        return IndexedSSHConfig(FleetSSHConfig(environ), reader.block_origins)
    if path is None:
        chosen = home / ".ssh" / "config"
        if not chosen.exists():
            return IndexedSSHConfig(FleetSSHConfig(environ), reader.block_origins)
    else:
        # -F's relative path is the command's (fleet/ssh/workdir.py: a keeper has left it).
        given = str(userpath.expand(path, "ssh config "))
        chosen = Path(workdir.absolute(given))
        base = workdir.here() if not os.path.isabs(given) else None
        if base is not None and not workdir.exists(base):
            raise ConfigError(
                f"{chosen}: ssh config not found: {workdir.gone(base)}",
                hint="run fleet from a directory that exists, or name the config by its "
                "absolute path",
            )
    reader.read(chosen, 0, checked=path is None)
    config = FleetSSHConfig(environ)
    try:
        config.parse(io.StringIO("\n".join(reader.lines) + "\n"))
    except ValueError:  # checked above; a backstop (ConfigParseError is one)
        raise ConfigError(f"{chosen}: cannot parse ssh config", hint=CONFIG_HINT) from None
    return IndexedSSHConfig(config, reader.block_origins)


# ---------------------------------------------------------------- lookup


def _plain_names(block: dict[str, Any]) -> list[str] | None:
    """The names a Host block applies to, if it only lists plain names; else None."""
    if "matches" in block or "host" not in block:
        return None
    patterns = block["host"]
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    names = []
    for pattern in patterns:
        if not pattern or pattern.startswith("!") or GLOB_CHARS & set(pattern):
            return None
        names.append(pattern)
    return names


class IndexedSSHConfig:
    """A parsed ssh config whose `lookup(hostname)` equals paramiko's, in time independent of the
    number of plain-name Host blocks; `origin` says which file:line set an option for a host."""

    def __init__(self, config: SSHConfig, origins: list[dict[str, Origin]] | None = None) -> None:
        self.config = config
        blocks = getattr(config, "_config", None)
        self._blocks: list[dict[str, Any]] = blocks if isinstance(blocks, list) else []
        self._origins = origins if origins and len(origins) == len(self._blocks) else None
        self._by_name: dict[str, list[int]] = {}
        self._always: list[int] = []
        self._exec_cache: dict[str, bool] = getattr(config, "exec_cache", {})
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

    def _candidates(self, hostname: str) -> list[tuple[int, dict[str, Any]]]:
        """The blocks that could apply to `hostname`, in file order."""
        if not self._indexed:
            return list(enumerate(self._blocks))
        named = self._by_name.get(hostname, [])
        blocks = [(i, self._blocks[i]) for i in self._always]
        # A plain-name block that lists this host applies to it just as a block naming only it
        # does; paramiko would test every name of it (a generated `Host node01 ... node999`).
        blocks += [(i, {**self._blocks[i], "host": [hostname]}) for i in named]
        return sorted(blocks, key=lambda ib: ib[0])

    def _lookup_in(self, blocks: list[tuple[int, dict[str, Any]]], hostname: str) -> ConfigDict:
        subset = type(self.config)()
        subset._config = [b for _, b in blocks]
        if isinstance(subset, FleetSSHConfig) and isinstance(self.config, FleetSSHConfig):
            subset.exec_cache = self._exec_cache
            subset.environ = self.config.environ
        return subset.lookup(hostname)

    def lookup(self, hostname: str) -> ConfigDict:
        if not self._indexed:
            return self.config.lookup(hostname)
        return self._lookup_in(self._candidates(hostname), hostname)

    def origin(self, hostname: str, key: str) -> Origin | None:
        """The file:line whose value of `key` a lookup of `hostname` returns (first value wins,
        so it is the first block, in file order, after which the lookup has it)."""
        if self._origins is None:
            return None
        blocks = self._candidates(hostname)
        lo, hi = 1, len(blocks)
        if not blocks or key not in self._lookup_in(blocks, hostname):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if key in self._lookup_in(blocks[:mid], hostname):
                hi = mid
            else:
                lo = mid + 1
        return self._origins[blocks[lo - 1][0]].get(key)


def refusal(
    config: IndexedSSHConfig, lookup_name: str, options: Mapping[str, Any], what: str
) -> ConfigError | None:
    """The error for the first option in `options` (a lookup of `lookup_name`) that fleet
    cannot honour, naming the file:line that set it; None when there is none."""
    for key, value in options.items():
        option = OPTIONS.get(key)
        if option is None or not isinstance(value, str) or not option.refuses(value):
            continue
        origin = config.origin(lookup_name, key)
        where = f"{origin}: " if origin else ""
        return ConfigError(
            f"{where}{option.name} (applies to {what}): fleet cannot honour it: {option.why}",
            hint="remove it from the Host/Match block that covers this host, or give fleet a "
            "config of its own with -F",
        )
    return None


# paramiko's names for the algorithm lists ssh_config restricts (PubkeyAcceptedKeyTypes is the
# old name of PubkeyAcceptedAlgorithms).
_ALGORITHM_LISTS = {
    "ciphers": "ciphers",
    "macs": "macs",
    "kexalgorithms": "kex",
    "hostkeyalgorithms": "keys",
    "pubkeyacceptedalgorithms": "pubkeys",
    "pubkeyacceptedkeytypes": "pubkeys",
}


def disabled_algorithms(
    config: IndexedSSHConfig, lookup_name: str, options: Mapping[str, Any]
) -> dict[str, list[str]]:
    """OpenSSH's algorithm lists as paramiko's `disabled_algorithms`: a plain list allows only
    what it names (wildcards too), `-list` removes from the defaults, `+list` and `^list` add or
    reorder (paramiko cannot add algorithms, so nothing is removed). A list that leaves none of
    paramiko's algorithms is refused: fleet could not connect the way the config demands."""
    out: dict[str, list[str]] = {}
    for key, kind in _ALGORITHM_LISTS.items():
        value = options.get(key)
        if not isinstance(value, str) or not value or kind in out or value[0] in "+^":
            continue  # `+list`, `^list` (common: HostKeyAlgorithms +ssh-rsa) remove nothing
        from fleet.ssh.library import paramiko  # only here: a host that limits algorithms

        preferred: tuple[str, ...] = getattr(paramiko.Transport, f"_preferred_{kind}")
        patterns = [p for p in value.lstrip("+-^").split(",") if p]
        named = [a for a in preferred if any(fnmatch.fnmatchcase(a, p) for p in patterns)]
        disabled = named if value[0] == "-" else [a for a in preferred if a not in named]
        if len(disabled) == len(preferred):
            origin = config.origin(lookup_name, key)
            raise ConfigError(
                f"{origin or lookup_name}: {OPTIONS[key].name}: none of these algorithms is one "
                "fleet's SSH library (paramiko) offers",
                hint="available: " + ",".join(preferred),
            )
        out[kind] = disabled
    return out
