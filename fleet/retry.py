"""`-l @failed`, `-l @unreachable`, `-l @FILE`: rerun on the hosts that failed last time.

Ansible users rerun a play with `--limit @site.retry`; fleet reads the same from its run records.
`@failed` is every host of the newest finished run that did not end ok (failed, unreachable,
timed out, cancelled), `@unreachable` only those it could not reach or that timed out, and
`@FILE` the host names in FILE, one per line (an Ansible .retry file; `#` comments and blank
lines skipped). Each token expands to a `,`-separated list of names in place, so it combines with
the rest of the pattern: `-l '@failed,&gpu'` is the failed hosts that are in group gpu.

The names must be among the hosts the command has (its -w or inventory): a failed host that is
not is an error naming the token and the run, not a pattern term that "matches no host".
"""

from __future__ import annotations

import json
import re
from collections.abc import Container
from pathlib import Path

from fleet import nodeset
from fleet.errors import InventoryError

RECORD_FAILED = ("failed", "unreachable", "timed_out", "cancelled")
RECORD_UNREACHABLE = ("unreachable", "timed_out")
# An @token as a term of the pattern: at its start or after a separator, maybe negated.
_TOKEN = re.compile(r"(^|[,:])([!&]?)@([^,:&!]+)")
_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]+")
MAX_FILE_BYTES = 1024 * 1024


def has_tokens(limit: str | None) -> bool:
    return bool(limit and _TOKEN.search(limit))


def newest_summary(base: Path) -> tuple[Path, dict[str, object]] | None:
    """The newest run record's summary (by the time it was written), skipping any being written
    or removed by another fleet process meanwhile."""
    from fleet import runlog

    found: list[tuple[float, Path]] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return None
    for entry in entries:
        summary = entry / "summary.json"
        try:
            if runlog.is_record(entry):
                found.append((summary.stat().st_mtime, summary))
        except OSError:  # unfinished, or pruned under us
            continue
    for _, path in sorted(found, reverse=True):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("hosts"), dict):
            return path.parent, doc
    return None


def _from_record(base: Path, which: str) -> tuple[list[str], str]:
    """The hosts of the newest finished run that ended `which`, and where they were read."""
    found = newest_summary(base)
    if found is None:
        raise InventoryError(
            f"-l @{which}: no finished run record in {base}",
            hint="run something first, or point --log-dir at where the records are",
        )
    record, doc = found
    outcomes = RECORD_FAILED if which == "failed" else RECORD_UNREACHABLE
    hosts = doc["hosts"]
    assert isinstance(hosts, dict)
    names = [
        str(name)
        for name, result in hosts.items()
        if isinstance(result, dict) and result.get("outcome") in outcomes
    ]
    if not names:
        raise InventoryError(
            f"-l @{which}: no host was {which} in the last run ({record.name})",
            hint="nothing to retry; `fleet hosts -l ...` selects hosts by name or group",
        )
    return names, f"run {record.name}"


def _from_file(path: Path) -> tuple[list[str], str]:
    """The names in a retry file, and where they were read."""
    from fleet.inventory_sources import read_text

    text = read_text(
        path,
        label=f"-l @{path}",
        limit=MAX_FILE_BYTES,
        what="a retry file",
        hint="@failed and @unreachable read the last run record; @FILE a file of host names",
    )
    names = []
    for number, line in enumerate(text.splitlines(), 1):
        word = line.split("#", 1)[0].strip()
        if not word:
            continue
        if not _NAME.fullmatch(word):
            raise InventoryError(
                f"{path}:{number}: not a host name",
                hint="one host name per line (an Ansible .retry file)",
            )
        names.append(word)
    if not names:
        raise InventoryError(f"-l @{path}: no host names in it", hint="one host name per line")
    return names, str(path)


def expand(limit: str, base: Path, known: Container[str] | None = None) -> str:
    """`limit` with each @token replaced by the names it stands for; with `known` (the hosts
    the command has), a name that is not among them is an error."""

    def names(match: re.Match[str]) -> str:
        sep, op, token = match.groups()
        if op == "&":
            raise InventoryError(
                f"-l '{limit}': '&@{token}' is not supported",
                hint=f"write it the other way round: '@{token},&GROUP' ({token} hosts in GROUP)",
            )
        if token in ("failed", "unreachable"):
            found, where = _from_record(base, token)
        else:
            found, where = _from_file(Path(token).expanduser())
        missing = [name for name in found if known is not None and name not in known]
        if missing:
            raise InventoryError(
                f"-l @{token}: {nodeset.fold(missing)} (from {where}) "
                f"{'is' if len(missing) == 1 else 'are'} not among this command's hosts",
                hint="name the hosts that run had (the same -w or -i), then -l @"
                + token
                + " picks from them",
            )
        return sep + ",".join(op + name for name in found)

    return _TOKEN.sub(names, limit)
