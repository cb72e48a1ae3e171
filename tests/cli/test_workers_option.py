"""--workers: flag > FLEET_WORKERS > fleet.yaml's `workers` > auto, each reaching the runner."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleet.cli import main
from fleet.core.events import HostFinished, Outcome, RunSummary
from fleet.ops import jobs as verbs


@pytest.fixture
def project(trusted_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trusted project dir to run in, no config or environment from the developer's shell."""
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG", "FLEET_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trusted_tmp / "no-user-config"))
    monkeypatch.setenv("FLEET_LOG_DIR", str(trusted_tmp / "runs"))
    monkeypatch.chdir(trusted_tmp)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    return trusted_tmp


@pytest.fixture
def workers_seen(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, Any]]:
    """Run `fleet exec true -w a,b ARGS` with the runner replaced: (exit code, its --workers)."""
    seen: list[Any] = []

    def fake(plan: Any, run_settings: Any, secrets: Any, **kw: Any) -> RunSummary:
        seen.append(run_settings.workers)
        done = tuple(HostFinished(host=h, outcome=Outcome.OK, duration_s=0) for h in "ab")
        return RunSummary(run_id="r", playbook="exec", results=done, duration_s=0.1)

    monkeypatch.setattr(verbs, "run_plan", fake)

    def invoke(*args: str) -> tuple[int, Any]:
        seen.clear()
        with pytest.raises(SystemExit) as info:
            main(["exec", "true", "-w", "a,b", *args])
        code = info.value.code
        return int(code if isinstance(code, int) else 1), seen[0] if seen else "not run"

    return invoke


def test_workers_default_to_auto(project: Path, workers_seen: Callable[..., Any]) -> None:
    assert workers_seen() == (0, None)


def test_flag_over_env_over_project_file(
    project: Path, workers_seen: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "fleet.yaml").write_text("workers: 4\n")
    assert workers_seen() == (0, 4)
    monkeypatch.setenv("FLEET_WORKERS", "3")
    assert workers_seen() == (0, 3)
    assert workers_seen("--workers", "1") == (0, 1)
    assert workers_seen("--workers", "auto") == (0, None)


def test_auto_in_the_project_file(project: Path, workers_seen: Callable[..., Any]) -> None:
    (project / "fleet.yaml").write_text("workers: auto\n")
    assert workers_seen() == (0, None)


@pytest.mark.parametrize("value", ["0", "257", "many", "-1", "1.5"])
def test_a_bad_count_is_a_usage_error(
    project: Path,
    workers_seen: Callable[..., Any],
    value: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert workers_seen("--workers", value) == (2, "not run")
    assert "expected auto or a whole number from 1 to 256" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "many", "true", "[2]"])
def test_a_bad_count_in_fleet_yaml_names_file_and_line(
    project: Path,
    workers_seen: Callable[..., Any],
    value: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (project / "fleet.yaml").write_text(f"forks: 8\nworkers: {value}\n")
    assert workers_seen() == (1, "not run")
    err = capsys.readouterr().err
    assert f"{project / 'fleet.yaml'}:2: workers: expected auto or a whole number" in err
