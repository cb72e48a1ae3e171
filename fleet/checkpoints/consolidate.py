"""`fleet checkpoints consolidate TAG --to HOST:PATH`: the shards of one whole tag into one
directory on HOST, then DeepSpeed's own zero_to_fp32.py there, and what it made.

Refused at once, naming the ranks, unless the audit calls the tag complete (zero_to_fp32.py
itself lets a missing rank 0 model file, a changed byte or a stale rank through). Each file is
streamed node -> bastion -> HOST by fleet.transfer's relay_file: never written to the bastion's
disk, hashed on the source node, on the bastion as it passes and on HOST before the part file is
renamed into place. A rerun skips every file HOST already holds with the source's sha256, so an
interrupted consolidation resumes file by file. A dry run (`--dry-run`) runs the read-only
audit, reads both ends of every copy and says what would be copied from where to where and the
zero_to_fp32.py command that would run; it writes nothing.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.checkpoints import pickled, safetensors, zipdir
from fleet.checkpoints.analysis import Audit, TagReport, audit
from fleet.checkpoints.audit import scan_hosts
from fleet.checkpoints.node import NodeScan, RankFile
from fleet.core import nodeset
from fleet.core.errors import ExitCode, FleetError, UsageError
from fleet.core.hosts import Host
from fleet.engine.runner import RunSettings, Secrets, make_transport
from fleet.transfer import Action, FileResult, Options, relay_file

RUN_TIMEOUT_S = 3600.0
OUTPUT_TAIL_BYTES = 4096


class Refused(FleetError):
    """The tag is not whole: nothing was copied."""

    exit_code = ExitCode.STEP_FAILED


@dataclass(frozen=True)
class Copy:
    """One file of the consolidation: from `host:source` to `target` on the destination, and
    what became of it (copied, skipped: already there verified; a dry run: would copy)."""

    host: str
    source: str
    target: str
    action: str = ""
    size: int = 0


@dataclass(frozen=True)
class Made:
    """What zero_to_fp32.py wrote: `path` its one weights file, or the index of its shards
    (a model over its --max_shard_size, 5GB); `files` every file, `size` and `tensors` over
    them all."""

    host: str
    path: str
    size: int
    tensors: int
    copies: tuple[Copy, ...] = ()
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DryRun:
    """What a consolidation would do: every copy (from which node, to where) and the command."""

    host: str
    copies: tuple[Copy, ...]
    command: str


def parse_destination(text: str) -> tuple[str, str]:
    host, sep, path = text.partition(":")
    if not sep or not host or not path.startswith("/"):
        raise UsageError(
            f"--to {text!r}: expected HOST:/absolute/path",
            hint="e.g. --to node01:/scratch/consolidated",
        )
    return host, posixpath.normpath(path)


def refuse_without_a_dir(result: Audit, tag: str) -> None:
    """No selected node has the output dir: say that, not "no tag" (a wrong --dir or host)."""
    if result.read or not result.missing:
        return
    first = result.missing[0]
    lacking = nodeset.fold(s.host for s in result.missing)
    raise Refused(
        f"cannot consolidate {tag}: no selected node has {first.directory} "
        f"({first.missing or 'no such directory'} on {lacking})",
        hint="wrong host or typo? pass --dir with the run's output dir, and select its nodes",
    )


def refuse_unless_whole(result: Audit, tag: str) -> TagReport:
    report = next((t for t in result.tags if t.tag == tag), None)
    if report is None:
        known = ", ".join(t.tag for t in result.tags) or "none"
        raise Refused(f"no tag {tag!r} on the selected nodes", hint=f"tags found: {known}")
    if report.status == "complete":
        return report
    ranks = report.missing_ranks
    parts = []
    if ranks:
        parts.append("missing ranks " + ",".join(str(r) for r in ranks))
    parts += [f"{len(v)} {k}" for k, v in _problems(report) if v]
    raise Refused(
        f"{tag} is {report.status}: " + "; ".join(parts or ["not complete"]),
        hint="run `fleet checkpoints` for every file it names; nothing was copied",
    )


def refuse_without_zero(scans: Sequence[NodeScan], tag: str) -> None:
    """DeepSpeed without ZeRO (stage 0) keeps the whole model in its mp_rank model file and
    writes neither ZeRO's per-rank optimizer files nor zero_to_fp32.py: nothing to put together."""
    files = [(s.host, f) for s in scans for f in s.rank_files if f.tag == tag]
    if any(f.kind == "optim" for _h, f in files):
        return
    whole = [(h, f) for h, f in files if f.meta and f.meta.holds_optimizer]
    if whole:
        host, f = whole[0]
        raise Refused(
            f"{tag} was saved without ZeRO: the whole model is in {host}:{f.path}",
            hint="nothing to consolidate: `fleet pull` that file; its 'module' entry is the "
            "model's state dict",
        )


