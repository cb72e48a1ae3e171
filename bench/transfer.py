#!/usr/bin/env python3
"""Benchmark `fleet push` / `fleet pull` against scp and sftp on the same sandbox link, and
fleet's client memory and CPU while pulling from many nodes at once.

    sudo python3 bench/transfer.py                        # 1 GiB x 1 node; 64 nodes x 256 MiB
    sudo python3 bench/transfer.py --quick                # 256 MiB x 1 node; 8 nodes x 64 MiB
    sudo python3 bench/transfer.py --subnet 10.246.0.0/16 --runs 3

Not a test: it measures. It starts a sandbox of real sshd nodes (fleet/sandbox/, its own state dir
and subnet), writes the source files once on real disk under --workdir (not tmpfs; every node sees
the same file system there, so one file serves every node without copies), then:

* single: LARGE bytes pushed to and pulled from node01 by fleet, scp and sftp (OpenSSH's, the
  same ssh config, keys and link), and by fleet with no `ssh` on its PATH (its paramiko
  fallback), alternating tools, --runs times each; wall time per run,
  MB/s = bytes / wall time of the whole command (fleet's includes its sha256 on both ends and
  its fsyncs; scp and sftp verify nothing). The destination is removed before every run.
* many: N nodes x SMALL bytes pulled at once (`fleet pull -f N`): wall time, aggregate MB/s, the
  client's peak RSS and user+sys CPU (GNU time). The pulled files are checked against the
  source's sha256, then deleted.
* tree: a tree of --tree-files small files (1 to 64 KiB, as a model's config, tokenizer and
  code files) pushed to and pulled from node01 by fleet, `scp -r` and sftp's `put -r`/`get -r`,
  alternating, --runs times each: wall time, files/s, the client's CPU and the whole machine's.
  Every file is checked against the source after each run.

`--parts single,many,tree` picks what runs (all by default); --parts tree alone takes ~1 min.

Writes bench/results/transfer.md and transfer.json. The sandbox and every file it made are
removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.common import log, machine_busy_s, python_env  # noqa: E402
from fleet.sandbox import Sandbox  # noqa: E402

MIB = 1024 * 1024


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB x 1 node; 8 nodes x 64 MiB")
    ap.add_argument("--large-mib", type=int, default=1024, help="single-node file size")
    ap.add_argument("--nodes", type=int, default=64, help="nodes pulled from at once")
    ap.add_argument("--small-mib", type=int, default=256, help="file size per node (many)")
    ap.add_argument("--runs", type=int, default=2, help="runs per tool (single, tree)")
    ap.add_argument("--tree-files", type=int, default=300, help="files in the tree (tree)")
    ap.add_argument("--parts", default="single,many,tree", help="what to run [all]")
    ap.add_argument("--subnet", default="10.249.0.0/16")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/fleet-bench-transfer"))
    ap.add_argument("--out", type=Path, default=BENCH / "results")
    args = ap.parse_args()
    if args.quick:
        args.large_mib, args.nodes, args.small_mib = 256, 8, 64
    return args


def make_file(path: Path, mib: int) -> str:
    """A file of random bytes (incompressible), written once; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    hasher = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(mib):
            block = os.urandom(MIB)
            hasher.update(block)
            f.write(block)
    return hasher.hexdigest()


