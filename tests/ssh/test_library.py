"""fleet.ssh loads paramiko only when a connection needs it, and then without the task runner
(invoke) paramiko's config module pulls in: fleet runs ssh_config's Match exec itself, and
invoke's import was a third of paramiko's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from keyfile import write_ed25519

PROBE = """\
import json, sys
{before}
import fleet.ssh.transport, fleet.ssh.native, fleet.ssh.keeper
report = {{"paramiko_at_import": "paramiko" in sys.modules}}
from fleet.ssh.library import paramiko
paramiko.SSHClient  # the first read loads it
import paramiko.config
report["invoke_loaded"] = "invoke" in sys.modules
report["paramiko_has_it"] = paramiko.config.invoke is not None
import invoke
report["importable_after"] = invoke.__name__ == "invoke"
print(json.dumps(report))
"""


def _json_of(code: str) -> Any:
    """What `code`, run in a fresh interpreter, printed as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(proc.stdout)


def _probe(before: str = "") -> dict[str, bool]:
    return _json_of(PROBE.format(before=before))  # type: ignore[no-any-return]


def test_connecting_code_loads_paramiko_without_invoke_and_leaves_it_importable() -> None:
    assert _probe() == {
        "paramiko_at_import": False,
        "invoke_loaded": False,
        "paramiko_has_it": False,
        "importable_after": True,
    }


def test_a_process_that_already_loaded_invoke_keeps_it() -> None:
    assert _probe("import invoke") == {
        "paramiko_at_import": False,
        "invoke_loaded": True,
        "paramiko_has_it": True,
        "importable_after": True,
    }


NO_LOAD_PROBE = """\
import errno, json, socket, sys, time
from pathlib import Path
from typing import Any
from fleet.core.hosts import Host
from fleet.ssh import library
from fleet.ssh.native import NativeTransport
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import _classify
transport = NativeTransport(SshSettings(ssh_config=Path(sys.argv[1])))
hosts = [Host(name=n, address=n, user="root", key_file=sys.argv[2]) for n in ("n1", "n2", "far1")]
transport.check(hosts)
through_paramiko = transport.paramiko_hosts(hosts)
reasons = [
    _classify(exc, time.monotonic(), transport.opts, 10).reason
    for exc in (OSError(errno.ECONNREFUSED, "refused"), socket.gaierror(-2, "unknown"),
                TimeoutError(), EOFError(), ValueError("odd"))
]
heavy = [m for m in ("paramiko", "cryptography", "nacl", "bcrypt") if m in sys.modules]
print(json.dumps({"through_paramiko": through_paramiko, "reasons": reasons, "loaded": heavy}))
"""


def test_a_libssh2_run_checks_hosts_and_classifies_failures_without_paramiko(
    tmp_path: Path,
) -> None:
    """What a run does before and around libssh2 connections (targets with a config that only
    adds algorithms, the key file check, the worker sizing, socket errors) loads neither
    paramiko nor its cryptography stack; a ProxyJump host is counted as paramiko's."""
    key = write_ed25519(tmp_path / "id_ed25519")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host far*\n    ProxyJump bastion\n"
        "Host *\n    HostKeyAlgorithms +ssh-rsa\n    PubkeyAcceptedAlgorithms +ssh-rsa\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", NO_LOAD_PROBE, str(config), str(key)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(proc.stdout) == {
        "through_paramiko": 1,
        "reasons": [
            "connection refused",
            "cannot resolve address",
            "connect timed out",
            "connection closed during handshake",
            "ssh error",
        ],
        "loaded": [],
    }


RACE_PROBE = """\
import errno, json, sys, threading, time
from fleet.ssh import library
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import _classify
seen = {}
def importer():
    library.load()
def meanwhile():
    while "paramiko" not in sys.modules:  # another thread's import has begun
        pass
    seen["reason"] = _classify(OSError(errno.ECONNREFUSED, "x"), time.monotonic(),
                               SshSettings(), 10).reason
    seen["complete"] = library.paramiko.SSHException.__name__
threads = [threading.Thread(target=meanwhile), threading.Thread(target=importer)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("attempt", range(3))
def test_a_thread_never_meets_paramiko_half_imported(attempt: int) -> None:
    """While one thread imports paramiko (a ProxyJump host's first connection), another
    classifies its libssh2 host's failure and reads paramiko: the failure is not taken for
    paramiko's, and the read waits for the import to finish."""
    proc = subprocess.run(
        [sys.executable, "-c", RACE_PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(proc.stdout) == {"reason": "connection refused", "complete": "SSHException"}


QUIET_PROBE = """\
import json, logging, sys
from fleet.ssh import library
library.show_logs({debug})
before = logging.getLogger("paramiko").level
library.load()
logger = logging.getLogger("paramiko")
print(json.dumps([before, logger.level, logger.propagate]))
"""


@pytest.mark.parametrize(("debug", "after"), [(False, [0, 51, False]), (True, [0, 0, True])])
def test_paramikos_log_records_are_silenced_as_it_loads_unless_debug(
    debug: bool, after: list[object]
) -> None:
    """paramiko logs a failed handshake as a traceback; fleet reports it itself. The logger is
    set when paramiko loads (logging is not loaded for a libssh2-only run), and left as it is
    under --debug."""
    assert _json_of(QUIET_PROBE.format(debug=debug)) == after


DEBUG_LOG_PROBE = """\
import logging
from fleet.ssh import library
library.show_logs(True)
library.load()
log = logging.getLogger("paramiko.transport")
log.warning("Incompatible version (%s)", "1.99\\x1b]0;pwnver\\x07\\x1b[2J\\rfake")
try:
    raise ValueError("bad banner \\x1b[?1049h")
except ValueError:
    log.error("handshake failed", exc_info=True)
log.info("not shown: below warning")
"""


def test_paramikos_log_records_under_debug_are_shown_cleaned() -> None:
    """--debug shows paramiko's records as data: a server's banner quoted in one (ESC ]0; title,
    ESC [2J clear, a CR) shows escaped on one line, and so does an exception's text."""
    proc = subprocess.run(
        [sys.executable, "-c", DEBUG_LOG_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr
    assert "\r" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "Incompatible version (1.99\\x1b]0;pwnver\\x07\\x1b[2J\\rfake)"
    assert lines[1] == "handshake failed"
    assert lines[-1] == "ValueError: bad banner \\x1b[?1049h"
    assert "not shown" not in proc.stderr