def _problems(report: TagReport) -> list[tuple[str, tuple[str, ...]]]:
    return [
        ("missing files", report.missing if not report.missing_ranks else ()),
        ("extra (stale) files", report.extra),
        ("truncated files", report.truncated),
        ("corrupt files", report.corrupt),
        ("files being written", report.writing),
    ]


def sources(scans: Sequence[NodeScan], report: TagReport) -> list[tuple[str, str, RankFile]]:
    """(host, its dir, file) for every rank file of the whole tag (no stale copy), each once:
    a shared output dir shows every node the same files, copied from the first that has it."""
    bad = {x.split(" ", 1)[0] for x in report.extra}
    out: dict[str, tuple[str, str, RankFile]] = {}
    for s in scans:
        for f in s.rank_files:
            if f.tag == report.tag and f"{s.host}:{f.path}" not in bad:
                out.setdefault(f.name, (s.host, s.directory, f))
    return list(out.values())


def consolidate(
    run: RunSettings,
    hosts: Sequence[Host],
    dirs: dict[str, str],
    tag: str,
    destination: str,
    python: str,
    secrets: Secrets | None = None,
    *,
    dry_run: bool = False,
) -> Made | DryRun:
    dest_name, dest_dir = parse_destination(destination)
    by_name = {h.name: h for h in hosts}
    if dest_name not in by_name:
        raise UsageError(
            f"--to {dest_name}: not one of the selected hosts", hint="select it with -l/-w"
        )
    scans = scan_hosts(run, hosts, dirs, True, secrets)
    unreachable = [s.host for s in scans if s.error]
    if unreachable:
        raise Refused(f"cannot consolidate {tag}: {', '.join(unreachable)} not reachable")
    result = audit(scans)
    refuse_without_a_dir(result, tag)
    report = refuse_unless_whole(result, tag)
    refuse_without_zero(scans, tag)
    tag_dir = f"{dest_dir}/{posixpath.basename(tag)}"
    script_host, script_path = _script_source(scans, tag)
    wanted = [
        Copy(host, f"{root}/{f.path}", f"{tag_dir}/{f.name}", size=f.size)
        for host, root, f in sources(scans, report)
    ]
    wanted.append(Copy(script_host, script_path, f"{dest_dir}/zero_to_fp32.py"))
    out_dir = f"{dest_dir}/consolidated"
    command = _command(python, dest_dir, out_dir + PART_SUFFIX)
    transport = make_transport(run.ssh, secrets, hosts)
    sessions: dict[str, Any] = {}
    try:
        for name in sorted({dest_name, *(c.host for c in wanted)}):
            sessions[name] = transport.connect(by_name[name])
        dest = sessions[dest_name]
        options = Options(dry_run=dry_run)
        copies = tuple(_relay(sessions[c.host], c, dest, options) for c in wanted)
        if dry_run:
            return DryRun(dest_name, copies, command)
        _write(dest.client, f"{dest_dir}/latest", posixpath.basename(tag).encode())
        _sh(dest.client, _discard_part(out_dir))  # a killed run's leftover
        try:
            _run_script(dest.client, command)
            made = _what_it_made(dest.client, dest_name, out_dir + PART_SUFFIX)
        except BaseException:
            _sh(dest.client, _discard_part(out_dir))
            raise
        _sh(dest.client, _replace_weights(out_dir))
        files = tuple(f"{out_dir}/{posixpath.basename(p)}" for p in made.files)
        return dataclasses.replace(made, path=files[0], files=files, copies=copies)
    finally:
        for c in sessions.values():
            c.close()
        transport.close()


