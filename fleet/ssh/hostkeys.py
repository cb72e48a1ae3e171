"""known_hosts files as fleet reads and records them: read once per run (locked against a
concurrent writer), a key recorded under accept-new appended under an exclusive lock, after
checking no other fleet recorded one meanwhile."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from pathlib import Path

from fleet.core.errors import ConfigError
from fleet.ssh import cert as sshcert
from fleet.ssh import known_hosts
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.known_hosts import KnownLine
from fleet.ssh.library import paramiko

KNOWN_HOSTS_LOCK_WAIT_S = 10.0  # another fleet holds a known_hosts lock for a few ms at most


def _lock_file(fd: int, kind: int, path: Path) -> None:
    """flock `fd` (LOCK_SH or LOCK_EX), waiting at most KNOWN_HOSTS_LOCK_WAIT_S."""
    deadline = time.monotonic() + KNOWN_HOSTS_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"{path}: locked by another process for {KNOWN_HOSTS_LOCK_WAIT_S:g}s",
                    hint=f"is a process stuck holding it? (fuser {path} names it)",
                ) from None
            time.sleep(0.01)
        else:
            return


class HostKeyStore:
    """known_hosts files, read once and shared by every worker; accept-new appends under a lock.

    Several fleet processes may share one known_hosts (two terminals, cron): a reader holds a
    shared flock on the file while reading it and a writer an exclusive one while it checks and
    appends, so a reader never sees half a line, and two writers never lose or interleave lines.
    Under its lock a writer reads the file again: a key another fleet recorded meanwhile for the
    same host is not appended twice, and a different one is a changed key, not a second key.
    Lines are read by fleet/ssh/known_hosts.py (markers, patterns, hashed names), not by paramiko.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[Path, known_hosts.Index] = {}

    def load(self, path: Path) -> known_hosts.Index:
        """The usable lines of one known_hosts file (read on first use; a missing file has none)."""
        with self._lock:
            if path not in self._files:
                self._files[path] = known_hosts.Index(self._read(path))
            return self._files[path]

    @staticmethod
    def _read(path: Path) -> tuple[KnownLine, ...]:
        """Parse `path` under a shared lock (no writer mid-line); errors name the file only."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise ConfigError(
                f"{path}: cannot read known_hosts: {exc.strerror or exc}",
                hint="check the file's owner and mode",
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ()
            _lock_file(fd, fcntl.LOCK_SH, path)
            return known_hosts.parse(_read_all(fd).decode("utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"{path}: cannot read known_hosts: {exc.strerror or exc}",
                hint="check the file's owner and mode",
            ) from None
        except (known_hosts.DamagedLine, UnicodeDecodeError):
            # Never the line itself: a file named by mistake may hold secrets.
            raise ConfigError(
                f"{path}: not a known_hosts file (a line with a damaged key)",
                hint="fix or remove the bad line (ssh-keygen -F HOST -f FILE finds "
                "a host's lines); is UserKnownHostsFile pointing at the right file?",
            ) from None
        finally:
            os.close(fd)

    def lines(self, files: tuple[Path, ...], hostname: str) -> list[KnownLine]:
        """Every line across the files that applies to `hostname` (`[addr]:port` off port 22)."""
        indexes = [self.load(path) for path in files]
        with self._lock:  # record() may be adding a line from another worker
            return [x for index in indexes for x in index.applying_to(hostname)]

    def known(self, files: tuple[Path, ...], hostname: str) -> dict[str, paramiko.PKey]:
        """The plain keys recorded for `hostname` across the files, first of each type."""
        found: dict[str, paramiko.PKey] = {}
        for line in self.lines(files, hostname):
            if not line.marker and line.keytype not in found:
                key = _pkey(line)
                if key is not None:
                    found[line.keytype] = key
        return found

    def record(self, path: Path, hostname: str, key: paramiko.PKey) -> None:
        """Trust on first use: append the key to `path` (the user's known_hosts), unless another
        fleet recorded it meanwhile; BadHostKeyException when that one recorded another key."""
        self.load(path)
        with self._lock:
            try:
                self._append(path, hostname, key)
            except ConfigError as exc:
                raise ConnectFailed("host key not recorded", exc.message) from None
            except OSError as exc:
                raise ConnectFailed(
                    "host key not recorded", f"{path}: {exc.strerror or exc}"
                ) from None
            blob = key.asbytes()
            self._files[path].add(KnownLine("", hostname, key.get_name(), blob, 0))

    def _append(self, path: Path, hostname: str, key: paramiko.PKey) -> None:
        """Under the file's exclusive lock: check what it holds now, then append one line."""
        keytype = key.get_name()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            _lock_file(fd, fcntl.LOCK_EX, path)
            recorded = self._recorded(fd, hostname, keytype)
            if recorded is not None and recorded.blob != key.asbytes():
                expected = _pkey(recorded)
                if expected is None:
                    raise ConnectFailed("host key changed", _changed_detail(key, recorded.blob))
                raise paramiko.BadHostKeyException(hostname, key, expected)
            if recorded is None:
                size = os.fstat(fd).st_size
                # a last line without its newline (edited by hand) would be glued to ours
                glue = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
                line = f"{hostname} {keytype} {key.get_base64()}\n".encode()
                data = memoryview(b"\n" + line if glue else line)
                while data:  # one write, in practice: a line is far below a page
                    data = data[os.write(fd, data) :]
        finally:
            os.close(fd)

    @staticmethod
    def _recorded(fd: int, hostname: str, keytype: str) -> KnownLine | None:
        """The `keytype` line the file holds for `hostname` now (the caller holds the lock)."""
        try:
            lines = known_hosts.parse(_read_all(fd).decode("utf-8"))
        except (OSError, known_hosts.DamagedLine, UnicodeDecodeError):
            return None  # unreadable now: append, as OpenSSH would
        for line in lines:
            if not line.marker and line.keytype == keytype and line.applies_to(hostname):
                return line
        return None


KNOWN_HOSTS_MAX_BYTES = 256 * 1024 * 1024  # a known_hosts of a million hosts is ~100 MB


def _read_all(fd: int) -> bytes:
    """The whole file behind `fd`, from its start, whatever the fd's position."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.pread(fd, 1 << 20, size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > KNOWN_HOSTS_MAX_BYTES:
            raise OSError(errno.EFBIG, "larger than 256 MiB: not a known_hosts file")


def _pkey(line: KnownLine) -> paramiko.PKey | None:
    """A known_hosts line's key as paramiko's, or None for a type paramiko cannot load."""
    try:
        return paramiko.PKey.from_type_string(line.keytype, line.blob)
    except (paramiko.SSHException, ValueError, TypeError):
        return None


def _changed_detail(offered: paramiko.PKey, recorded_blob: bytes) -> str:
    """What a changed host key message says (both fingerprints, what to do)."""
    return (
        f"server offered {offered.get_name()} {offered.fingerprint}, known_hosts has "
        f"{known_hosts.fingerprint(recorded_blob)}: possible man-in-the-middle, "
        "or the node was reinstalled; "
        "if expected, remove the old line (ssh-keygen -R HOST)"
    )


def _cert_blob(key: paramiko.PKey) -> bytes | None:
    """The certificate a server presented with its host key, if it did."""
    blob = getattr(key, "public_blob", None)
    if blob is not None and str(blob.key_type).endswith(sshcert.CERT_SUFFIX):
        return bytes(blob.key_blob)
    return None
