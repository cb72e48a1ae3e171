"""fleet/remote/status.sh's gpus action run locally under sh, the way a node runs it, with an
`nvidia-smi` stand-in first on PATH. `fleet status` reads a step's facts from its last stdout line
(fleet.engine.runner.parse_facts), so that line must say what happened, whatever nvidia-smi said."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from fleet.core.playbook import _with_includes
from fleet.engine.runner import parse_facts
from fleet.remote import __file__ as remote_init

SCRIPT = Path(remote_init).with_name("status.sh")


def gpus(tmp_path: Path, smi: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["sh", "-s", "--", "gpus"],
        input=_with_includes(SCRIPT, SCRIPT.parent, ()),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_gpu_facts_are_summed_on_the_last_line(tmp_path: Path) -> None:
    proc = gpus(tmp_path, "printf '0, 100, 80000, 50\\n1, 300, 80000, 10\\n'\n")
    assert proc.returncode == 0, proc.stderr
    facts = parse_facts(proc.stdout.splitlines()[-1])
    assert facts == {
        "gpus": "2",
        "mem_used_mib": "400",
        "mem_total_mib": "160000",
        "util_avg_pct": "30",
    }


def test_a_failing_nvidia_smi_says_error_on_the_last_line_and_its_words_on_stderr(
    tmp_path: Path,
) -> None:
    """nvidia-smi's own message came after the `gpus=error` line: the status table read the
    message as the facts line and showed `-`, as if the node had no GPU facts at all."""
    proc = gpus(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n",
    )
    assert proc.returncode == 1
    assert parse_facts(proc.stdout.splitlines()[-1]) == {
        "gpus": "error",
        "reason": "nvidia-smi-failed",
    }
    assert "couldn't communicate" in proc.stderr


def test_a_hung_nvidia_smi_is_given_up_before_the_steps_own_timeout(tmp_path: Path) -> None:
    """A GPU fallen off the bus hangs nvidia-smi: unbounded, the step hit its 30 s timeout and
    the whole node showed as timed out (exit 4, its run's state not shown)."""
    started = time.monotonic()
    proc = gpus(tmp_path, "exec sleep 100\n")
    assert time.monotonic() - started < 30
    assert proc.returncode == 1
    assert parse_facts(proc.stdout.splitlines()[-1]) == {
        "gpus": "error",
        "reason": "nvidia-smi-timed-out",
    }
