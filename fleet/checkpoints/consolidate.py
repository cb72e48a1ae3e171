"""`fleet checkpoints consolidate TAG --to HOST:PATH`: the shards of one whole tag into one
directory on HOST, then DeepSpeed's own zero_to_fp32.py there, and what it made.

Refused at once, naming the ranks, unless the audit calls the tag complete (zero_to_fp32.py
itself lets a missing rank 0 model file, a changed byte or a stale rank through). Each file is
streamed node -> bastion -> HOST over SFTP in bounded chunks into `NAME.part`, hashed on the
bastion as it passes, then hashed again by the probe on both nodes (sha256sum); only when all
three agree is it renamed into place. (fleet push/pull, another branch's work, was not there to
reuse when this was written; this is the smallest verified copy, not a transfer engine.)
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.checkpoints import pickled, safetensors, zipdir
from fleet.checkpoints.analysis import Audit, TagReport, audit
from fleet.checkpoints.audit import scan_hosts
from fleet.checkpoints.node import NodeScan, RankFile, indexed_probe
from fleet.errors import ExitCode, FleetError, UsageError
from fleet.inventory import Host
from fleet.runner import Options, Secrets, make_transport

CHUNK_BYTES = 1024 * 1024
RUN_TIMEOUT_S = 3600.0
OUTPUT_TAIL_BYTES = 4096


class Refused(FleetError):
    """The tag is not whole: nothing was copied."""

    exit_code = ExitCode.STEP_FAILED


@dataclass(frozen=True)
class Made:
    host: str
    path: str
    size: int
    tensors: int


def parse_destination(text: str) -> tuple[str, str]:
    host, sep, path = text.partition(":")
    if not sep or not host or not path.startswith("/"):
        raise UsageError(
            f"--to {text!r}: expected HOST:/absolute/path",
            hint="e.g. --to node01:/scratch/consolidated",
        )
    return host, posixpath.normpath(path)


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


def _problems(report: TagReport) -> list[tuple[str, tuple[str, ...]]]:
    return [
        ("missing files", report.missing if not report.missing_ranks else ()),
        ("extra (stale) files", report.extra),
        ("truncated files", report.truncated),
        ("corrupt files", report.corrupt),
        ("files being written", report.writing),
    ]


def sources(scans: Sequence[NodeScan], report: TagReport) -> list[tuple[str, str, RankFile]]:
    """(host, its dir, file) for every rank file of the whole tag (no stale copy)."""
    bad = {x.split(" ", 1)[0] for x in report.extra}
    return [
        (s.host, s.directory, f)
        for s in scans
        for f in s.rank_files
        if f.tag == report.tag and f"{s.host}:{f.path}" not in bad
    ]


def consolidate(
    opts: Options,
    hosts: Sequence[Host],
    dirs: dict[str, str],
    tag: str,
    destination: str,
    python: str,
    secrets: Secrets | None = None,
) -> Made:
    dest_name, dest_dir = parse_destination(destination)
    by_name = {h.name: h for h in hosts}
    if dest_name not in by_name:
        raise UsageError(
            f"--to {dest_name}: not one of the selected hosts", hint="select it with -l/-w"
        )
    scans = scan_hosts(opts, hosts, dirs, True, secrets)
    unreachable = [s.host for s in scans if s.error]
    if unreachable:
        raise Refused(f"cannot consolidate {tag}: {', '.join(unreachable)} not reachable")
    result = audit(scans)
    report = refuse_unless_whole(result, tag)
    files = sources(scans, report)
    script = _script_source(scans, tag)
    transport = make_transport(opts, secrets, hosts)
    clients: dict[str, Any] = {}
    try:
        for name in {dest_name, script[0], *(h for h, _d, _f in files)}:
            clients[name] = transport.connect(by_name[name])
        dest = clients[dest_name].client
        tag_dir = f"{dest_dir}/{posixpath.basename(tag)}"
        _mkdirs(dest, tag_dir)
        for host, root, f in files:
            copy_verified(clients[host].client, f"{root}/{f.path}", dest, f"{tag_dir}/{f.name}")
        copy_verified(clients[script[0]].client, script[1], dest, f"{dest_dir}/zero_to_fp32.py")
        _write(dest, f"{dest_dir}/latest", posixpath.basename(tag).encode())
        out_dir = f"{dest_dir}/consolidated"
        _run_script(dest, python, dest_dir, out_dir)
        return _what_it_made(dest, dest_name, out_dir)
    finally:
        for c in clients.values():
            c.close()
        transport.close()


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


def _mkdirs(client: Any, path: str) -> None:
    sftp = client.open_sftp()
    try:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            try:
                sftp.stat(p)
            except OSError:
                sftp.mkdir(p)
    finally:
        sftp.close()


def _write(client: Any, path: str, data: bytes) -> None:
    sftp = client.open_sftp()
    try:
        with sftp.open(path + ".part", "wb") as fh:
            fh.write(data)
        sftp.posix_rename(path + ".part", path)
    finally:
        sftp.close()


def copy_verified(src: Any, src_path: str, dest: Any, dest_path: str) -> str:
    """Stream one file, then require the same sha256 on the bastion and on both nodes."""
    digest = hashlib.sha256()
    src_sftp, dest_sftp = src.open_sftp(), dest.open_sftp()
    try:
        with src_sftp.open(src_path, "rb") as fin, dest_sftp.open(dest_path + ".part", "wb") as fo:
            fin.prefetch()
            while chunk := fin.read(CHUNK_BYTES):
                digest.update(chunk)
                fo.write(chunk)
        got = digest.hexdigest()
        at_source = indexed_probe(src, "hash", [src_path])[0]
        at_dest = indexed_probe(dest, "hash", [dest_path + ".part"])[0]
        if not got == at_source == at_dest:
            dest_sftp.remove(dest_path + ".part")
            raise FleetError(
                f"copy of {src_path} failed verification: sha256 {at_source[:12]} at the "
                f"source, {got[:12]} read, {at_dest[:12]} written",
                hint="the file changed while it was copied, or a disk is failing; rerun",
            )
        dest_sftp.posix_rename(dest_path + ".part", dest_path)
        return got
    finally:
        src_sftp.close()
        dest_sftp.close()


def _run_script(client: Any, python: str, ckpt_dir: str, out_dir: str) -> None:
    """DeepSpeed's zero_to_fp32.py with the node's python (its CLI needs huggingface_hub)."""
    script = f"{ckpt_dir}/zero_to_fp32.py"
    command = " ".join(shlex.quote(a) for a in (python, script, ckpt_dir, out_dir)) + " 2>&1"
    channel = client.get_transport().open_session(timeout=30)
    channel.exec_command(command)
    channel.shutdown_write()
    tail = b""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (channel.exit_status_ready() and not channel.recv_ready()):
        if time.monotonic() > deadline:
            channel.close()
            raise FleetError(f"zero_to_fp32.py did not finish in {RUN_TIMEOUT_S:g}s")
        if channel.recv_ready():
            tail = (tail + channel.recv(65536))[-OUTPUT_TAIL_BYTES:]
        else:
            time.sleep(0.05)
    code = channel.recv_exit_status()
    channel.close()
    if code != 0:
        from fleet.safetext import clean

        last = clean(tail.decode(errors="replace").strip().splitlines()[-1] if tail.strip() else "")
        raise FleetError(
            f"zero_to_fp32.py exited {code}: {last}",
            hint="choose a python with torch, deepspeed and huggingface_hub with --python",
        )


def _what_it_made(client: Any, host: str, out_dir: str) -> Made:
    sftp = client.open_sftp()
    try:
        names = sorted(sftp.listdir(out_dir))
        for name in ("pytorch_model.bin", "model.safetensors", *names):
            if name not in names:
                continue
            path = f"{out_dir}/{name}"
            size = sftp.stat(path).st_size or 0
            fh = sftp.open(path, "rb")
            try:
                return Made(host, path, size, _tensors(fh, name, size))
            finally:
                fh.close()
    finally:
        sftp.close()
    raise FleetError(f"zero_to_fp32.py wrote nothing under {host}:{out_dir}")


def _tensors(fh: Any, name: str, size: int) -> int:
    def read_at(offset: int, length: int) -> bytes:
        fh.seek(offset)
        data: bytes = fh.read(length)
        return data

    if name.endswith(".safetensors"):
        length = safetensors.header_length(read_at(0, 8), size)
        return len(safetensors.parse_header(read_at(8, length), size).tensors)
    directory = zipdir.read_directory(read_at, size)
    member = directory.find("data.pkl")
    if member is None:
        raise FleetError(f"{name}: no data.pkl")
    return pickled.tensor_count(pickled.read_pickle(zipdir.read_member(read_at, member)))
