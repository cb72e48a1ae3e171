"""What one node holds under its output dir: listed over SFTP, read in byte ranges, and checked
by a small sh probe (probe.sh) on the node.

Where the reading happens, and why: a node needs no torch and may have no python, so the node
side only lists and hashes (POSIX sh, sha256sum, /proc). The bastion walks the tree over SFTP
(names, sizes, mtimes and types of any bytes, no shell quoting of node names, symlinks never
followed) and reads only what it needs: a safetensors header, a zip's tail and central
directory, and `data.pkl`, parsed by fleet's own allow-listing reader. The zip CRC of a shard's
tensor data needs every byte of it, so that check runs on the node, with the node's python3
zipfile (which reads zips and never unpickles) when there is one, and is reported as
"not checked" when there is none; shipping shards to the bastion to hash them is what an audit
must not cost.
"""

from __future__ import annotations

import re
import select
import shlex
import stat
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fleet.checkpoints import pickled, safetensors, zipdir
from fleet.core.digits import is_digits

MAX_ENTRIES = 100_000  # files and directories walked per node
MAX_DEPTH = 8
MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # of one probe's stdout
PROBE_TIMEOUT_S = 600.0  # the CRC check reads whole shards
ARGS_CHUNK_BYTES = 64 * 1024  # of paths on one probe command line
SMALL_FILE_BYTES = 1024 * 1024  # adapter_config.json, latest: read whole up to this

RANK_FILE = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(model|optim)_states\.pt$")
MP_MODEL_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
ADAPTER = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class Entry:
    """One file or directory under the output dir (`path` relative to it, '/'-separated)."""

    path: str
    kind: str  # "file", "dir", "link", "other"
    size: int
    mtime: float


@dataclass(frozen=True)
class ShardMeta:
    """What a rank file's data.pkl says (None where it says nothing readable)."""

    dp_world_size: int | None = None
    mp_world_size: int | None = None
    global_steps: int | None = None
    ds_version: str | None = None
    partition_count: int | None = None
    zero_stage: int | None = None
    # A model file that carries the optimizer's state itself: DeepSpeed without ZeRO (stage 0)
    # writes no zero_pp_rank_*_optim_states.pt then (but bf16's, when bf16 is on).
    holds_optimizer: bool = False


@dataclass(frozen=True)
class RankFile:
    path: str
    tag: str  # the directory holding it, relative to the output dir
    rank: int | None  # None: mp_rank_XX_model_states.pt (ZeRO-1/2: one per node, no dp rank)
    mp_rank: int
    kind: str  # "model" or "optim"
    size: int
    meta: ShardMeta | None
    fault: str | None  # "truncated: ..." / "corrupt: ..." / "unreadable: ..."
    crc: str  # "ok", "bad", "error", "not checked"
    mtime: float = 0.0

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Adapter:
    path: str
    size: int
    header: safetensors.Header | None
    fault: str | None
    target_modules: tuple[str, ...]
    sha256: str


@dataclass(frozen=True)
class NodeScan:
    """Everything one node said about its output dir; `error` set when it could not be read."""

    host: str
    directory: str
    exists: bool = True
    # Why there was nothing to read when not `exists`: "no such directory", "not a directory".
    missing: str | None = None
    free_bytes: int | None = None
    entries: tuple[Entry, ...] = ()
    writing: tuple[str, ...] = ()
    rank_files: tuple[RankFile, ...] = ()
    adapters: tuple[Adapter, ...] = ()
    latest: tuple[tuple[str, str], ...] = ()  # (dir holding `latest`, the tag it names)
    truncated_listing: bool = False
    error: str | None = None
    notes: tuple[str, ...] = field(default=())


def probe_script() -> str:
    return resources.files("fleet.checkpoints").joinpath("probe.sh").read_text()


def run_probe(client: Any, mode: str, args: list[str], timeout_s: float) -> bytes:
    """The probe on the node, its stdout (bounded); paths go as quoted arguments."""
    command = " ".join(
        ["sh", "-c", shlex.quote(probe_script()), "fleet-checkpoints", shlex.quote(mode)]
        + [shlex.quote(a) for a in args]
    )
    channel = client.get_transport().open_session(timeout=30)
    channel.exec_command(command)
    channel.shutdown_write()
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        select.select([channel], [], [], 0.5)
        while channel.recv_ready():
            out += channel.recv(65536)
            if len(out) > MAX_OUTPUT_BYTES:
                channel.close()
                raise OSError(f"probe {mode}: more than {MAX_OUTPUT_BYTES} bytes of output")
        while channel.recv_stderr_ready():
            channel.recv_stderr(65536)  # not shown: the probe only reports on stdout
        if channel.exit_status_ready() and not channel.recv_ready():
            break
    else:
        channel.close()
        raise OSError(f"probe {mode}: no answer in {timeout_s:g}s")
    channel.close()
    return bytes(out)


