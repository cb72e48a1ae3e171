"""Pieces of connection setup that live outside paramiko's client: the ProxyCommand process,
ProxyJump hop specs, and the identity-file check fleet runs before connecting anywhere."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from fleet.core import nodeset
from fleet.core.errors import ConfigError
from fleet.ssh.library import paramiko

MAX_KEY_BYTES = 1024 * 1024  # private keys are a few KB; reading stops here
STDERR_LINES = 5


class ProxyCommandSocket(paramiko.ProxyCommand):
    """A ProxyCommand run the way OpenSSH runs it, as paramiko's socket.

    paramiko's own ProxyCommand splits the line itself and runs it without a shell (OpenSSH runs
    `exec COMMAND` with the user's shell, so quotes, pipes and $VARS work), never reads the
    command's stderr (a chatty proxy blocks on a full pipe, and its reason for failing is lost),
    spins on EOF until the timeout, and leaves the process to the Ctrl-C that fleet's cancel
    needs the connections to survive. Here the command runs in its own session (a Ctrl-C at
    the terminal does not reach it; close() ends it), stderr is kept (the last lines) for the
    error message, and EOF is an empty read, as on a socket.
    """

    def __init__(self, command: str) -> None:
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.cmd = [shell, "-c", f"exec {command}"]
        self.timeout: float | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        self.process = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, name="fleet-proxy-stderr", daemon=True
        )
        self._stderr_reader.start()

    def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self.stderr_tail.append(line[:300])

    def send(self, content: bytes) -> int:  # type: ignore[override]
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(content)
        except OSError:
            raise EOFError("the proxy command is gone") from None
        return len(content)

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at EOF; socket.timeout when nothing came within the timeout."""
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()
        try:
            return os.read(stdout.fileno(), size)
        except OSError:
            return b""

    def close(self) -> None:
        """Stop the command (its whole session) and reap it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The command's exit status once it has ended (waiting a little for it), else None."""
        try:
            status = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        self._stderr_reader.join(timeout=wait_s)  # its last words, for why()
        return status

    def why(self) -> str:
        """The command's last stderr line, for the error message."""
        return self.stderr_tail[-1] if self.stderr_tail else "no message on stderr"


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop: `[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://...`.
    Raises ValueError with the problem."""
    text = spec.strip()
    if text.startswith("ssh://"):
        text = text[len("ssh://") :].rstrip("/")
    user, _, rest = text.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail and not tail.startswith(":"):
            raise ValueError("text after ']' must be ':PORT'")
        port_text = tail[1:]
    elif rest.count(":") > 1:
        host, port_text = rest, ""  # a bare IPv6 address
    else:
        host, _, port_text = rest.partition(":")
    if not host:
        raise ValueError("a hop without a host")
    if port_text and (not port_text.isdigit() or not 1 <= int(port_text) <= 65535):
        raise ValueError("a hop's port must be a number 1-65535")
    return user or None, host, int(port_text) if port_text else None


# ---------------------------------------------------------------- identity files


def key_file_problem(path: Path) -> str | None:
    """Why `path` cannot be used as a private key (None: it can; encrypted is fine, that is
    --ask-key-pass's or ssh-agent's job). Never quotes the file."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        return "no such file"
    except IsADirectoryError:
        return "is a directory, not a private key"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return f"cannot read: {exc.strerror or type(exc).__name__}"
    if len(data) > MAX_KEY_BYTES:
        return "not a private key (far too large)"
    head = data.lstrip()[:64]
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        return "is a public key; name the private key (the file without .pub)"
    if head.startswith(b"PuTTY-User-Key-File"):
        return "is a PuTTY key; convert it with `puttygen KEY -O private-openssh`"
    if not head.startswith(b"-----BEGIN "):
        return "not a private key"
    return _parse_problem(data)


def _parse_problem(data: bytes) -> str | None:
    """Parse the key (without a passphrase: encrypted is fine) and check paramiko can use it."""
    loaders = (serialization.load_ssh_private_key, serialization.load_pem_private_key)
    for load in loaders:
        try:
            key = load(data, password=None)
        except TypeError:
            return None  # encrypted: the passphrase comes from --ask-key-pass or the agent
        except UnsupportedAlgorithm:
            return "a private key of a type fleet cannot use (RSA, ECDSA and Ed25519 work)"
        except ValueError:
            continue
        if isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
            return None
        if isinstance(key, ed25519.Ed25519PrivateKey):
            return None
        return "a private key of a type fleet cannot use (RSA, ECDSA and Ed25519 work)"
    return "not a private key fleet can read (damaged, or an unsupported format)"


def check_key_files(users: Mapping[str, Iterable[str]]) -> None:
    """Refuse, before any connection, an identity file that is missing, unreadable or not a
    private key: one line naming the file and the hosts that use it."""
    for path, names in users.items():
        problem = key_file_problem(Path(path))
        if problem is None:
            continue
        who = nodeset.fold(names)
        if len(who) > 120:
            who = who[:117] + "..."
        raise ConfigError(
            f"identity file {path} (used by {who}): {problem}",
            hint="fix ansible_ssh_private_key_file / key in the inventory or IdentityFile in "
            "the ssh config",
        )
