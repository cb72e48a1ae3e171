"""A private, real Docker engine for the cluster tests, and a test image built with no registry.

Why a private daemon: the machine's default dockerd is not started (scripts/setup stops the
package from starting one), and a test must not touch anyone else's containers, networks or
iptables. This one runs with no bridge, no iptables/forwarding/masquerading changes, its own
cgroup parent, and every file under its own directory (`ENGINE_ROOT/<key>`: data root, exec root,
pidfile, socket, daemon.json and key.json, so it reads no /etc/docker/daemon.json and writes no
/etc/docker/key.json). The one exception is containerd's: its 1.6 shims always put their sockets
in /run/containerd/s, which teardown removes once empty and no containerd runs.

`<key>` hashes the checkout and the session's sandbox subnet, so two sessions side by side (each
on its own sandbox subnet, tests/e2e/conftest.py) get two daemons. The directory is on the
host's disk, not under /tmp, /root or /run: sandbox nodes mount private tmpfs there and could
not see the socket's real file to bind it (see `DockerEngine.attach`).

The image: `debootstrap --variant=minbase --include=python3,procps bookworm` from the Debian
mirror apt is configured with (read at run time, never hard-coded), trimmed, `docker import`ed,
then kept as a `docker save` tarball in CACHE_DIR whose name carries a hash of the recipe: a
re-run loads it in seconds, a changed recipe builds a new one. A file lock serialises the build
between sessions. Containers get loopback only (`--bridge=none`), which is all these tests need.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

ENGINE_ROOT = Path(os.environ.get("FLEET_TEST_DOCKER_ROOT", "/var/lib/fleet-test/docker"))
CACHE_DIR = Path(os.environ.get("FLEET_TEST_IMAGE_CACHE", "/var/cache/fleet-test"))
DOCKERD = "/usr/sbin/dockerd"
# docker.io's client: the one every sandbox node runs (the newer /usr/local/bin/docker is
# hidden on the nodes by their own bin dir), so the tests drive the engine with the same one.
DOCKER = "/usr/bin/docker"
INNER_SOCKET = "/run/docker.sock"  # the standard path (/var/run -> /run) inside a node
# Tools dockerd finds on PATH (containerd, runc, docker-init): the distribution's, not ours.
DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")

# Everything that decides the image's content; its hash names the image tag and the cache file.
RECIPE: dict[str, Any] = {
    "version": 1,
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3", "procps"],
    # Emptied after debootstrap: documentation and apt's indexes and caches (~60 MB).
    "trim": [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/lib/apt/lists",
        "var/cache/apt",
        "var/cache/debconf",
        "var/log",
    ],
}
IMAGE_REPO = "fleet-test/bookworm-py"


class EngineError(Exception):
    """The private engine or its image could not be set up; the message says what and where."""


def recipe_hash() -> str:
    """12 hex digits naming the image tag and its cache file."""
    text = json.dumps(RECIPE, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_name() -> str:
    """`repo:recipe-hash`: a changed recipe is a new image, never a stale one under an old name."""
    return f"{IMAGE_REPO}:{recipe_hash()}"


# ---------------------------------------------------------------- apt's mirror


def _one_line_entries(text: str) -> Iterator[tuple[list[str], str, list[str], list[str]]]:
    """(types, uri, suites, components) of each `deb [opts] URI SUITE COMP...` line."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        kind, words = words[0], words[1:]
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            yield [kind], words[0], [words[1]], words[2:]


def _deb822_entries(text: str) -> Iterator[tuple[list[str], str, list[str], list[str]]]:
    """(types, uri, suites, components) for each URI of each enabled deb822 stanza."""
    stanzas: list[dict[str, str]] = [{}]
    key = ""
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            stanzas.append({})
            continue
        if raw[0] in " \t" and key:
            stanzas[-1][key] += " " + raw.strip()
        elif ":" in raw:
            key, value = raw.split(":", 1)
            key = key.strip().lower()
            stanzas[-1][key] = value.strip()
    for st in stanzas:
        if st.get("enabled", "yes").lower() == "no":
            continue
        for uri in st.get("uris", "").split():
            yield (
                st.get("types", "").split(),
                uri,
                st.get("suites", "").split(),
                st.get("components", "").split(),
            )


