#!/usr/bin/env python3
"""The node-side cost of fleet's process facts (fleet/remote/facts.sh) by the node's process count.

`fleet cleanup`, `kill-docker`, `status` and `preflight` run facts.sh on every node: one scan of
every process, one grep of every command line. A busy training node has thousands of processes
(kernel threads are left out; DataLoader workers, a container runtime's shims and agents are not),
so the script's cost per process decides how long those verbs take there. This measures it: for
each count N, a fresh PID namespace with N sleeping processes plus a training tree (8 ranks named
`python train.py`, 16 workers each), then facts.sh with cleanup's patterns, RUNS times, CPU
(user+sys of the script and its children) and wall. `--base REV` measures that revision's
facts.sh too, on the same processes, for a before/after.

    sudo python3 bench/facts.py [--counts 500,2000,5000] [--runs 3] [--base REV]

Needs root (a PID namespace: `unshare --pid --fork --mount-proc`) and GNU time. Writes
bench/results/facts.json and facts.md. Every process it starts lives in the namespace, which ends
with its init: nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, log

PATTERNS = ("torchrun", r"train\.py")  # cleanup's default patterns
RANKS, WORKERS = 8, 16

# Run inside the namespace: $1 count, $2 runs, $3 the results file, then the scripts to time.
# Sleepers first, then the training tree, then each script RUNS times, interleaved; one
# `NAME WALL USER SYS` line each, appended to the results file.
INSIDE = r"""
n=$1 runs=$2 results=$3; shift 3
i=0; while [ "$i" -lt "$n" ]; do sleep 600 & i=$((i + 1)); done
r=0; while [ "$r" -lt __RANKS__ ]; do
    bash -c 'for w in $(seq __WORKERS__); do sleep 600 & done
        exec -a "python train.py --rank" sleep 600' &
    r=$((r + 1))
done
sleep 1
k=0; while [ "$k" -lt "$runs" ]; do
    for s; do
        /usr/bin/time -a -o "$results" -f "${s##*/} %e %U %S" \
            sh -s -- --pattern torchrun --pattern 'train\.py' <"$s" >/dev/null
    done
    k=$((k + 1))
done
"""


def _composed(root: Path) -> str:
    """facts.sh as fleet ships it (lib.sh sourced in), from the checkout at `root`."""
    code = (
        "import sys; from fleet.core.playbook import shipped_script as s; "
        "sys.stdout.write(s('facts.sh'))"
    )
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(  # in `root`: `-c` puts the working directory first on sys.path
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    return out.stdout


def _checkout(rev: str, into: Path) -> Path:
    """The `fleet` package of revision `rev`, unpacked under `into`."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "fleet"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(
    counts: list[int], runs: int, scripts: dict[str, Path], results: Path
) -> dict[str, Any]:
    inside = INSIDE.replace("__RANKS__", str(RANKS)).replace("__WORKERS__", str(WORKERS))
    rows: dict[str, Any] = {}
    for n in counts:
        log(f"{n} processes + {RANKS * (WORKERS + 1)} training: {runs} runs of {list(scripts)}")
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
        # From a file: `sh -c TEXT` would put the patterns in that shell's command line, and it
        # would match them, with every sleeper as its descendant.
        script = results.with_name("inside.sh")
        script.write_text(inside)
        argv += ["sh", str(script), str(n), str(runs), str(results)]
        results.write_text("")
        subprocess.run([*argv, *map(str, scripts.values())], check=True, timeout=1800)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in scripts}
        by_file = {path.name: name for name, path in scripts.items()}
        for line in results.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] in by_file:
                wall, user, sys_ = map(float, parts[1:])
                samples[by_file[parts[0]]].append((wall, user + sys_))
        rows[str(n)] = {
            name: {
                "wall_s": statistics.median(w for w, _ in got),
                "cpu_s": statistics.median(c for _, c in got),
                "runs": len(got),
            }
            for name, got in samples.items()
            if got
        }
    return rows


def markdown(doc: dict[str, Any]) -> str:
    names = list(doc["scripts"])
    lines = [
        "# facts.sh by the node's process count",
        "",
        f"Generated {doc['generated']} by `{doc['command']}`.",
        f"Machine: {doc['cores']} cores. Each N: N sleeping processes plus a training tree of "
        f"{RANKS} ranks with {WORKERS} workers each, in a PID namespace of their own; facts.sh "
        f"with cleanup's patterns; medians of {doc['runs']} runs.",
        "",
        "| processes | " + " | ".join(f"{n}: CPU s | {n}: wall s" for n in names) + " |",
        "| ---: | " + " | ".join("---: | ---:" for _ in names) + " |",
    ]
    for n, row in doc["rows"].items():
        cells = []
        for name in names:
            got = row.get(name)
            cells += [f"{got['cpu_s']:.2f}", f"{got['wall_s']:.2f}"] if got else ["-", "-"]
        lines.append(f"| {int(n) + RANKS * (WORKERS + 1)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="500,2000,5000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", help="also measure this revision's facts.sh (e.g. HEAD~1)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/facts.py needs root (a PID namespace)", file=sys.stderr)
        return 2
    counts = [int(c) for c in args.counts.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-facts-") as tmp:
        scripts: dict[str, Path] = {}
        if args.base:
            base = Path(tmp) / "base.sh"
            base.write_text(_composed(_checkout(args.base, Path(tmp) / "base")))
            scripts[f"base ({args.base})"] = base
        here = Path(tmp) / "here.sh"
        here.write_text(_composed(REPO))
        scripts["this checkout"] = here
        rows = measure(counts, args.runs, scripts, Path(tmp) / "times")
    doc = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "sudo python3 bench/facts.py " + " ".join(sys.argv[1:]),
        "cores": os.cpu_count(),
        "runs": args.runs,
        "scripts": list(scripts),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "facts.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "facts.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