def timed(cmd: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run under GNU time: wall s, user+sys CPU s, peak RSS (largest process, KiB); and the
    whole machine's busy CPU s meanwhile (both ends of the link)."""
    marker = "FLEETBENCH"
    full = ["/usr/bin/time", "-f", f"{marker} %e %U %S %M", *cmd]
    busy = machine_busy_s()
    started = time.monotonic()
    proc = subprocess.run(
        full, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    wall = time.monotonic() - started
    busy = machine_busy_s() - busy
    line = [x for x in proc.stderr.splitlines() if x.startswith(marker)][-1].split()
    return {
        "code": proc.returncode,
        "wall_s": wall,
        "cpu_s": float(line[2]) + float(line[3]),
        "machine_cpu_s": busy,
        "peak_rss_mib": int(line[4]) / 1024,
        "tail": (proc.stdout + proc.stderr)[-600:] if proc.returncode else "",
    }


def single(
    sb: Sandbox, args: argparse.Namespace, src: Path, fleet_env: dict[str, str]
) -> dict[str, Any]:
    """LARGE to and from node01 with each tool, alternating."""
    cfg = str(sb.ssh_config_path)
    dest_remote = args.workdir / "pushed"  # the node writes here (same disk, seen by all)
    dest_local = args.workdir / "pulled"
    fleet = [sys.executable, "-m", "fleet"]
    batch = args.workdir / "sftp.batch"
    fleet_push = [*fleet, "push", str(src), f"{dest_remote}/blob", "-l", "node01", "--plain"]
    fleet_pull = [*fleet, "pull", str(src), str(dest_local), "-l", "node01", "--plain"]
    no_ssh = args.workdir / "no-ssh-on-path"
    no_ssh.mkdir(parents=True, exist_ok=True)
    envs = {"fleet-paramiko": {**fleet_env, "PATH": str(no_ssh)}}
    tools: dict[str, dict[str, list[str]]] = {
        "fleet": {"push": fleet_push, "pull": fleet_pull},
        "fleet-paramiko": {"push": fleet_push, "pull": fleet_pull},
        "scp": {
            "push": ["scp", "-q", "-F", cfg, str(src), f"node01:{dest_remote}/blob"],
            "pull": ["scp", "-q", "-F", cfg, f"node01:{src}", f"{dest_local}/blob"],
        },
        "sftp": {
            "push": ["sftp", "-q", "-F", cfg, "-b", f"{batch}.push", "node01"],
            "pull": ["sftp", "-q", "-F", cfg, "-b", f"{batch}.pull", "node01"],
        },
    }
    Path(f"{batch}.push").write_text(f"put {src} {dest_remote}/blob\n")
    Path(f"{batch}.pull").write_text(f"get {src} {dest_local}/blob\n")
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    size = src.stat().st_size
    for run in range(args.runs):
        for tool, cmds in tools.items():
            for direction, cmd in cmds.items():
                for d in (dest_remote, dest_local):
                    shutil.rmtree(d, ignore_errors=True)
                    d.mkdir(parents=True)
                result = timed(cmd, envs.get(tool, fleet_env), 600)
                if result["code"] != 0:  # a failed run's wall time is no throughput
                    sys.exit(
                        f"{tool} {direction} failed (exit {result['code']}):\n{result['tail']}"
                    )
                result["mb_s"] = size / result["wall_s"] / 1e6
                samples.setdefault(tool, {}).setdefault(direction, []).append(result)
                log(
                    f"single run {run + 1}: {tool} {direction}: {result['mb_s']:.0f} MB/s "
                    f"(exit {result['code']})"
                )
    for d in (dest_remote, dest_local):
        shutil.rmtree(d, ignore_errors=True)
    return {"bytes": size, "samples": samples}


def many(
    sb: Sandbox, args: argparse.Namespace, src: Path, want: str, fleet_env: dict[str, str]
) -> dict[str, Any]:
    """N nodes x SMALL pulled at once."""
    dest = args.workdir / "many"
    shutil.rmtree(dest, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "fleet",
        "pull",
        str(src),
        str(dest),
        "-f",
        str(args.nodes),
        "--plain",
    ]
    result = timed(cmd, fleet_env, 1200)
    if result["code"] != 0:
        sys.exit(f"fleet pull from {args.nodes} nodes failed:\n{result['tail']}")
    size = src.stat().st_size
    got = sorted(dest.glob(f"*/{src.name}"))
    verified = sum(1 for p in got if _sha(p) == want)
    shutil.rmtree(dest, ignore_errors=True)
    total = size * args.nodes
    result.update(
        nodes=args.nodes,
        bytes_per_node=size,
        total_bytes=total,
        mb_s=total / result["wall_s"] / 1e6,
        files_verified=verified,
    )
    log(
        f"many: {args.nodes} x {size // MIB} MiB: {result['mb_s']:.0f} MB/s, peak RSS "
        f"{result['peak_rss_mib']:.0f} MiB, CPU {result['cpu_s']:.0f} s, {verified} verified"
    )
    return result


TREE_SIZES = (1024, 4096, 16384, 65536)


def make_tree(root: Path, count: int) -> dict[str, bytes]:
    """`count` files of TREE_SIZES bytes in a few directories; {relative path: content}."""
    files = {}
    for i in range(count):
        rel = f"d{i % 5}/f{i:04d}.bin"
        data = os.urandom(TREE_SIZES[i % len(TREE_SIZES)])
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


def tree(sb: Sandbox, args: argparse.Namespace, fleet_env: dict[str, str]) -> dict[str, Any]:
    """A tree of small files to and from node01 with each tool, alternating; every file checked
    after every run."""
    cfg = str(sb.ssh_config_path)
    src = args.workdir / "tree-src" / "tree"
    files = make_tree(src, args.tree_files)
    pushed, pulled = args.workdir / "tree-pushed", args.workdir / "tree-pulled"
    fleet = [sys.executable, "-m", "fleet"]
    batch = args.workdir / "sftp-tree.batch"
    Path(f"{batch}.push").write_text(f"put -r {src} {pushed}/tree\n")
    Path(f"{batch}.pull").write_text(f"get -r {src} {pulled}/tree\n")
    tools: dict[str, dict[str, tuple[list[str], Path]]] = {
        "fleet": {
            "push": ([*fleet, "push", str(src), f"{pushed}/", "-l", "node01", "--plain"],
                     pushed / "tree"),
            "pull": ([*fleet, "pull", str(src), str(pulled), "-l", "node01", "--plain"],
                     pulled / "node01" / "tree"),
        },
        "scp": {
            "push": (["scp", "-q", "-r", "-F", cfg, str(src), f"node01:{pushed}/"],
                     pushed / "tree"),
            "pull": (["scp", "-q", "-r", "-F", cfg, f"node01:{src}", f"{pulled}/"],
                     pulled / "tree"),
        },
        "sftp": {
            "push": (["sftp", "-q", "-F", cfg, "-b", f"{batch}.push", "node01"], pushed / "tree"),
            "pull": (["sftp", "-q", "-F", cfg, "-b", f"{batch}.pull", "node01"], pulled / "tree"),
        },
    }  # fmt: skip
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in range(args.runs):
        for tool, cmds in tools.items():
            for direction, (cmd, landed) in cmds.items():
                for d in (pushed, pulled):
                    shutil.rmtree(d, ignore_errors=True)
                    d.mkdir(parents=True)
                result = timed(cmd, fleet_env, 600)
                if result["code"] != 0:
                    sys.exit(f"{tool} {direction} (tree) failed:\n{result['tail']}")
                wrong = [r for r, data in files.items() if (landed / r).read_bytes() != data]
                if wrong:
                    sys.exit(f"{tool} {direction} (tree): {len(wrong)} files differ: {wrong[:3]}")
                result["files_s"] = len(files) / result["wall_s"]
                samples.setdefault(tool, {}).setdefault(direction, []).append(result)
                log(
                    f"tree run {run + 1}: {tool} {direction}: {result['wall_s']:.2f} s, "
                    f"{result['files_s']:.0f} files/s, client CPU {result['cpu_s']:.2f} s"
                )
    for d in (pushed, pulled, src.parent):
        shutil.rmtree(d, ignore_errors=True)
    return {"files": len(files), "bytes": sum(map(len, files.values())), "samples": samples}


def tree_lines(t: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## A tree of {t['files']} small files ({t['bytes'] // 1024} KiB in all), one node "
        "(medians)",
        "",
        "| tool | direction | wall s | files/s | client CPU s | machine CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for tool, directions in t["samples"].items():
        for direction, runs in directions.items():
            wall = statistics.median(x["wall_s"] for x in runs)
            lines.append(
                f"| {tool} | {direction} | {wall:.2f} | {t['files'] / wall:.0f} | "
                f"{statistics.median(x['cpu_s'] for x in runs):.2f} | "
                f"{statistics.median(x['machine_cpu_s'] for x in runs):.2f} |"
            )
    lines += [
        "",
        "fleet writes each file under a part name, fsyncs it, checks its sha256 on the node",
        "against the bastion's and renames it in a directory of its own (three node commands",
        "a file, four files at a time); scp and sftp write in place and verify nothing. The",
        "machine CPU is both ends': here the node's commands run on the client's cores.",
    ]
    return lines


def _sha(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            hasher.update(chunk)
    return hasher.hexdigest()


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def best(samples: list[dict[str, Any]]) -> float:
    return (
        max(s["mb_s"] for s in samples if s["code"] == 0)
        if any(s["code"] == 0 for s in samples)
        else 0.0
    )


def budget(s: dict[str, Any], cores: str) -> list[str]:
    """The CPU both ends spent per run (medians): on cores shared by both ends, a tool's
    throughput follows the CPU it spends per byte, as long as it keeps the cores as busy."""
    lines = [
        "",
        f"### CPU of both ends (the whole machine: client, sshd, node tools; {cores} cores)",
        "",
        "| tool | direction | wall s | machine CPU s | cores busy | client CPU s |",
        "|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for tool in ("fleet", "scp"):
        for direction in ("push", "pull"):
            runs = [x for x in s[tool][direction] if x["code"] == 0 and "machine_cpu_s" in x]
            if not runs:
                continue
            wall = statistics.median(x["wall_s"] for x in runs)
            busy = statistics.median(x["machine_cpu_s"] for x in runs)
            client = statistics.median(x["cpu_s"] for x in runs)
            medians[(tool, direction)] = (wall, busy)
            lines.append(
                f"| {tool} | {direction} | {wall:.2f} | {busy:.2f} | {busy / wall:.2f} | "
                f"{client:.2f} |"
            )
    said = []
    for direction in ("push", "pull"):
        if ("fleet", direction) in medians and ("scp", direction) in medians:
            fleet_cpu, scp_cpu = medians[("fleet", direction)][1], medians[("scp", direction)][1]
            said.append(f"{direction} {fleet_cpu:.2f} against {scp_cpu:.2f} CPU s")
    lines += [
        "",
        "Here both ends share the same cores, and neither tool is held by the link (a veth):",
        "each keeps the cores about as busy as the other, so throughput follows the CPU spent",
        f"on the same bytes: {', '.join(said)}. fleet's extra is the work scp does not do:",
        "a sha256 of the file on each end (one core hashes ~1.9 GB/s here: ~1.1 CPU s per GiB",
        "for both), the node's tee into its hash, and syncing the part to disk; its AES-GCM",
        "costs less than scp's chacha20-poly1305 and pays back part of it. With nodes on CPUs",
        "of their own, each end hashes on a core beside its ssh stream.",
    ]
    return lines


def write(args: argparse.Namespace, data: dict[str, Any]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    name = (
        "transfer"
        if "single" in data and "many" in data
        else "transfer-" + "-".join(part for part in ("single", "many", "tree") if part in data)
    )
    (args.out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# fleet push/pull vs scp and sftp",
        "",
        f"{data['when']} · {data['machine']} · command: `{data['command']}`",
        "",
        f"Load average (1, 5, 15 min) at the start: {data['load_start']}, at the end: "
        f"{data['load_end']} (the machine is shared: other work ran beside the bench).",
    ]
    if "single" in data:
        lines += single_lines(args, data)
    if "many" in data:
        lines += many_lines(data["many"])
    if "tree" in data:
        lines += tree_lines(data["tree"])
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")


def single_lines(args: argparse.Namespace, data: dict[str, Any]) -> list[str]:
    s = data["single"]["samples"]
    lines = [
        "",
        f"## One node, {data['single']['bytes'] // MIB} MiB "
        f"(best of {args.runs}; median in brackets)",
        "",
        "| tool | push MB/s | pull MB/s | push vs scp | pull vs scp |",
        "|---|---|---|---|---|",
    ]
    for tool in ("fleet", "fleet-paramiko", "scp", "sftp"):
        push, pull = best(s[tool]["push"]), best(s[tool]["pull"])
        med_push = statistics.median(x["mb_s"] for x in s[tool]["push"])
        med_pull = statistics.median(x["mb_s"] for x in s[tool]["pull"])
        lines.append(
            f"| {tool} | {push:.0f} ({med_push:.0f}) | {pull:.0f} ({med_pull:.0f}) | "
            f"{push / best(s['scp']['push']):.0%} | {pull / best(s['scp']['pull']):.0%} |"
        )
    return lines + budget(s, data["machine"].split()[0])


def many_lines(m: dict[str, Any]) -> list[str]:
    return [
        "",
        f"## {m['nodes']} nodes x {m['bytes_per_node'] // MIB} MiB pulled at once "
        f"(`-f {m['nodes']}`)",
        "",
        "| wall s | aggregate MB/s | client peak RSS MiB | client CPU s (user+sys) "
        "| files verified |",
        "|---|---|---|---|---|",
        f"| {m['wall_s']:.1f} | {m['mb_s']:.0f} | {m['peak_rss_mib']:.0f} | {m['cpu_s']:.1f} | "
        f"{m['files_verified']}/{m['nodes']} |",
        "",
        "MB/s = bytes / wall time of the whole command. fleet's time includes its sha256 on both",
        "ends, fsyncs and renames; scp and sftp verify nothing. The nodes' sshd and the client",
        "share this machine's cores. fleet-paramiko: fleet with no `ssh` on its PATH (the",
        "fallback: the bytes on fleet's own paramiko connection). The client's peak RSS is fleet's",
        "Python process; each host also has two short-lived `ssh` processes (its master and the",
        "file's).",
    ]


def main() -> None:
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/transfer.py needs root (sandbox nodes in namespaces)")
    started = time.monotonic()
    # The workdir is made here, 0700, and must not exist: under /var/tmp another user could have
    # made it first, with links for this root process to write through.
    try:
        args.workdir.mkdir(mode=0o700)
    except FileExistsError:
        sys.exit(f"{args.workdir} exists (a run that did not end?): remove it or pass --workdir")
    except OSError as exc:
        sys.exit(f"cannot make {args.workdir}: {exc.strerror or exc}")
    sb = Sandbox(args.workdir / "sandbox", subnet=args.subnet)
    try:
        nodes = args.nodes if "many" in args.parts.split(",") else 1
        log(f"sandbox: {nodes} nodes on {args.subnet}")
        sb.up(max(1, nodes))
        env = python_env(dict(os.environ))
        env.update(
            FLEET_INVENTORY=str(sb.inventory_path),
            FLEET_SSH_CONFIG=str(sb.ssh_config_path),
            FLEET_LOG_DIR=str(args.workdir / "records"),
            XDG_CONFIG_HOME=str(args.workdir / "no-config"),
        )
        parts = set(args.parts.split(","))
        data: dict[str, Any] = {
            "load_start": _load(),
            "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} cores, {platform.platform()}",
            "command": "sudo python3 bench/transfer.py " + " ".join(sys.argv[1:]),
        }
        if "single" in parts:
            large = args.workdir / "src" / "large.bin"
            log(f"source file: {args.large_mib} MiB on {args.workdir}")
            make_file(large, args.large_mib)
            data["single"] = single(sb, args, large, env)
        if "many" in parts:
            small = args.workdir / "src" / "small.bin"
            want = make_file(small, args.small_mib)
            data["many"] = many(sb, args, small, want, env)
        if "tree" in parts:
            data["tree"] = tree(sb, args, env)
        data["load_end"] = _load()
        data["duration_s"] = time.monotonic() - started
        write(args, data)
        log(f"done in {data['duration_s']:.0f}s: {args.out}")
    finally:
        sb.down()
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