def apt_mirror(suite: str = str(RECIPE["suite"])) -> str:
    """The first `deb` source apt uses for `suite` with component main: debootstrap's mirror.

    Read from apt's own configuration at run time, so the tests follow whatever mirror (or
    local proxy) this machine is set up with, and the repository names no host.
    """
    files: list[tuple[Path, bool]] = [(SOURCES_LIST, False)]
    if SOURCES_DIR.is_dir():
        for path in sorted(SOURCES_DIR.iterdir()):
            if path.suffix in (".list", ".sources"):
                files.append((path, path.suffix == ".sources"))
    for path, deb822 in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        entries = _deb822_entries(text) if deb822 else _one_line_entries(text)
        for types, uri, suites, components in entries:
            if "deb" in types and suite in suites and "main" in components:
                return uri
    raise EngineError(
        f"no `deb` source for {suite} main in {SOURCES_LIST} or {SOURCES_DIR}/*.list|*.sources: "
        "debootstrap needs apt's Debian mirror to build the test image"
    )


# ---------------------------------------------------------------- small helpers


def _tail(path: Path, lines: int = 8) -> str:
    """The end of a log, for one failure message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


def _cmdline(pid: int) -> list[str]:
    """A process's argv ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _alive(pid: int) -> bool:
    """The pid runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def _wait_gone(pids: Sequence[int], timeout_s: float) -> bool:
    """Poll until none of the pids runs; False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` in our mount namespace, deepest first."""
    found = []
    prefix = str(root).rstrip("/") + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == str(root) or target.startswith(prefix):
            found.append(target)
    return sorted(set(found), key=len, reverse=True)


def _unmount_all(root: Path) -> list[str]:
    """Unmount everything under `root` (lazily if busy); what is still mounted after that."""
    for target in _mounts_under(root):
        if subprocess.run(["umount", target], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    return _mounts_under(root)


@contextlib.contextmanager
def _flock(path: Path, blocking: bool = True) -> Iterator[IO[str]]:
    """An exclusive lock on `path` for the block; EngineError if not blocking and it is held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise EngineError(
                f"{path} is locked: another test session is using this engine directory "
                "(give each concurrent session its own FLEET_TEST_SUBNET)"
            ) from None
        try:
            yield fh
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------- the engine


@dataclass
class DockerEngine:
    """One private dockerd: where its files are, how to start, use and stop it."""

    root: Path
    cgroup_parent: str
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_session(cls, subnet: str) -> DockerEngine:
        """The engine of this checkout and sandbox subnet (stable across re-runs)."""
        checkout = Path(__file__).resolve().parents[2]
        key = hashlib.sha256(f"{checkout}|{subnet}".encode()).hexdigest()[:10]
        return cls(root=ENGINE_ROOT / key, cgroup_parent=f"fleet-test-docker-{key}")

    # ------------------------------------------------------------ paths

    @property
    def socket_path(self) -> Path:
        return self.root / "docker.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "docker.pid"

    @property
    def data_root(self) -> Path:
        return self.root / "data"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def host(self) -> str:
        """DOCKER_HOST for clients on this machine (outside the sandbox nodes)."""
        return f"unix://{self.socket_path}"

    def daemon_argv(self) -> list[str]:
        """dockerd with every file under our root and nothing changed on the host's network."""
        return [
            DOCKERD,
            f"--config-file={self.root / 'daemon.json'}",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--storage-driver=overlay2",
            f"--cgroup-parent={self.cgroup_parent}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            "-H",
            self.host,
        ]

    # ------------------------------------------------------------ client

    def docker(
        self, *args: str, stdin: IO[bytes] | None = None, timeout_s: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker client against this engine; EngineError naming the command on failure."""
        env = {
            "PATH": DAEMON_PATH,
            "DOCKER_HOST": self.host,
            "DOCKER_CONFIG": str(self.root / "client"),  # not /root/.docker
            "LANG": "C.UTF-8",
        }
        try:
            proc = subprocess.run(
                [DOCKER, *args],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"docker {' '.join(args[:3])} timed out after {timeout_s}s") from exc
        if check and proc.returncode != 0:
            raise EngineError(
                f"docker {' '.join(args[:4])} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()}"
            )
        return proc

    def ping(self) -> bool:
        """True if the daemon answers GET /_ping on its socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            try:
                sock.connect(str(self.socket_path))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                answer = sock.recv(4096)
            except OSError:
                return False
        return answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n", 1)[0]

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Clear what a crashed session left, start dockerd, wait until it answers."""
        self._clear_leftovers()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Our own (empty of settings) config file: dockerd then never reads /etc/docker's, and
        # the engine's identity key goes here instead of /etc/docker/key.json.
        (self.root / "daemon.json").write_text(
            json.dumps({"deprecated-key-path": str(self.root / "key.json")}) + "\n"
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.daemon_argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": DAEMON_PATH, "LANG": "C.UTF-8"},
                cwd="/",
                start_new_session=True,  # a Ctrl-C to pytest must not reach it; teardown stops it
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ping():
            if self.proc.poll() is not None:
                raise EngineError(
                    f"dockerd exited (code {self.proc.returncode}) before it was ready; "
                    f"{self.log_path} ends with:\n{_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise EngineError(
                    f"dockerd did not answer on {self.socket_path} within {READY_TIMEOUT_S:.0f}s;"
                    f" {self.log_path} ends with:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def _clear_leftovers(self) -> None:
        """A previous session of this engine that crashed: stop its daemon, remove its state.

        Only a daemon whose command line names this very data root is stopped (the caller holds
        the engine's lock, so no live session owns it); the data and exec roots are removed
        only once nothing is mounted under them.
        """
        pid = self._pid_from_file()
        if pid and self._is_our_daemon(pid):
            self._terminate(pid)
        self._stop_strays()
        self._remove_state()

    def _pid_from_file(self) -> int:
        try:
            return int(self.pidfile.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _is_our_daemon(self, pid: int) -> bool:
        """The pid is a dockerd started with this engine's data root."""
        argv = _cmdline(pid)
        return (
            bool(argv)
            and os.path.basename(argv[0]) == "dockerd"
            and f"--data-root={self.data_root}" in argv
        )

    def _terminate(self, pid: int) -> None:
        """TERM, wait for a clean shutdown (it stops its containerd), KILL at the deadline."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if self.proc is not None and self.proc.pid == pid:
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            return
        if not _wait_gone([pid], STOP_TIMEOUT_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone([pid], 5)

    def _stop_strays(self) -> None:
        """After dockerd is gone: its containerd and shims, if a crash left them running.

        They are found by their command lines naming this engine's exec root, which no other
        process on the machine has.
        """
        marker = str(self.exec_root) + "/"
        strays = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and any(marker in a for a in _cmdline(int(entry))):
                strays.append(int(entry))
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(strays, 5)

    def _remove_state(self) -> None:
        """Delete data and exec roots (fresh each session: no containers from a crashed run)."""
        left = _unmount_all(self.root)
        if left:
            raise EngineError(f"cannot unmount {', '.join(left[:3])}: remove it by hand")
        for path in (self.data_root, self.exec_root, self.socket_path, self.pidfile):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------ stop

    def stop(self) -> list[str]:
        """Remove every container, stop the daemon, unmount, remove cgroups; what went wrong."""
        problems: list[str] = []
        if self.proc is not None and self.proc.poll() is None and self.ping():
            with contextlib.suppress(EngineError):
                ids = self.docker("ps", "-aq", "--no-trunc").stdout.split()
                if ids:
                    self.docker("rm", "-f", *ids, timeout_s=60, check=False)
        pid = self._pid_from_file() or (self.proc.pid if self.proc else 0)
        if pid and self._is_our_daemon(pid):
            self._terminate(pid)
        elif self.proc is not None and self.proc.poll() is None:
            self._terminate(self.proc.pid)
        self._stop_strays()
        left = _unmount_all(self.root)
        problems += [f"still mounted: {m}" for m in left]
        problems += self._remove_cgroups()
        _remove_shim_dirs()
        if not left:
            self._remove_state()
        return problems

    def _remove_cgroups(self) -> list[str]:
        """rmdir our cgroup parent in every hierarchy, children first; the ones that stay."""
        kept = []
        base = Path("/sys/fs/cgroup")
        candidates = [base / self.cgroup_parent, *base.glob(f"*/{self.cgroup_parent}")]
        for top in candidates:
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                try:
                    d.rmdir()
                except OSError as exc:
                    kept.append(f"cgroup {d}: {exc.strerror}")
        return kept

    # ------------------------------------------------------------ nodes

    def attach(self, box: Any, node: Any) -> None:
        """Make the engine the node's docker at the standard socket path (its mount ns only)."""
        box.bind_into(node, self.socket_path, INNER_SOCKET)

    def detach(self, box: Any, node: Any) -> None:
        """Undo `attach`: the node has no docker daemon again (and no socket file either)."""
        box.unbind(node, INNER_SOCKET, remove=True)


def _remove_shim_dirs() -> None:
    """Remove containerd's shim socket dirs (/run/containerd/s), if empty and no containerd runs.

    containerd 1.6's shims put their sockets there whatever the daemon's exec root is, so the
    private engine cannot avoid creating them; with no containerd left on the machine, no shim
    can be about to use them.
    """
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]).startswith("containerd"):
            return
    for path in (Path("/run/containerd/s"), Path("/run/containerd")):
        with contextlib.suppress(OSError):  # absent, or not empty: someone else's
            path.rmdir()


# ---------------------------------------------------------------- the image


def ensure_image(engine: DockerEngine) -> float:
    """Load the test image into the engine from the cache, building the cache first if needed.

    Returns the seconds it took. The lock makes a second session wait for a build in progress
    instead of building the same image alongside it.
    """
    started = time.monotonic()
    cache = CACHE_DIR / f"{IMAGE_REPO.replace('/', '-')}-{recipe_hash()}.tar"
    with _flock(CACHE_DIR / "image.lock"):
        if not cache.exists():
            _build_image(engine, cache)
        else:
            with open(cache, "rb") as fh:
                engine.docker("load", "-q", stdin=fh, timeout_s=300)
    engine.docker("image", "inspect", image_name())  # the cache held what its name says
    return time.monotonic() - started


def _build_image(engine: DockerEngine, cache: Path) -> None:
    """debootstrap, trim, import into the engine, save to `cache` (atomically); drop old caches."""
    rootfs = CACHE_DIR / f"rootfs-{recipe_hash()}"
    log = CACHE_DIR / f"build-{recipe_hash()}.log"
    _remove_rootfs(rootfs)  # a half-built tree from an interrupted build
    try:
        _debootstrap(rootfs, log)
        _trim(rootfs)
        _import(engine, rootfs)
        partial = cache.with_suffix(".partial")
        engine.docker("save", "-o", str(partial), image_name(), timeout_s=300)
        partial.replace(cache)
    finally:
        _remove_rootfs(rootfs)
    for old in CACHE_DIR.glob(f"{IMAGE_REPO.replace('/', '-')}-*.tar"):
        if old != cache:
            old.unlink(missing_ok=True)


def _remove_rootfs(rootfs: Path) -> None:
    """Delete a build tree, but only once nothing is mounted in it: an interrupted debootstrap
    can leave /proc or /sys (or a bind of /dev) mounted there, which rmtree would walk into."""
    if not rootfs.exists():
        return
    left = _unmount_all(rootfs)
    if left:
        raise EngineError(f"cannot unmount {', '.join(left[:3])}: remove {rootfs} by hand")
    shutil.rmtree(rootfs)


def _debootstrap(rootfs: Path, log: Path) -> None:
    """A minimal bookworm with python3 and procps, from apt's mirror (~1 min, ~120 MB)."""
    if shutil.which("debootstrap", path=DAEMON_PATH) is None:
        raise EngineError("debootstrap is not installed (scripts/setup installs it)")
    argv = [
        "debootstrap",
        f"--variant={RECIPE['variant']}",
        f"--include={','.join(RECIPE['include'])}",
        str(RECIPE["suite"]),
        str(rootfs),
        apt_mirror(),
    ]
    with open(log, "wb") as out:
        rc = subprocess.run(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": DAEMON_PATH, "LANG": "C.UTF-8"},
            timeout=1200,
            check=False,
        ).returncode
    if rc != 0:
        raise EngineError(f"`{' '.join(argv)}` failed (exit {rc}); {log} ends with:\n{_tail(log)}")


def _trim(rootfs: Path) -> None:
    """Empty the directories the tests never need (they stay, empty, as dpkg expects)."""
    for rel in RECIPE["trim"]:
        top = rootfs / rel
        if not top.is_dir():
            continue
        for child in top.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _import(engine: DockerEngine, rootfs: Path) -> None:
    """`tar -C rootfs -c . | docker import - IMAGE`."""
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert tar.stdout is not None
    try:
        engine.docker("import", "-", image_name(), stdin=tar.stdout, timeout_s=300)
    finally:
        tar.stdout.close()
        tar.wait()
    if tar.returncode != 0:
        raise EngineError(f"tar of {rootfs} failed (exit {tar.returncode})")


# ---------------------------------------------------------------- the fixture


def start_engine(subnet: str) -> tuple[DockerEngine, float]:
    """A running engine with the test image loaded, and how long the image took."""
    engine = DockerEngine.for_session(subnet)
    try:
        engine.start()
        return engine, ensure_image(engine)
    except BaseException:
        engine.stop()
        raise


def engine_session(subnet: str) -> Iterator[DockerEngine]:
    """The body of the session fixture `docker_engine` (registered in conftest.py): a private
    dockerd with the test image for the whole session, always torn down.

    As root (where the cluster tests run), an engine that cannot start is a failure with the
    reason, never a skip: a skipped test would hide a broken setup.
    """
    if not os.access(DOCKERD, os.X_OK):
        pytest.fail(f"{DOCKERD} not found: install docker.io (scripts/setup does)")
    root = DockerEngine.for_session(subnet).root
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(_flock(root.with_suffix(".lock"), blocking=False))
            engine, took = start_engine(subnet)
        except (EngineError, OSError) as exc:
            pytest.fail(f"cannot start a private Docker engine: {exc}")
        print(f"\nprivate dockerd at {engine.socket_path}; image {image_name()} in {took:.1f}s")
        try:
            yield engine
        finally:
            problems = engine.stop()
        assert not problems, f"private dockerd teardown left: {problems}"
