"""paramiko, loaded once for every module of fleet.ssh, without the task runner it drags in.

paramiko's package imports paramiko.config, which imports `invoke` (a paramiko dependency)
for one feature: running ssh_config's `Match exec` commands. fleet runs those itself
(fleet.ssh.config.FleetSSHConfig._exec: values quoted, stdin closed), so invoke is never
called, yet importing it (and the unittest.mock it loads) was about a third of paramiko's
import time: ~23 ms of every fleet command that connects (bench/startup.py, importtime).

So paramiko is imported here with `invoke` marked absent in sys.modules, which paramiko
handles as "not installed"; the mark is removed right after, so code that imports invoke
later gets the real one. A process that had already loaded invoke is left as it is.
"""

from __future__ import annotations

import sys

_BLOCKED = "invoke"
_marked = _BLOCKED not in sys.modules
if _marked:
    sys.modules[_BLOCKED] = None  # type: ignore[assignment]  # import -> ImportError
try:
    import paramiko as paramiko  # noqa: PLC0414 - re-exported: `from fleet.ssh.library import paramiko`
finally:
    if _marked and sys.modules.get(_BLOCKED, ...) is None:
        del sys.modules[_BLOCKED]

__all__ = ["paramiko"]