def _relay(source: Any, copy: Copy, dest: Any, options: Options) -> Copy:
    """One file through the bastion (fleet.transfer.relay_file), verified on both ends."""
    got: FileResult = relay_file(source, copy.source, dest, copy.target, options)
    if got.action is Action.FAILED:
        raise FleetError(
            f"copy of {copy.host}:{copy.source} failed: {got.error}",
            hint="files already verified on the destination are kept: rerun to resume",
        )
    return dataclasses.replace(copy, action=got.action.value, size=got.size)


def _command(python: str, ckpt_dir: str, out_dir: str) -> str:
    """DeepSpeed's zero_to_fp32.py with the node's python (its CLI needs huggingface_hub)."""
    script = f"{ckpt_dir}/zero_to_fp32.py"
    return " ".join(shlex.quote(a) for a in (python, script, ckpt_dir, out_dir))


def _script_source(scans: Sequence[NodeScan], tag: str) -> tuple[str, str]:
    """The zero_to_fp32.py DeepSpeed wrote beside the tag (on the node of global rank 0)."""
    base = posixpath.dirname(tag)
    want = posixpath.join(base, "zero_to_fp32.py") if base else "zero_to_fp32.py"
    for s in scans:
        if any(e.path == want and e.kind == "file" for e in s.entries):
            return s.host, f"{s.directory}/{want}"
    raise Refused(
        f"no zero_to_fp32.py beside {tag} on any selected node",
        hint="DeepSpeed writes it on the node of global rank 0: select that node too",
    )


def _write(client: Any, path: str, data: bytes) -> None:
    sftp = client.open_sftp()
    try:
        with sftp.open(path + ".part", "wb") as fh:
            fh.write(data)
        sftp.posix_rename(path + ".part", path)
    finally:
        sftp.close()


def _remote(client: Any, command: str, what: str, timeout_s: float) -> tuple[int, bytes]:
    """`command` on HOST: its exit code and its output's tail (stdout and stderr together).
    Past `timeout_s` the channel is closed and `what` named as not finished."""
    channel = client.get_transport().open_session(timeout=30)
    channel.exec_command(command + " 2>&1")
    channel.shutdown_write()
    tail = b""
    deadline = time.monotonic() + timeout_s
    while not (channel.exit_status_ready() and not channel.recv_ready()):
        if time.monotonic() > deadline:
            channel.close()
            raise FleetError(f"{what} did not finish in {timeout_s:g}s")
        if channel.recv_ready():
            tail = (tail + channel.recv(65536))[-OUTPUT_TAIL_BYTES:]
        else:
            time.sleep(0.02)
    code = channel.recv_exit_status()
    channel.close()
    return code, tail


def _run_script(client: Any, command: str) -> None:
    """The zero_to_fp32.py command on HOST, its output's tail kept for the error."""
    code, tail = _remote(client, command, "zero_to_fp32.py", RUN_TIMEOUT_S)
    if code != 0:
        from fleet.core.safetext import clean

        last = clean(tail.decode(errors="replace").strip().splitlines()[-1] if tail.strip() else "")
        raise FleetError(
            f"zero_to_fp32.py exited {code}: {last}",
            hint="choose a python with torch, deepspeed and huggingface_hub with --python",
        )