def indexed_probe(client: Any, mode: str, paths: list[str]) -> list[str]:
    """Per-path answers of `hash` / `crc`, in the order of `paths` ("-" where none came)."""
    answers = ["-"] * len(paths)
    start = 0
    while start < len(paths):
        end, used = start, 0
        while end < len(paths) and (used == 0 or used + len(paths[end]) < ARGS_CHUNK_BYTES):
            used += len(paths[end]) + 3
            end += 1
        text = run_probe(client, mode, paths[start:end], PROBE_TIMEOUT_S).decode(errors="replace")
        for line in text.splitlines():
            if line.strip() == "nocheck":
                return ["not checked"] * len(paths)
            index, _, value = line.partition(" ")
            if is_digits(index) and start + int(index) < end:
                answers[start + int(index)] = value.strip()
        start = end
    return answers


def walk(sftp: Any, root: str) -> tuple[list[Entry], bool]:
    """Every entry under root, depth-first, symlinks listed and never followed; bounded."""
    entries: list[Entry] = []
    pending = [("", 0)]
    while pending:
        rel, depth = pending.pop()
        try:
            listing = sftp.listdir_attr(root + ("/" + rel if rel else ""))
        except (OSError, UnicodeDecodeError):
            continue
        for attr in sorted(listing, key=lambda a: a.filename):
            path = f"{rel}/{attr.filename}" if rel else attr.filename
            mode = attr.st_mode or 0
            kind = (
                "link"
                if stat.S_ISLNK(mode)
                else "dir"
                if stat.S_ISDIR(mode)
                else "file"
                if stat.S_ISREG(mode)
                else "other"
            )
            entries.append(Entry(path, kind, attr.st_size or 0, float(attr.st_mtime or 0)))
            if len(entries) >= MAX_ENTRIES:
                return entries, True
            if kind == "dir" and depth < MAX_DEPTH:
                pending.append((path, depth + 1))
    return sorted(entries, key=lambda e: e.path), False


class _Reader:
    """Byte ranges of one node file over SFTP."""

    def __init__(self, sftp: Any, path: str) -> None:
        self.handle = sftp.open(path, "rb")

    def __call__(self, offset: int, length: int) -> bytes:
        self.handle.seek(offset)
        data: bytes = self.handle.read(length)
        return data

    def close(self) -> None:
        self.handle.close()


def read_shard_meta(sftp: Any, path: str, size: int) -> tuple[ShardMeta | None, str | None]:
    """The zip's directory and data.pkl, read over SFTP and through the allow-listing reader."""
    try:
        reader = _Reader(sftp, path)
    except OSError as exc:
        return None, f"unreadable: {exc}"
    try:
        directory = zipdir.read_directory(reader, size)
        member = directory.find("data.pkl")
        if member is None:
            return None, "corrupt: no data.pkl in the zip"
        value = pickled.read_pickle(zipdir.read_member(reader, member))
    except zipdir.ZipFault as exc:
        return None, f"{exc.kind}: {exc.detail}"
    except pickled.PickleFault as exc:
        return None, f"corrupt: data.pkl: {exc}"
    except OSError as exc:
        return None, f"unreadable: {exc}"
    finally:
        reader.close()
    return shard_meta(value), None


def shard_meta(value: Any) -> ShardMeta:
    """The few plain values fleet needs, from the reader's value (a dict, or not)."""
    items = value if isinstance(value, dict) else {}

    def number(key: str) -> int | None:
        got = pickled.plain(items.get(key))
        return got if isinstance(got, int) and not isinstance(got, bool) else None

    version = items.get("ds_version")
    return ShardMeta(
        dp_world_size=number("dp_world_size"),
        mp_world_size=number("mp_world_size"),
        global_steps=number("global_steps"),
        ds_version=version if isinstance(version, str) else None,
        partition_count=number("partition_count"),
        zero_stage=number("zero_stage"),
        holds_optimizer=items.get("optimizer") is not None,
    )


def read_adapter(sftp: Any, root: str, entry: Entry, config: bytes | None) -> Adapter:
    """An adapter's safetensors header (8 bytes, then the JSON) and its target_modules."""
    header, fault = None, None
    try:
        reader = _Reader(sftp, f"{root}/{entry.path}")
        try:
            length = safetensors.header_length(reader(0, 8), entry.size)
            header = safetensors.parse_header(reader(8, length), entry.size)
        finally:
            reader.close()
    except safetensors.HeaderFault as exc:
        fault = str(exc)
    except OSError as exc:
        fault = f"unreadable: {exc}"
    return Adapter(entry.path, entry.size, header, fault, target_modules(config), "")


