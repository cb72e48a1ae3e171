"""`fleet checkpoints` against real DeepSpeed ZeRO-3 shards and PEFT adapters on sandbox nodes:
the real job's output (realckpt.py) laid out on two nodes, then broken the ways real runs are."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet
from realckpt import DIR, EXTRA, TAG, VENV, Artifacts

from fleet.core import nodeset

SHARD = "zero_pp_rank_{}_mp_rank_00_{}_states.pt"


def audit(sandbox: Any, tmp_path: Path, nodes: Artifacts, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_fleet(
        sandbox, "checkpoints", "--dir", DIR, "-l", ",".join(nodes.nodes), "--json", *args,
        log_dir=tmp_path / "logs", timeout_s=120,
    )  # fmt: skip
    lines = result.json_lines()
    assert lines, result.stdout + result.stderr
    return result.code, lines[-1]


def tag(doc: dict[str, Any], name: str = TAG) -> dict[str, Any]:
    return next(t for t in doc["tags"] if t["tag"] == name)


def on(sandbox: Any, node: str, script: str) -> str:
    done = sandbox.run_on(node, script)
    assert done.returncode == 0, done.stderr
    return str(done.stdout)


def test_the_real_checkpoint_is_whole(sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path) -> None:
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    first, second = ckpt_nodes.nodes
    t = tag(doc)
    assert code == 0, doc
    assert t["status"] == "complete"
    assert t["world_size"] == 4
    assert {h: tuple(r) for h, r in t["holders"]} == {first: (0, 1), second: (2, 3)}
    assert all(f["crc"] == "ok" for n in doc["nodes"] for f in n["rank_files"])
    [adapter] = doc["adapters"]
    assert adapter["tensors"] == 2
    assert adapter["target_modules"] == ["c_attn"]
    assert adapter["dtypes"] == ["F32"]
    assert not adapter["problems"]
    latest = doc["latest"][0]
    assert latest["values"] == [[first, TAG]]
    assert latest["problem"] is None
    assert all(n["free_bytes"] > 0 for n in doc["nodes"])


def test_a_missing_rank_is_named(sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path) -> None:
    on(sandbox, ckpt_nodes.nodes[1], f"rm {DIR}/{TAG}/{SHARD.format(3, 'model')}")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    assert tag(doc)["missing"] == [SHARD.format(3, "model")]
    assert tag(doc)["status"] == "incomplete"


def test_a_truncated_shard_is_named(sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path) -> None:
    path = f"{DIR}/{TAG}/{SHARD.format(2, 'optim')}"
    on(sandbox, ckpt_nodes.nodes[1], f"truncate -s 3000 {path}")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    assert tag(doc)["truncated"] == [f"{ckpt_nodes.nodes[1]}:{TAG}/{SHARD.format(2, 'optim')}"]
    assert SHARD.format(2, "optim") in tag(doc)["missing"]


def test_a_flipped_byte_fails_the_zip_crc(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    name = SHARD.format(1, "model")
    with zipfile.ZipFile(ckpt_nodes.out(ckpt_nodes.nodes[0]) / TAG / name) as z:
        member = max(z.infolist(), key=lambda i: i.file_size)
    # the middle of the largest tensor's bytes, past its local header
    offset = member.header_offset + 30 + len(member.filename.encode()) + 64 + member.file_size // 2
    flip = (
        f'python3 -c \'import sys; f=open(sys.argv[1],"r+b"); f.seek({offset}); b=f.read(1); '
        f"f.seek({offset}); f.write(bytes([b[0]^0xFF]))' {DIR}/{TAG}/{name}"
    )
    on(sandbox, ckpt_nodes.nodes[0], flip)
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    [bad] = tag(doc)["corrupt"]
    assert bad.startswith(f"{ckpt_nodes.nodes[0]}:{TAG}/{name}")
    assert "CRC" in bad


def test_stale_ranks_of_an_older_bigger_run_are_extra(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    first, second = ckpt_nodes.nodes
    # a 2-rank run saved the same tag on the first node; the second still holds ranks 2-3 of
    # the old 4-rank run, and the first node's own old ranks were overwritten
    small = ckpt_nodes.small
    on(sandbox, first, f"rm -rf {DIR}; cp -a {small} {DIR}")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    t = tag(doc)
    assert code == 3
    assert t["world_size"] == 2
    assert not t["missing"]
    assert sorted(x.split(" ")[0] for x in t["extra"]) == [
        f"{second}:{TAG}/{SHARD.format(r, k)}" for r in (2, 3) for k in ("model", "optim")
    ]
    assert all("stale" in x for x in t["extra"])


def test_latest_disagreeing_is_a_failure(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    on(
        sandbox,
        ckpt_nodes.nodes[1],
        f"printf global_step1 > {DIR}/latest; mkdir {DIR}/global_step1",
    )
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    problem = doc["latest"][0]["problem"]
    assert "disagrees" in problem
    assert "global_step1" in problem
    assert TAG in problem


def test_a_janitor_pruned_tag_is_shown_not_failed(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    # the seed's janitor deletes every shard as it appears: adapters, latest, empty tag dirs
    for node in ckpt_nodes.nodes:
        on(sandbox, node, f"rm -f {DIR}/{TAG}/*_states.pt")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 0, doc
    assert tag(doc)["status"] == "pruned"


def test_an_empty_adapter_names_node_and_path(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    second = ckpt_nodes.nodes[1]
    # the seed's trap, for real: saved under ZeRO-3 without gathering, on one node
    on(sandbox, second, f"cp {EXTRA}/adapter-ungathered/* {DIR}/adapter/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    problems = doc["adapters"][0]["problems"]
    assert any(
        p.startswith(f"{second}:adapter/adapter_model.safetensors: empty adapter: all 2")
        for p in problems
    ), problems
    assert any("copies differ" in p for p in problems)


def test_a_header_only_adapter_is_empty(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    first = ckpt_nodes.nodes[0]
    on(sandbox, first, f"mkdir {DIR}/dict; cp {EXTRA}/adapter-empty-dict/* {DIR}/dict/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    [report] = [a for a in doc["adapters"] if a["path"] == "dict/adapter_model.safetensors"]
    assert report["problems"] == [
        f"{first}:dict/adapter_model.safetensors: empty adapter: no tensors (40 bytes)"
    ]


def test_adapters_that_differ_across_nodes_are_named(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    on(sandbox, ckpt_nodes.nodes[1], f"cp {EXTRA}/adapter-step1/* {DIR}/adapter/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    [problem] = doc["adapters"][0]["problems"]
    assert "copies differ" in problem
    assert all(n in problem for n in ckpt_nodes.nodes)


class Hostile:
    """A pickle that runs a command when the default loader reads it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_data_pkl_runs_nothing(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    first = ckpt_nodes.nodes[0]
    node = next(n for n in sandbox.nodes() if n.name == first)
    bad = node.bin_dir / SHARD.format(0, "model")  # the node's /usr/local/bin
    payload = pickle.dumps({"dp_world_size": Hostile(str(marker)), "x": Hostile(str(marker))})
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("archive/data.pkl", payload)
    on(sandbox, first, f"mkdir -p {DIR}/evil; mv /usr/local/bin/{bad.name} {DIR}/evil/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    assert code == 3
    assert tag(doc, "evil")["status"] == "incomplete"
    assert not marker.exists()  # the bastion's reader built no object and ran nothing
    on(sandbox, first, f"test ! -e {marker}")  # nor did the node's CRC check


def test_a_data_pkl_nested_past_the_limit_is_corrupt_not_a_crash(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    """A dict keyed by a tuple nested 200k deep: hashing it crashed the whole audit (exit 139,
    no output); it is now one rank file's fault."""
    first = ckpt_nodes.nodes[0]
    node = next(n for n in sandbox.nodes() if n.name == first)
    bad = node.bin_dir / SHARD.format(0, "model")
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}" + b")" + b"\x85" * 200_000 + b"Ns.")
    on(sandbox, first, f"mkdir -p {DIR}/deep; mv /usr/local/bin/{bad.name} {DIR}/deep/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes, "--no-crc")
    assert code == 3
    [deep] = [f for n in doc["nodes"] for f in n["rank_files"] if f["tag"] == "deep"]
    assert deep["fault"] == "corrupt: data.pkl: nests deeper than 100 levels"
    assert tag(doc)["status"] == "complete"  # the other tag is still read


def test_a_zip_of_too_many_members_is_corrupt_and_its_directory_unread(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    """A zip64 end record claiming more members than any checkpoint has: refused before its
    directory is fetched (one such file could hold 64 MiB of entries, per reading thread)."""
    from fleet.checkpoints import zipdir

    said = zipdir.MAX_MEMBERS + 1
    directory = (zipdir.CENTRAL + bytes(42)) * 10
    record = struct.pack(
        "<4sQHHIIQQQQ", zipdir.ZIP64_EOCD, 44, 45, 45, 0, 0, said, said, len(directory), 30
    )
    locator = struct.pack("<4sIQI", zipdir.ZIP64_LOCATOR, 0, 30 + len(directory), 1)
    end = struct.pack("<4sHHHHIIH", zipdir.EOCD, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    first = ckpt_nodes.nodes[0]
    node = next(n for n in sandbox.nodes() if n.name == first)
    bad = node.bin_dir / SHARD.format(0, "model")
    bad.write_bytes(zipdir.LOCAL + bytes(26) + directory + record + locator + end)
    on(sandbox, first, f"mkdir -p {DIR}/wide; mv /usr/local/bin/{bad.name} {DIR}/wide/")
    code, doc = audit(sandbox, tmp_path, ckpt_nodes, "--no-crc")
    assert code == 3
    [wide] = [f for n in doc["nodes"] for f in n["rank_files"] if f["tag"] == "wide"]
    assert wide["fault"] == f"corrupt: {said} members (a checkpoint has at most {said - 1})"


def consolidate(sandbox: Any, tmp_path: Path, nodes: Artifacts, to: str) -> FleetResult:
    return run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to", to,
        "-l", ",".join(nodes.nodes), "--python", str(VENV / "bin" / "python"),
        log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip


def test_consolidation_makes_a_file_torch_loads(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    second = ckpt_nodes.nodes[1]
    result = consolidate(sandbox, tmp_path, ckpt_nodes, f"{second}:/tmp/ckpt-out")
    assert result.code == 0, result.stdout + result.stderr
    out = "/tmp/ckpt-out/consolidated/pytorch_model.bin"
    assert f"{second}:{out}" in result.stdout
    load = (
        f'{VENV}/bin/python -c \'import torch; d = torch.load("{out}", weights_only=True); '
        "print(len(d))'"
    )
    count = int(on(sandbox, second, load).strip())
    assert f"{count} tensors" in result.stdout
    assert count > 0
    # the model's own tensor count: the tiny GPT-2 with its LoRA, as the job built it
    model = subprocess.run(
        [str(VENV / "bin" / "python"), "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); import ds_ckpt_job; "
         "print(len(ds_ckpt_job.model().state_dict()))",
         str(Path(__file__).parent.parent / "support")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert count == int(model.stdout.strip().splitlines()[-1])


def test_a_sharded_consolidation_reports_every_shard_and_replaces_the_old_weights(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    """A model over zero_to_fp32.py's --max_shard_size (5GB: any LLM) is written as shards and
    an index. The report covers them all, not the first shard; a single file an earlier
    consolidation left there goes (a loader would take it); files put beside them stay."""
    first, second = ckpt_nodes.nodes
    # the real script, its shard size shrunk so that the tiny model shards as a big one does
    on(sandbox, first, f'sed -i \'s/default="5GB"/default="4KB"/\' {DIR}/zero_to_fp32.py')
    out = "/tmp/ckpt-out/consolidated"
    on(sandbox, second, f"mkdir -p {out}; echo old >{out}/pytorch_model.bin; echo 1 >{out}/c.json")
    result = run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to",
        f"{second}:/tmp/ckpt-out", "-l", ",".join(ckpt_nodes.nodes),
        "--python", str(VENV / "bin" / "python"), "--json",
        log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    [made] = result.json_lines()
    listed = on(sandbox, second, f"ls -A {out}").split()
    shards = [n for n in listed if n.startswith("pytorch_model-")]
    assert len(shards) > 1, listed
    assert sorted(listed) == sorted([*shards, "pytorch_model.bin.index.json", "c.json"])
    assert made["path"] == f"{out}/pytorch_model.bin.index.json"
    assert sorted(made["files"]) == sorted(f"{out}/{n}" for n in listed if n != "c.json")
    sizes = on(sandbox, second, f"cd {out} && stat -c %s {' '.join(shards)}").split()
    assert made["size"] == sum(int(n) for n in sizes)
    load = (
        f"{VENV}/bin/python -c 'import sys, torch; "
        "print(sum(len(torch.load(p, weights_only=True)) for p in sys.argv[1:]))' "
        + " ".join(f"{out}/{n}" for n in shards)
    )
    assert made["tensors"] == int(on(sandbox, second, load).strip())
    assert sorted(on(sandbox, second, "ls -A /tmp/ckpt-out").split()) == sorted(
        [TAG, "consolidated", "latest", "zero_to_fp32.py"]
    )


def test_a_failed_zero_to_fp32_leaves_no_partial_weights(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    """zero_to_fp32.py killed half way (out of memory, say) after writing part of its file:
    nothing of it stays under a name a loader reads, and the weights already there stay."""
    second = ckpt_nodes.nodes[1]
    out = "/tmp/ckpt-out/consolidated"
    dies = "/tmp/ckpt-dies"
    on(
        sandbox,
        second,
        f"mkdir -p {out}; echo earlier >{out}/pytorch_model.bin; "
        f'printf \'#!/bin/sh\nmkdir -p "$3"; head -c 999 /dev/zero >"$3/pytorch_model.bin"; '
        f"exit 137\n' >{dies}; chmod +x {dies}",
    )
    result = run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to",
        f"{second}:/tmp/ckpt-out", "-l", ",".join(ckpt_nodes.nodes), "--python", dies,
        log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip
    on(sandbox, second, f"rm -f {dies}")
    assert result.code == 1, result.stdout + result.stderr
    assert "zero_to_fp32.py exited 137" in result.stderr
    assert on(sandbox, second, f"cat {out}/pytorch_model.bin").strip() == "earlier"
    assert "consolidated.part" not in on(sandbox, second, "ls -A /tmp/ckpt-out")


def test_consolidation_refuses_naming_missing_ranks(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    second = ckpt_nodes.nodes[1]
    on(
        sandbox,
        second,
        f"rm {DIR}/{TAG}/{SHARD.format(2, 'optim')} {DIR}/{TAG}/{SHARD.format(3, 'model')}",
    )
    result = consolidate(sandbox, tmp_path, ckpt_nodes, f"{second}:/tmp/ckpt-out")
    assert result.code == 3, result.stdout + result.stderr
    assert "missing ranks 2,3" in result.stderr
    assert on(sandbox, second, "ls /tmp/ckpt-out 2>/dev/null || true").strip() == ""


def test_a_shard_still_being_written_is_named(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    first = ckpt_nodes.nodes[0]
    name = SHARD.format(0, "optim")
    # a process holds the shard open for writing, as a save in progress does
    pid = on(
        sandbox, first,
        f"setsid sh -c 'exec 3>>{DIR}/{TAG}/{name}; exec sleep 120' </dev/null >/dev/null 2>&1 & "
        "echo $!",
    ).strip()  # fmt: skip
    try:
        code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    finally:
        on(sandbox, first, f"kill {pid}")
    assert code == 3
    assert tag(doc)["status"] == "writing"
    assert tag(doc)["writing"] == [f"{first}:{TAG}/{name}"]
    [node] = [n for n in doc["nodes"] if n["host"] == first]
    assert node["writing"] == [f"{TAG}/{name}"]


def test_a_node_without_python_reports_crc_not_checked(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    second = ckpt_nodes.nodes[1]
    hidden = Path("/var/cache/fleet-test/ckpt-no-python")
    hidden.write_text("")  # not executable: `command -v python3` finds nothing
    sandbox.bind_into(second, hidden, "/usr/bin/python3")
    try:
        code, doc = audit(sandbox, tmp_path, ckpt_nodes)
    finally:
        sandbox.unbind(second, "/usr/bin/python3")
    [node] = [n for n in doc["nodes"] if n["host"] == second]
    assert {f["crc"] for f in node["rank_files"]} == {"not checked"}
    assert code == 0
    assert tag(doc)["status"] == "complete"
    assert len(tag(doc)["unchecked"]) == 4


def shards() -> list[tuple[int, str]]:
    """Every rank file of the real tag: ranks 0-3, model and optimizer states."""
    return [(rank, SHARD.format(rank, kind)) for rank in range(4) for kind in ("model", "optim")]


def test_consolidation_dry_run_names_every_shard_and_changes_nothing(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    first, second = ckpt_nodes.nodes
    result = run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to",
        f"{second}:/tmp/ckpt-out", "-l", ",".join(ckpt_nodes.nodes),
        "--python", str(VENV / "bin" / "python"), "--dry-run",
        log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for rank, name in shards():
        holder = first if rank < 2 else second
        want = f"would copy: {holder}:{DIR}/{TAG}/{name} -> {second}:/tmp/ckpt-out/{TAG}/{name} ("
        assert [line for line in lines if line.startswith(want)], (want, result.stdout)
    assert any(
        line.startswith("would copy: ")
        and line.split(" -> ")[1].startswith(f"{second}:/tmp/ckpt-out/zero_to_fp32.py")
        for line in lines
    ), result.stdout
    command = (
        f"would run on {second}: {VENV}/bin/python /tmp/ckpt-out/zero_to_fp32.py /tmp/ckpt-out "
        "/tmp/ckpt-out/consolidated.part"
    )
    assert command in lines, result.stdout
    assert on(sandbox, second, "ls -A /tmp/ckpt-out 2>/dev/null || true").strip() == ""


def test_consolidation_refuses_sudo_and_copies_nothing(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    second = ckpt_nodes.nodes[1]
    for args in (
        ["consolidate", TAG, "--to", f"{second}:/tmp/ckpt-out", "--sudo"],
        ["--sudo"],
    ):
        result = run_fleet(
            sandbox, "checkpoints", *args, "--dir", DIR, "-l", ",".join(ckpt_nodes.nodes),
            log_dir=tmp_path / "logs", timeout_s=120,
        )  # fmt: skip
        assert result.code == 2, result.stdout + result.stderr
        assert "--sudo is not supported" in result.stderr
        assert "hint:" in result.stderr
    assert on(sandbox, second, "ls -A /tmp/ckpt-out 2>/dev/null || true").strip() == ""


def test_a_stopped_consolidation_reruns_skipping_verified_shards(
    sandbox: Any, ckpt_nodes: Artifacts, tmp_path: Path
) -> None:
    """The first run stops after the copies (its zero_to_fp32.py python fails); one copied shard
    is then damaged on HOST. The rerun copies only that one, skips every verified one, finishes."""
    first, second = ckpt_nodes.nodes
    to = f"{second}:/tmp/ckpt-out"
    nodes = ",".join(ckpt_nodes.nodes)
    stopped = run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to", to, "-l", nodes,
        "--python", "/bin/false", log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip
    assert stopped.code == 1, stopped.stdout + stopped.stderr
    assert "zero_to_fp32.py exited 1" in stopped.stderr
    damaged = SHARD.format(1, "optim")
    on(
        sandbox,
        second,
        f"printf x | dd of=/tmp/ckpt-out/{TAG}/{damaged} bs=1 seek=100 conv=notrunc",
    )
    rerun = run_fleet(
        sandbox, "checkpoints", "consolidate", TAG, "--dir", DIR, "--to", to, "-l", nodes,
        "--python", str(VENV / "bin" / "python"), "--json",
        log_dir=tmp_path / "logs", timeout_s=300,
    )  # fmt: skip
    assert rerun.code == 0, rerun.stdout + rerun.stderr
    [made] = rerun.json_lines()
    actions = {c["target"].rsplit("/", 1)[-1]: c["action"] for c in made["copies"]}
    assert actions == {
        **{name: "skipped" for _rank, name in shards()},
        damaged: "copied",
        "zero_to_fp32.py": "skipped",
    }
    source = on(sandbox, first, f"sha256sum {DIR}/{TAG}/{damaged}").split()[0]
    assert on(sandbox, second, f"sha256sum /tmp/ckpt-out/{TAG}/{damaged}").split()[0] == source
    assert made["tensors"] > 0
    assert on(sandbox, second, "ls -A /tmp/ckpt-out/" + TAG).split() == sorted(
        name for _rank, name in shards()
    )


# ---------------------------------------------------------------- a dir a node does not have


def _checkpoints(sandbox: Any, tmp_path: Path, nodes: list[Any], *args: str) -> FleetResult:
    return run_fleet(
        sandbox, "checkpoints", *args, "-l", ",".join(n.name for n in nodes),
        log_dir=tmp_path / "logs", timeout_s=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("directory", "why"),
    [("/nonexistent/ckpt", "no such directory"), ("/etc/passwd", "not a directory")],
)
def test_a_dir_no_node_has_is_a_failure_not_a_whole_audit(
    sandbox: Any, tmp_path: Path, directory: str, why: str
) -> None:
    nodes = sandbox.nodes()[:2]
    plain = _checkpoints(sandbox, tmp_path, nodes, "--dir", directory)

    assert plain.code == 3, plain.stdout + plain.stderr
    assert "every tag complete" not in plain.stdout
    assert f"checkpoints: nothing audited: no node has {directory}" in plain.stdout
    for node in nodes:
        assert f"{node.name}: {why}: {directory} (wrong host or typo?)" in plain.stdout

    as_json = _checkpoints(sandbox, tmp_path, nodes, "--dir", directory, "--json")
    assert as_json.code == 3
    doc = as_json.json_lines()[-1]
    assert (doc["exit_code"], doc["failures"]) == (3, 2)
    assert {(n["host"], n["exists"], n["missing"]) for n in doc["nodes"]} == {
        (node.name, False, why) for node in nodes
    }


def test_a_node_without_the_dir_is_named_and_fails_the_audit(sandbox: Any, tmp_path: Path) -> None:
    has, lacks = sandbox.nodes()[:2]
    directory = "/tmp/ckpt-only-one"
    on(sandbox, has.name, f"mkdir -p {directory}")
    try:
        result = _checkpoints(sandbox, tmp_path, [has, lacks], "--dir", directory)
    finally:
        on(sandbox, has.name, f"rm -rf {directory}")

    assert result.code == 3, result.stdout + result.stderr
    assert f"{lacks.name}: no such directory: {directory} (wrong host or typo?)" in result.stdout
    assert f"{has.name}: no such directory" not in result.stdout
    assert "checkpoints: 1 problem(s)" in result.stdout


def test_consolidation_refuses_a_dir_no_node_has(sandbox: Any, tmp_path: Path) -> None:
    first, second = sandbox.nodes()[:2]
    result = _checkpoints(
        sandbox, tmp_path, [first, second],
        "consolidate", "global_step2", "--dir", "/nonexistent/ckpt", "--to", f"{first.name}:/tmp/x",
    )  # fmt: skip

    assert result.code == 3, result.stdout + result.stderr
    assert (
        "cannot consolidate global_step2: no selected node has /nonexistent/ckpt "
        f"(no such directory on {nodeset.fold([first.name, second.name])})"
    ) in result.stderr
