"""fleet.ssh loads paramiko only when a connection needs it, and then without the task runner
(invoke) paramiko's config module pulls in: fleet runs ssh_config's Match exec itself, and
invoke's import was a third of paramiko's."""

from __future__ import annotations

import json
import subprocess
import sys

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


def _probe(before: str = "") -> dict[str, bool]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


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