def target_modules(config: bytes | None) -> tuple[str, ...]:
    """adapter_config.json's target_modules (a list, or one regex string)."""
    import json

    if config is None:
        return ()
    try:
        doc = json.loads(config.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ()
    value = doc.get("target_modules") if isinstance(doc, dict) else None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(sorted(str(v) for v in value))
    return ()


def read_small(sftp: Any, path: str) -> bytes | None:
    try:
        with sftp.open(path, "rb") as fh:
            data: bytes = fh.read(SMALL_FILE_BYTES)
            return data
    except OSError:
        return None


def scan(client: Any, host: str, root: str, crc: bool) -> NodeScan:
    """One node's output dir, read whole (a failure is data in the result)."""
    root = root.rstrip("/") or "/"
    sftp = client.open_sftp()
    try:
        try:
            mode = sftp.stat(root).st_mode or 0
        except OSError:
            return NodeScan(host, root, exists=False, missing="no such directory")
        if not stat.S_ISDIR(mode):  # a file: its "listing" would be empty, not an audit
            return NodeScan(host, root, exists=False, missing="not a directory")
        entries, cut = walk(sftp, root)
        free = run_probe(client, "free", [root], 60).decode(errors="replace").strip()
        writing_raw = run_probe(client, "writing", [root], 60)
        writing = tuple(
            sorted(
                p.decode(errors="replace")[len(root) + 1 :]
                for p in writing_raw.split(b"\0")
                if p.startswith(root.encode() + b"/")
            )
        )
        files = {e.path: e for e in entries if e.kind == "file"}
        rank_files = _rank_files(client, sftp, root, files, crc)
        adapters = _adapters(client, sftp, root, files)
        latest = tuple(
            (_parent(path), _latest_value(read_small(sftp, f"{root}/{path}")))
            for path in files
            if path.rsplit("/", 1)[-1] == "latest"
        )
    finally:
        sftp.close()
    return NodeScan(
        host,
        root,
        free_bytes=int(free) if is_digits(free) else None,
        entries=tuple(entries),
        writing=writing,
        rank_files=rank_files,
        adapters=adapters,
        latest=latest,
        truncated_listing=cut,
    )


def _latest_value(raw: bytes | None) -> str:
    if raw is None:
        return ""
    return raw[:256].decode("utf-8", "replace").strip()


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _rank_files(
    client: Any, sftp: Any, root: str, files: dict[str, Entry], crc: bool
) -> tuple[RankFile, ...]:
    found: list[tuple[Entry, int | None, int, str]] = []
    for path, entry in files.items():
        name = path.rsplit("/", 1)[-1]
        m = RANK_FILE.match(name)
        if m:
            found.append((entry, int(m.group(2)), int(m.group(3)), m.group(4)))
            continue
        m = MP_MODEL_FILE.match(name)
        if m:
            found.append((entry, None, int(m.group(1)), "model"))
    paths = [f"{root}/{e.path}" for e, *_ in found]
    checks = indexed_probe(client, "crc", paths) if crc and paths else ["not checked"] * len(paths)
    out = []
    for (entry, rank, mp, kind), check in zip(found, checks, strict=True):
        meta, fault = read_shard_meta(sftp, f"{root}/{entry.path}", entry.size)
        crc_state = "error" if check == "-" else check
        if crc_state == "bad" and fault is None:
            fault = "corrupt: a zip member's CRC does not match (a changed byte)"
        out.append(
            RankFile(
                entry.path,
                _parent(entry.path),
                rank,
                mp,
                kind,
                entry.size,
                meta,
                fault,
                crc_state,
                entry.mtime,
            )
        )
    return tuple(out)


def _adapters(client: Any, sftp: Any, root: str, files: dict[str, Entry]) -> tuple[Adapter, ...]:
    found = [e for p, e in files.items() if p.rsplit("/", 1)[-1] == ADAPTER]
    hashes = indexed_probe(client, "hash", [f"{root}/{e.path}" for e in found]) if found else []
    out = []
    for entry, digest in zip(found, hashes, strict=True):
        parent = _parent(entry.path)
        config_path = f"{parent}/{ADAPTER_CONFIG}" if parent else ADAPTER_CONFIG
        config = read_small(sftp, f"{root}/{config_path}") if config_path in files else None
        adapter = read_adapter(sftp, root, entry, config)
        out.append(
            Adapter(
                adapter.path,
                adapter.size,
                adapter.header,
                adapter.fault,
                adapter.target_modules,
                digest,
            )
        )
    return tuple(out)
