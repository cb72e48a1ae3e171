"""The installed package carries its playbooks and node-side scripts (not only a checkout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_every_playbook_and_remote_script(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("fleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for playbook in (ROOT / "playbooks").glob("*.yaml"):
        assert f"fleet/playbooks/{playbook.name}" in names
    for script in (ROOT / "fleet" / "remote").glob("*.sh"):
        assert f"fleet/remote/{script.name}" in names
    assert "fleet/playbooks/cleanup.yaml" in names
