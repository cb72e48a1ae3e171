"""Host patterns (`--limit`), resolved as Ansible resolves them, plus fleet's host ranges.

From Ansible (`ansible -i INV PATTERN`): terms separated by `,` (or by `:` when there is no
comma), `&term` intersects, `!term` excludes (plain terms first, then `&`, then `!`; only `&`/`!`
terms start from all hosts); a term is a host or group name, a glob (`*`, `?`, `[chars]`) over
group and host names, `~regex` (matched from the start of group and host names), `all` or `*`;
`term[0]`, `term[-1]`, `term[1:3]`, `term[2:]` pick hosts by position in what `term` matches.

fleet adds host ranges, `gpu[01-04]`, `gpu[01:04]`, `gpu[01-04,09]` (commas inside brackets do
not separate terms), which select the named hosts that exist. Where a term reads both ways
(`gpu[01:02]` when `gpu` is a group: hosts gpu01, gpu02 or the group's second and third host)
and the two readings select different hosts, the term is refused as ambiguous.

Stricter than Ansible: a term that matches nothing, or an empty term, is an error (Ansible warns
and goes on), so a typo in `!gpu07` cannot leave gpu07 selected. A pattern that cannot be read
(empty, an empty term, a bracket without its pair, a bad regex or range) is a usage error
(exit 2), as a bad -w node set is; Ansible drops what it cannot split, which read `-l ':'` as
every host.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from fleet.core import nodeset
from fleet.core.errors import InventoryError, UsageError

# Ansible's PATTERN_WITH_SUBSCRIPT: `expr[3]`, `expr[-1]`, `expr[1:3]`, `expr[2:]`, `expr[1-3]`.
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
# Every character of a pattern, in one of these: a run of name characters, a whole [...], a
# separator, a run of whitespace, or a bracket left over (unbalanced).
_CHUNK = re.compile(r"[^\[\],:\s]+|\[[^\]]*\]|[,:]|\s+|[\[\]]")
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
_GLOB = frozenset("*?[")
_RANGE_LIKE = re.compile(r"^[\w.\-]*(?:\[[\w:,/\-]*\][\w.\-]*)+$")
_HOST_TOO = frozenset(".?*[")  # Ansible also matches hosts when the pattern has one of these


class PatternInventory(Protocol):
    """What patterns are resolved against."""

    @property
    def path(self) -> object: ...

    @property
    def groups(self) -> Mapping[str, Sequence[str]]: ...

    @property
    def group_hosts(self) -> Mapping[str, Sequence[str]]: ...

    @property
    def children(self) -> Mapping[str, Sequence[str]]: ...

    @property
    def host_index(self) -> Mapping[str, int]: ...


def groups_hint(groups: Mapping[str, Sequence[str]]) -> str:
    """A short list of group names for hints."""
    names = sorted(groups)
    shown = ", ".join(names[:12])
    return shown + (f" (+{len(names) - 12} more)" if len(names) > 12 else "")


def split(limit: str) -> list[str]:
    """Terms of a pattern: commas outside brackets separate them; with no such comma, Ansible's
    `:` (and whitespace) separators apply, unless the whole is one `name:port` or IPv6 address.

    Every character is accounted for: an empty pattern or term, or a bracket without its pair,
    is a usage error. Ansible drops what its splitter cannot read, so `-l ':'` or `-l '~['` was
    no term at all, which select() read as every host."""
    whole = limit.strip()
    if not whole:
        raise UsageError(
            "--limit: empty pattern",
            hint="name hosts or groups, e.g. -l 'gpu,!gpu03'; every host is -l all",
        )
    chunks = _chunks(whole)
    if "," in chunks:
        terms = _comma_terms(limit, chunks)
    elif _HOST_PORT.match(whole) or _ipv6(whole):
        terms = [whole]
    else:
        terms = _colon_terms(limit, chunks)
    for term in terms:
        _check_term(limit, term)
    return terms


def _chunks(text: str) -> list[str]:
    """`text` as runs of name characters, whole `[...]` groups (Ansible's bracket rule: from `[`
    to the next `]`), separators and runs of whitespace, so separators inside brackets are not
    seen; a `[` with no `]` after it, or a `]` with no `[` before it, is refused naming its term."""
    chunks: list[str] = []
    start = 0  # where the current term began
    for match in _CHUNK.finditer(text):
        chunk = match.group()
        if chunk in ("[", "]"):
            raise _unbalanced(text, start, match.start(), "," if chunk == "[" else ",:")
        if chunk in (",", ":") or chunk.isspace():
            start = match.end()
        chunks.append(chunk)
    return chunks


def _unbalanced(text: str, start: int, at: int, stops: str) -> UsageError:
    """The error for the bracket at `at`, naming its term: from `start` to the next of `stops`
    or whitespace (an unclosed `[` runs on past a `:`, as a range's colon would be inside it)."""
    end = at + 1
    while end < len(text) and text[end] not in stops and not text[end].isspace():
        end += 1
    return UsageError(
        f"--limit: unbalanced bracket in '{text[start:end]}'",
        hint="brackets pair up: ranges gpu[01-04], subscripts gpu[0], classes ~gpu0[12]",
    )


def _comma_terms(limit: str, chunks: list[str]) -> list[str]:
    """The `,`-separated form: each term stripped, none empty, none also using `:` or spaces."""
    terms: list[str] = []
    current: list[str] = []
    for chunk in [*chunks, ","]:
        if chunk != ",":
            current.append(chunk)
            continue
        term = "".join(current).strip()
        if not term:
            raise _empty_term(limit)
        if ":" in current or any(c.isspace() for c in term):
            raise UsageError(
                f"--limit term '{term}' mixes ',' with ':' or spaces",
                hint="separate terms one way: 'a,b,!c' or 'a:b:!c'",
            )
        terms.append(term)
        current = []
    return terms


def _colon_terms(limit: str, chunks: list[str]) -> list[str]:
    """Ansible's `:`-separated form (whitespace separates too): a `:` with no term before it,
    since the start or the last `:`, or none after it at the end, leaves an empty term."""
    terms: list[str] = []
    current = ""
    filled = False  # a term since the start or the last ':'
    for chunk in chunks:
        if chunk == ":" or chunk.isspace():
            if current:
                terms.append(current)
                current = ""
            elif chunk == ":" and not filled:
                raise _empty_term(limit)
            if chunk == ":":
                filled = False
        else:
            current += chunk
            filled = True
    if current:
        terms.append(current)
    elif not filled:
        raise _empty_term(limit)
    return terms


def _check_term(limit: str, term: str) -> None:
    """A term is more than its `&`/`!`, and a `~` has a regex after it: `-l "!$HOST"` or
    `-l "~$RE"` with an empty variable would otherwise exclude nothing or select every host."""
    body = term[1:] if term.startswith(("&", "!")) else term
    if not body.strip():
        raise _empty_term(limit)
    if body == "~":
        raise UsageError(
            f"--limit term '{term}' has no regular expression after '~'",
            hint="write e.g. ~gpu0[1-4]; every host is -l all",
        )


def _empty_term(limit: str) -> UsageError:
    return UsageError(
        f"--limit '{limit}' has an empty term", hint="write e.g. --limit 'gpu,!gpu03'"
    )


def _ipv6(text: str) -> bool:
    """An IPv6 address is one host name, not terms split at its colons (as Ansible reads it);
    `::` alone, though an address, is no host's name: two empty terms."""
    if not text.strip(":"):
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def select(inv: PatternInventory, limit: str) -> set[str]:
    """The names of the hosts `limit` selects (only `&`/`!` terms start from every host)."""
    terms = split(limit)
    plain = [t for t in terms if not t.startswith(("&", "!"))]
    both = [t for t in terms if t.startswith("&")]
    minus = [t for t in terms if t.startswith("!")]
    chosen: set[str] = set()
    for term in plain or ["all"]:
        chosen |= _term(inv, term, plain=True)
    for term in both:
        chosen &= _term(inv, term[1:], plain=False)
    for term in minus:
        chosen -= _term(inv, term[1:], plain=False)
    return chosen


def _term(inv: PatternInventory, term: str, plain: bool) -> set[str]:
    """The hosts one term selects."""
    if plain and term in inv.host_index:  # Ansible: a plain term naming a host is that host
        return {term}
    ranged, broken = _range_reading(inv, term)
    ansible = None if _bracket_comma(term) else _ansible_reading(inv, term)
    if ranged and ansible and ranged != set(ansible):
        raise InventoryError(
            f"--limit term '{term}' is ambiguous: as host names it is {nodeset.fold(ranged)}, "
            f"as Ansible reads it {nodeset.fold(ansible)}",
            hint="name the hosts another way (a list 'gpu01,gpu02' or a glob)",
        )
    found = ranged or set(ansible or ())
    if not found and broken is not None and _RANGE_LIKE.match(term):
        # Like -w's bad range: the command line is wrong whatever the inventory holds.
        raise UsageError(f"--limit: {broken}", hint="ranges look like gpu[01-16]")
    if not found:
        raise InventoryError(
            f"{inv.path}: --limit term '{term}' matches no host or group",
            hint="groups: " + groups_hint(inv.groups),
        )
    return found


def _bracket_comma(term: str) -> bool:
    """`gpu[01,03]`: fleet's list form, which Ansible would have split at the comma."""
    return bool(re.search(r"\[[^\]]*,", term))


def _range_reading(inv: PatternInventory, term: str) -> tuple[set[str], str | None]:
    """fleet's reading of a bracketed term: the named hosts that exist, and why it is not a
    range when it looks like one but is not (a subscript or glob may still read it)."""
    if "[" not in term or term.startswith("~") or any(c in term for c in "*?"):
        return set(), None
    try:
        names = nodeset.expand(term)
    except nodeset.RangeError as exc:
        return set(), str(exc)
    return {n for n in names if n in inv.host_index}, None


def _ansible_reading(inv: PatternInventory, term: str) -> list[str] | None:
    """Ansible's `_match_one_pattern`: matches in Ansible's order (subscripts index it)."""
    expr, subscript = term, None
    if not term.startswith("~"):
        match = _SUBSCRIPT.match(term)
        if match:
            expr, index, start, _, end = match.groups()
            subscript = (int(index), None) if index else (int(start), int(end) if end else -1)
    hosts = _enumerate(inv, expr)
    if subscript is None or not hosts:
        return hosts
    first, last = subscript
    if last is None:
        try:
            return [hosts[first]]
        except IndexError:
            raise InventoryError(
                f"--limit term '{term}': {expr} matches {len(hosts)} hosts, there is no [{first}]",
                hint="positions count from 0; [-1] is the last",
            ) from None
    if last == -1:
        last = len(hosts) - 1
    if last:
        return hosts[first : last + 1]
    try:
        return [hosts[first]]  # Ansible reads [N:0] as [N]
    except IndexError:
        return []


def _enumerate(inv: PatternInventory, expr: str) -> list[str]:
    """Ansible's `_enumerate_matches`: the hosts of matching groups, then matching hosts."""
    if expr.startswith("~"):
        try:
            regex = re.compile(expr[1:])
        except re.error as exc:
            raise UsageError(
                f"--limit: '{expr}' is not a valid regular expression ({exc.msg})",
                hint="~ starts a Python regular expression, matched from the start of names",
            ) from None
        groups = [g for g in inv.groups if regex.match(g)]
        hosts = [h for h in inv.host_index if regex.match(h)]
        return _group_hosts(inv, groups) + hosts
    if not any(c in expr for c in _GLOB):
        groups = [expr] if expr in inv.groups else []
        hosts_too = not groups or "." in expr
        hosts = [expr] if hosts_too and expr in inv.host_index else []
        return _group_hosts(inv, groups) + hosts
    glob = re.compile(fnmatch.translate(expr))
    groups = [g for g in inv.groups if glob.match(g)]
    hosts = [h for h in inv.host_index if glob.match(h)]
    return _group_hosts(inv, groups) + hosts


def _group_hosts(inv: PatternInventory, groups: list[str]) -> list[str]:
    """Each group's hosts in Ansible's order (its own, then its children's, level by level)."""
    out: list[str] = []
    for group in groups:
        seen: set[str] = set()
        order = [group]
        done = {group}
        i = 0
        while i < len(order):
            for child in inv.children.get(order[i], ()):
                if child not in done:
                    done.add(child)
                    order.append(child)
            i += 1
        for g in order:
            for host in inv.group_hosts.get(g, ()):
                if host not in seen:
                    seen.add(host)
                    out.append(host)
    return out
