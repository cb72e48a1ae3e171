"""ssh_config's blocks and lookup rules, as paramiko's `SSHConfig` applies them, without paramiko.

Reading a config and looking a host up needs no SSH library, yet paramiko's package brings its
whole stack along (cryptography, PyNaCl, bcrypt, its transport and importlib.metadata): ~40 ms of
CPU at the start of every fleet command, a third of a small run. The libssh2 path
(fleet/ssh/native.py) needs none of it, so fleet keeps the lookup here, and paramiko is loaded
only for a host that connects through it.

The answers are paramiko's (tests/ssh/test_sshconfig.py compares them over random configs):
the first value of an option wins; IdentityFile accumulates (without repeats); a `Host` line's
patterns are fnmatch globs, `!` negates and a negated match vetoes the block; `Match` takes
host, originalhost, user, localuser, exec, canonical, final and all; a first pass, the
canonicalisation of the name (CanonicalizeHostname: DNS only, no CNAMEs), then the final pass,
which also expands the %-tokens paramiko expands for each option. Lines reach `parse` already
checked by fleet's reader (fleet/ssh/config.py): keywords, Match criteria, quoting.

Where it differs, it is in how long a lookup takes, never in its answer: `%l` (the local FQDN,
a DNS query) and `%C` are only computed when the value holds them; the local user is read only
when a Match criterion or a token needs it, not for every block (so where it cannot be read, no
$USER and a uid without a passwd entry, a config that never asks for it still looks up, where
paramiko's lookup failed); a Host line without quotes or escapes is split without shlex, and a
pattern without a wildcard is compared without a regular expression.
"""

from __future__ import annotations

import contextlib
import fnmatch
import getpass
import hashlib
import os
import re
import shlex
import socket
from collections.abc import Iterable
from typing import Any, TextIO

SSH_PORT = 22
# `Keyword value` or `Keyword=value`.
SETTINGS_REGEX = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")
# Options that may be given more than once, every value kept in order.
_LISTS = ("identityfile", "localforward", "remoteforward")
# Words with nothing shlex would treat specially (quotes, backslashes, other whitespace),
# separated by spaces and tabs: what nearly every Host line is.
_PLAIN_WORDS = re.compile(r"[^\"'\\\s]+(?:[ \t]+[^\"'\\\s]+)*")
GLOB_CHARS = frozenset("*?[")  # a Host pattern with none of these names one host


def split_words(value: str) -> list[str]:
    """`shlex.split(value)`, without shlex's character-by-character reader for the plain case
    (a generated config has a Host line per node: read on every command)."""
    text = value.strip(" \t")
    if _PLAIN_WORDS.fullmatch(text):
        return text.split()
    return shlex.split(value)


class ConfigParseError(ValueError):
    """A line, Host pattern list or Match criterion that cannot be parsed."""


class CouldNotCanonicalize(LookupError):
    """CanonicalizeHostname found no domain for the name and CanonicalizeFallbackLocal is no."""


class ConfigDict(dict[str, Any]):
    """A lookup's options (keys lowercase): strings, lists for IdentityFile and the forwardings,
    and None for `ProxyCommand none`."""


def _addressfamily_lookup(hostname: str, options: dict[str, Any]) -> list[Any] | None:
    """getaddrinfo for `hostname` in the AddressFamily the options ask for; None when they ask
    for none in particular, or the name does not resolve."""
    family_name = str(options.get("addressfamily", "any")).lower()
    if family_name == "any":
        return None
    family = socket.AF_INET if family_name == "inet" else socket.AF_INET6
    try:
        return socket.getaddrinfo(
            hostname, None, family, socket.SOCK_DGRAM, socket.IPPROTO_IP, socket.AI_CANONNAME
        )
    except socket.gaierror:
        return None


def _local_fqdn(options: dict[str, Any], local_hostname: str) -> str:
    for result in _addressfamily_lookup(local_hostname, options) or ():
        canonname = result[3]
        if canonname and "." in canonname:
            return str(canonname)
    return socket.getfqdn()


def _matches(name: str, pattern: str) -> bool:
    """fnmatch.fnmatch(name, pattern); a pattern without a wildcard is compared as it is,
    without compiling a regular expression for each host name of the file."""
    if GLOB_CHARS.isdisjoint(pattern):
        return os.path.normcase(name) == os.path.normcase(pattern)
    return fnmatch.fnmatch(name, pattern)


