"""paramiko, loaded when a connection first needs it, and without the task runner it drags in.

Loaded late: paramiko's package brings its whole stack (cryptography, PyNaCl, bcrypt, its
transport, importlib.metadata for its version): ~40 ms of CPU. A run whose hosts all connect
through libssh2 (fleet/ssh/native.py), and a warm command served by the keepers, never need it.
So `paramiko` here is a stand-in module: the first attribute read from it (`paramiko.SSHClient`,
`paramiko.SSHException` in an except clause) imports the real one, once, and every later read
goes straight to it. Code that subclasses paramiko's classes lives in modules imported only when
a host connects through paramiko (fleet/ssh/classic.py, fleet/ssh/proxy.py).

Without invoke: paramiko's package imports paramiko.config, which imports `invoke` (a paramiko
dependency) for one feature, running ssh_config's `Match exec` commands. fleet runs those itself
(fleet.ssh.config.FleetSSHConfig._exec: values quoted, stdin closed), so invoke is never called,
yet importing it (and the unittest.mock it loads) was about a third of paramiko's import time.
So paramiko is imported with `invoke` marked absent in sys.modules, which paramiko handles as
"not installed"; the mark is removed right after, so code that imports invoke later gets the
real one. A process that had already loaded invoke is left as it is.

paramiko logs handshake failures as tracebacks, and fleet reports them itself: its logger is
silenced as it loads, unless --debug asked for them (show_logs): then shown cleaned, as data
(fleet/ssh/cleanlog.py: a record may quote what a server sent). logging is loaded only then.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import TYPE_CHECKING, Any

_BLOCKED = "invoke"
_lock = threading.Lock()
_real: list[types.ModuleType] = []  # paramiko, once its import has finished (never before)
_logs = [False]  # paramiko's log records shown (--debug)


def show_logs(debug: bool) -> None:
    """Whether paramiko's log records are shown: with --debug; else silenced, once it loads."""
    _logs[0] = debug
    if _real:
        _quiet(debug)


def _quiet(debug: bool) -> None:
    import logging

    logger = logging.getLogger("paramiko")
    if not debug:
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False
        return
    from fleet.ssh import cleanlog

    cleanlog.install(logger)


def load() -> types.ModuleType:
    """The real paramiko, imported now if it was not yet (without invoke). Never a module still
    being imported by another thread: sys.modules holds one from the start of its import, so
    the fast path is `_real`, which is set only once the import has returned."""
    if _real:
        return _real[0]
    with _lock:
        if not _real:
            marked = _BLOCKED not in sys.modules
            if marked:
                sys.modules[_BLOCKED] = None  # type: ignore[assignment]  # import -> ImportError
            try:
                # Waits for an import of it another thread began outside load(), if any.
                module = importlib.import_module("paramiko")
            finally:
                if marked and sys.modules.get(_BLOCKED, ...) is None:
                    del sys.modules[_BLOCKED]
            _quiet(_logs[0])
            _real.append(module)
        return _real[0]


class _Deferred(types.ModuleType):
    """Stands for paramiko until an attribute is read from it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(load(), name)


if TYPE_CHECKING:
    import paramiko as paramiko  # noqa: PLC0414 - re-exported
else:
    paramiko = _Deferred("paramiko")


__all__ = ["load", "paramiko"]
