"""The installed package carries every module of every package, its playbooks and node-side
scripts (not only a checkout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_every_module_playbook_and_remote_script(tmp_path: Path) -> None:
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
    man = {n.rsplit("/", 1)[1] for n in names if "/data/share/man/man1/" in n}
    assert man == {p.name for p in (ROOT / "docs" / "man" / "man1").glob("*.1")}
    assert "fleet-cleanup.1" in man
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "fleet").rglob("*.py")}
    assert sorted(modules - names) == []


def test_the_architecture_layout_names_every_module_and_package() -> None:
    layout = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    package = ROOT / "fleet"
    scripts = (*package.rglob("*.py"), *package.glob("remote/*.sh"))
    modules = [p for p in scripts if p.name != "__init__.py"]
    assert len(modules) > 60
    missing = [
        str(p.relative_to(ROOT))
        for p in modules
        if str(p.relative_to(ROOT)) not in layout
        and not (p.parent.name == "sandbox" and f" {p.name}" in layout)
    ]
    assert missing == []
    packages = [f"fleet/{p.parent.name}/" for p in package.glob("*/__init__.py")]
    assert [p for p in packages if p not in layout] == []