class SSHConfig:
    """A parsed ssh_config: blocks in file order, each `{"host": [patterns], "config": {...}}` or
    `{"matches": [criteria], "config": {...}}`, the first one the implicit `Host *`."""

    TOKENS_BY_CONFIG_KEY: dict[str, list[str]] = {  # noqa: RUF012 - overridden by subclasses
        "controlpath": ["%C", "%h", "%l", "%L", "%n", "%p", "%r", "%u"],
        "hostname": ["%h"],
        "identityfile": ["%C", "~", "%d", "%h", "%l", "%u", "%r"],
        "proxycommand": ["~", "%h", "%p", "%r"],
        "proxyjump": ["%h", "%p", "%r"],
        "match-exec": ["%C", "%d", "%h", "%L", "%l", "%n", "%p", "%r", "%u"],
    }

    def __init__(self) -> None:
        self._config: list[dict[str, Any]] = []

    # ------------------------------------------------------------ parsing

    def parse(self, file_obj: Iterable[str] | TextIO) -> None:
        context: dict[str, Any] = {"host": ["*"], "config": {}}
        for raw in file_obj:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = SETTINGS_REGEX.match(line)
            if match is None:
                raise ConfigParseError("an unparsable line")
            key, value = match.group(1).lower(), match.group(2)
            if key in ("host", "match"):
                self._config.append(context)
                context = {"config": {}}
                if key == "host":
                    context["host"] = self._get_hosts(value)
                else:
                    context["matches"] = self._get_matches(value)
            elif key == "proxycommand" and value.lower() == "none":
                context["config"][key] = None  # not the shell command "none"
            else:
                if value.startswith('"') and value.endswith('"'):
                    value = value[1:-1]
                if key in _LISTS:
                    context["config"].setdefault(key, []).append(value)
                elif key not in context["config"]:
                    context["config"][key] = value
        self._config.append(context)

    @staticmethod
    def _get_hosts(value: str) -> list[str]:
        try:
            return split_words(value)
        except ValueError:
            raise ConfigParseError("unbalanced quotes in a Host line") from None

    @staticmethod
    def _get_matches(value: str) -> list[dict[str, Any]]:
        """A Match line's criteria: [{"type", "param", "negate"}], checked as paramiko checks
        them (a criterion without its argument; `all` only alone or after `canonical`)."""
        matches: list[dict[str, Any]] = []
        tokens = split_words(value)
        while tokens:
            kind = tokens.pop(0)
            criterion: dict[str, Any] = {"type": kind, "param": None, "negate": False}
            if kind.startswith("!"):
                criterion["negate"] = True
                criterion["type"] = kind = kind[1:]
            if kind not in ("all", "canonical", "final"):
                if not tokens:
                    raise ConfigParseError(f"Match {kind} lacks its argument")
                criterion["param"] = tokens.pop(0)
            matches.append(criterion)
        kinds = [c["type"] for c in matches]
        if "all" in kinds:
            allowed = [k for k in kinds if k in ("all", "canonical")]
            if len(allowed) != len(kinds):
                raise ConfigParseError("Match all mixed with other criteria")
            if "canonical" in allowed and allowed.index("canonical") > allowed.index("all"):
                raise ConfigParseError("Match all before canonical")
        return matches

    # ------------------------------------------------------------ lookup

    def lookup(self, hostname: str) -> ConfigDict:
        """The options for `hostname` (see the module's docstring)."""
        options = self._lookup(hostname, ConfigDict(), canonical=False, final=False)
        options.setdefault("hostname", hostname)
        canon = options.get("canonicalizehostname") in ("yes", "always")
        maxdots = int(options.get("canonicalizemaxdots", 1))
        if canon and hostname.count(".") <= maxdots:
            domains = str(options["canonicaldomains"]).split()
            hostname = self.canonicalize(hostname, options, domains)
            options["hostname"] = hostname
            return self._lookup(hostname, options, canonical=True, final=True)
        return self._lookup(hostname, options, canonical=False, final=True)

    def _lookup(
        self, hostname: str, options: ConfigDict, canonical: bool, final: bool
    ) -> ConfigDict:
        for context in self._config:
            if not (
                self._pattern_matches(context.get("host", []), hostname)
                or self._does_match(context.get("matches", []), hostname, canonical, final, options)
            ):
                continue
            for key, value in context["config"].items():
                if key not in options:
                    options[key] = value[:] if value is not None else value
                elif key == "identityfile":
                    options[key].extend(v for v in value if v not in options[key])
        if final:
            self._expand_variables(options, hostname)
        return options

    @staticmethod
    def canonicalize(hostname: str, options: dict[str, Any], domains: list[str]) -> str:
        """The first `hostname.domain` that resolves, else `hostname` (or CouldNotCanonicalize
        when CanonicalizeFallbackLocal is no)."""
        for domain in domains:
            candidate = f"{hostname}.{domain}"
            found: Any = False
            family_specific = _addressfamily_lookup(candidate, options)
            if family_specific is not None:
                found = family_specific[0]
            else:
                with contextlib.suppress(socket.gaierror):
                    found = socket.gethostbyname(candidate)
            if found:
                return candidate
        if options.get("canonicalizefallbacklocal", "yes") == "yes":
            return hostname
        raise CouldNotCanonicalize(hostname)

    @staticmethod
    def _pattern_matches(patterns: str | list[str], target: str) -> bool:
        if isinstance(patterns, str):
            patterns = patterns.split(",")
        matched = False
        for pattern in patterns:
            if pattern.startswith("!") and _matches(target, pattern[1:]):
                return False
            if _matches(target, pattern):
                matched = True
        return matched

    def _does_match(
        self,
        match_list: list[dict[str, Any]],
        target_hostname: str,
        canonical: bool,
        final: bool,
        options: Any,
    ) -> Any:
        """The criteria that matched (truthy), or False when one did not."""
        matched: list[dict[str, Any]] = []
        local_user: str | None = None
        for criterion in match_list:
            kind, param = criterion["type"], criterion["param"]
            passed: bool | None = None
            if kind == "canonical" and self._should_fail(canonical, criterion):
                return False
            if kind == "final":
                passed = final
            elif kind == "all":
                return True
            elif kind == "host":
                host = options.get("hostname", None) or target_hostname
                passed = self._pattern_matches(param, host)
            elif kind == "originalhost":
                passed = self._pattern_matches(param, target_hostname)
            elif kind in ("user", "localuser"):
                local_user = local_user or getpass.getuser()
                user = options.get("user", None) if kind == "user" else None
                passed = self._pattern_matches(param, user or local_user)
            elif kind == "exec":
                # fleet's reader lets Match exec through only for FleetSSHConfig, which runs it.
                raise ConfigParseError("Match exec is run by fleet.ssh.config.FleetSSHConfig")
            if passed is not None and self._should_fail(passed, criterion):
                return False
            matched.append(criterion)
        return matched

    @staticmethod
    def _should_fail(would_pass: bool, criterion: dict[str, Any]) -> bool:
        return would_pass if criterion["negate"] else not would_pass

    def _tokenize(self, config: Any, target_hostname: str, key: str, value: str) -> str:
        """`value` of option `key` with the tokens paramiko expands for that option."""
        allowed = self.TOKENS_BY_CONFIG_KEY.get(key, [])
        if not allowed or ("%" not in value and "~" not in value):
            return value
        hostname = target_hostname if key == "hostname" else config.get("hostname", target_hostname)
        port = config.get("port", SSH_PORT)

        def remote_user() -> str:
            return str(config["user"]) if "user" in config else getpass.getuser()

        def local_hostname() -> str:
            return socket.gethostname().split(".")[0]

        def computed(name: str) -> str:
            """One token's value, worked out only when the value holds it (a DNS query for %l,
            the passwd entry for %u when $USER is unset)."""
            if name == "%C":
                text = local_hostname() + target_hostname + repr(port) + remote_user()
                return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - paramiko's %C
            if name == "%l":
                return _local_fqdn(config, local_hostname())
            if name in ("%d", "~"):
                return os.path.expanduser("~")
            if name == "%L":
                return local_hostname()
            if name == "%r":
                return remote_user()
            if name == "%u":
                return getpass.getuser()
            return str({"%h": hostname, "%n": target_hostname, "%p": port}[name])

        tokenized = value
        # paramiko's order: each token replaced in turn over the whole value.
        for token in ("%C", "%d", "%h", "%L", "%l", "%n", "%p", "%r", "%u", "~"):
            if token in allowed and token in tokenized:
                tokenized = tokenized.replace(token, computed(token))
        return tokenized

    def _expand_variables(self, config: ConfigDict, target_hostname: str) -> None:
        for key in config:
            value = config[key]
            if value is None:
                continue
            if isinstance(value, list):
                config[key] = [self._tokenize(config, target_hostname, key, v) for v in value]
            else:
                config[key] = self._tokenize(config, target_hostname, key, value)
