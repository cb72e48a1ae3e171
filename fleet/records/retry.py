"""`-l @failed`, `-l @unreachable`, `-l @FILE`: rerun on the hosts that failed last time.

Ansible users rerun a play with `--limit @site.retry`; fleet reads the same from its run records.
`@failed` is every host of the newest finished run of the same verb (`fleet cleanup -l @failed`
reads the last `fleet cleanup`, not a cron job's `fleet status` since) that did not end ok
(failed, unreachable, timed out, cancelled), `@unreachable` only those it could not reach or
that timed out; the run is all records of that invocation (a launch writes several). And
`@FILE` the host names in FILE, one per line (an Ansible .retry file; `#` comments and blank
lines skipped). Each token expands to a `,`-separated list of names in place, so it combines with
the rest of the pattern: `-l '@failed,&gpu'` is the failed hosts that are in group gpu.

The names must be among the hosts the command has (its -w or inventory): a failed host that is
not is an error naming the token and the run, not a pattern term that "matches no host".
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Container, Iterator
from pathlib import Path

from fleet.core import nodeset, userpath
from fleet.core.errors import InventoryError

RECORD_FAILED = ("failed", "unreachable", "timed_out", "cancelled")
RECORD_UNREACHABLE = ("unreachable", "timed_out")
# An @token as a term of the pattern: at its start or after a separator, maybe negated.
_TOKEN = re.compile(r"(^|[,:])([!&]?)@([^,:&!]+)")
_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]+")
MAX_FILE_BYTES = 1024 * 1024


def has_tokens(limit: str | None) -> bool:
    return bool(limit and _TOKEN.search(limit))


def summaries(base: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """The finished run records' summaries, newest first (by the time each was written),
    skipping any being written or removed by another fleet process meanwhile."""
    from fleet.records import runlog

    found: list[tuple[float, Path]] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return
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
            yield path.parent, doc


def _verb(doc: dict[str, object]) -> str:
    """The verb that wrote a record (records from before verbs were recorded: the playbook)."""
    return str(doc.get("verb") or doc.get("playbook") or "")


def _last_run(base: Path, verb: str) -> list[tuple[Path, dict[str, object]]]:
    """The records of the newest `fleet VERB` (of any verb when `verb` is empty), newest first:
    a verb that chains runs (launch: preflight, start, roll back) writes several, one
    invocation id in each, so a roll back written last does not hide the start that failed."""
    run: list[tuple[Path, dict[str, object]]] = []
    for record, doc in summaries(base):
        if not run:
            if not verb or _verb(doc) == verb:
                run.append((record, doc))
            continue
        first = run[0][1]
        if doc.get("invocation") and doc.get("invocation") == first.get("invocation"):
            run.append((record, doc))
    return run


def _from_record(
    base: Path, which: str, verb: str, notes: list[str] | None
) -> tuple[list[str], str]:
    """The hosts of the newest finished run of `verb` that ended `which`, and where they were
    read; `notes` is told which record that was."""
    run = _last_run(base, verb)
    what = f"fleet {verb} run" if verb else "run"
    if not run:
        raise InventoryError(
            f"-l @{which}: no finished {what} record in {base}",
            hint="run something first, or point --log-dir at where the records are",
        )
    outcomes = RECORD_FAILED if which == "failed" else RECORD_UNREACHABLE
    names: dict[str, None] = {}
    used: list[tuple[Path, dict[str, object]]] = []
    for record, doc in reversed(run):  # oldest first: the hosts in the order they ran
        hosts = doc["hosts"]
        assert isinstance(hosts, dict)
        mine = [
            str(name)
            for name, result in hosts.items()
            if isinstance(result, dict) and result.get("outcome") in outcomes
        ]
        names.update(dict.fromkeys(mine))
        if mine:
            used.append((record, doc))
    if not names:
        raise InventoryError(
            f"-l @{which}: no host was {which} in the last {what} ({run[0][0].name})",
            hint="nothing to retry; `fleet hosts -l ...` selects hosts by name or group",
        )
    ids = ", ".join(record.name for record, _ in used)
    if notes is not None:
        doc = used[-1][1]
        count = len(names)
        notes.append(
            f"using run record{'s' if len(used) > 1 else ''} {ids} "
            f"(fleet {_verb(doc) or '?'}, {_when(doc)}): "
            f"{count} {which} host{'' if count == 1 else 's'}"
        )
    return list(names), f"run {ids}"


def _when(doc: dict[str, object]) -> str:
    """When a record's run finished, in local time (its `ts`), for the note."""
    stamp = doc.get("ts")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return "time unknown"


def _from_file(path: Path) -> tuple[list[str], str]:
    """The names in a retry file, and where they were read."""
    from fleet.core.textfile import read_text

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


def expand(
    limit: str,
    base: Path,
    known: Container[str] | None = None,
    *,
    verb: str = "",
    notes: list[str] | None = None,
) -> str:
    """`limit` with each @token replaced by the names it stands for; with `known` (the hosts
    the command has), a name that is not among them is an error. @failed and @unreachable read
    the newest run of `verb` (any verb when empty); `notes` is told which records they used."""

    def names(match: re.Match[str]) -> str:
        sep, op, token = match.groups()
        if op == "&":
            raise InventoryError(
                f"-l '{limit}': '&@{token}' is not supported",
                hint=f"write it the other way round: '@{token},&GROUP' ({token} hosts in GROUP)",
            )
        if token in ("failed", "unreachable"):
            found, where = _from_record(base, token, verb, notes)
        else:
            found, where = _from_file(userpath.expand(token, "-l @"))
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