# zero_to_fp32.py writes into a fresh part dir; only when it succeeded do its files replace the
# weights a previous consolidation left in `consolidated` (every name it can write; anything else
# there, a config.json or tokenizer put beside them, is kept). A failed or killed run leaves no
# partial weights under the names a loader reads, and a model now sharded never sits beside the
# single file of an earlier one.
PART_SUFFIX = ".part"
WEIGHT_GLOBS = (
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "model*.safetensors",
    "model.safetensors.index.json",
)


def _discard_part(out_dir: str) -> str:
    return "rm -rf -- " + shlex.quote(out_dir + PART_SUFFIX)


def _replace_weights(out_dir: str) -> str:
    out, part = shlex.quote(out_dir), shlex.quote(out_dir + PART_SUFFIX)
    old = " ".join(f"{out}/{g}" for g in WEIGHT_GLOBS)
    return (
        f"set -u; mkdir -p -- {out} && for f in {old}; do "
        'if [ -e "$f" ] || [ -L "$f" ]; then rm -f -- "$f" || exit 1; fi; done && '
        f"for f in {part}/* {part}/.[!.]*; do "
        f'if [ -e "$f" ]; then mv -f -- "$f" {out}/ || exit 1; fi; done && rmdir -- {part}'
    )


# Moving the weights into place, or removing a part dir: one rm, mv per file.
SH_TIMEOUT_S = 600.0


def _sh(client: Any, command: str) -> None:
    """A short command on HOST; a failure is an error naming its output."""
    code, said = _remote(client, command, "a file operation on the destination", SH_TIMEOUT_S)
    if code != 0:
        from fleet.core.safetext import clean

        raise FleetError(
            clean(f"on the destination, exit {code}: {said.decode(errors='replace').strip()}"),
            hint="the copied shards are kept: fix the destination dir and rerun",
        )


def _what_it_made(client: Any, host: str, out_dir: str) -> Made:
    """The weights zero_to_fp32.py wrote under out_dir: one file, or shards and their index."""
    sftp = client.open_sftp()
    try:
        try:
            names = sorted(sftp.listdir(out_dir))
        except OSError:
            names = []
        weights = [n for n in names if n.endswith((".bin", ".safetensors"))]
        if not weights:
            raise FleetError(f"zero_to_fp32.py wrote nothing under {host}:{out_dir}")
        index = [n for n in names if n.endswith(".index.json")]
        size = tensors = 0
        for name in weights:
            path = f"{out_dir}/{name}"
            got = sftp.stat(path).st_size or 0
            fh = sftp.open(path, "rb")
            try:
                tensors += _tensors(fh, name, got)
            finally:
                fh.close()
            size += got
        files = tuple(f"{out_dir}/{n}" for n in index + weights)
        return Made(host, files[0], size, tensors, files=files)
    finally:
        sftp.close()


def _tensors(fh: Any, name: str, size: int) -> int:
    def read_at(offset: int, length: int) -> bytes:
        fh.seek(offset)
        data: bytes = fh.read(length)
        return data

    try:
        if name.endswith(".safetensors"):
            length = safetensors.header_length(read_at(0, 8), size)
            return len(safetensors.parse_header(read_at(8, length), size).tensors)
        directory = zipdir.read_directory(read_at, size)
        member = directory.find("data.pkl")
        if member is None:
            raise FleetError(f"{name}: no data.pkl")
        return pickled.tensor_count(pickled.read_pickle(zipdir.read_member(read_at, member)))
    except (safetensors.HeaderFault, zipdir.ZipFault, pickled.PickleFault) as exc:
        from fleet.core.safetext import clean

        raise FleetError(
            clean(f"{name}: what zero_to_fp32.py wrote cannot be read: {exc}"),
            hint="look at the file on the node; the shards it came from are untouched",
        ) from None
