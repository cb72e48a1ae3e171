"""The audit's decisions on what the nodes hold (fleet.checkpoints.analysis), on scans built by
hand in the shapes real nodes report."""

from __future__ import annotations

import dataclasses

import pytest

from fleet.checkpoints.analysis import audit
from fleet.checkpoints.consolidate import Refused, refuse_without_zero, sources
from fleet.checkpoints.node import NodeScan, RankFile, ShardMeta, shard_meta
from fleet.checkpoints.report import failure_lines

TAG = "global_step2"
WORLD = 4


def rank_file(rank: int, kind: str, *, mtime: float = 1000.0, size: int = 4096) -> RankFile:
    meta = ShardMeta(dp_world_size=WORLD, mp_world_size=1, global_steps=2)
    name = f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"
    return RankFile(f"{TAG}/{name}", TAG, rank, 0, kind, size, meta, None, "ok", mtime)


def node(host: str, ranks: range, **kw: float) -> NodeScan:
    files = tuple(rank_file(r, k, **kw) for r in ranks for k in ("model", "optim"))  # type: ignore[arg-type]
    return NodeScan(host, "/ckpt", rank_files=files)


def test_node_local_dirs_holding_their_own_ranks_are_whole() -> None:
    [tag] = audit([node("node01", range(0, 2)), node("node02", range(2, 4))]).tags
    assert tag.status == "complete", tag


def test_a_shared_output_dir_every_node_sees_whole_is_one_complete_tag() -> None:
    """NFS/Lustre: each node lists every rank's files, the same size and mtime everywhere."""
    scans = [node("node01", range(WORLD)), node("node02", range(WORLD))]
    [tag] = audit(scans).tags
    assert tag.status == "complete", tag
    assert tag.extra == ()
    # consolidation copies each rank file once, not once per node that sees it
    picked = sources(scans, tag)
    assert sorted(f.name for _h, _d, f in picked) == sorted({f.name for f in scans[0].rank_files})
    assert {h for h, _d, _f in picked} == {"node01"}


def test_a_second_copy_that_differs_is_still_extra() -> None:
    """Two different files claiming one rank (another save, a partial copy): which is right is
    unknown, so the tag is not whole."""
    scans = [node("node01", range(WORLD)), node("node02", range(2, 4), mtime=2000.0)]
    [tag] = audit(scans).tags
    assert tag.status == "incomplete"
    assert len(tag.extra) == 4
    assert all("a second copy (also on node01)" in x for x in tag.extra)


def test_ranks_on_a_node_that_was_not_read_are_unknown_not_missing() -> None:
    """node02 (ranks 2-3) down: the audit cannot say the tag is incomplete, only that it did
    not find them on the nodes it read (exit 4 says a node was not read)."""
    down = NodeScan("node02", "/ckpt", error="unreachable: connection refused")
    result = audit([node("node01", range(0, 2)), down])
    [tag] = result.tags
    assert tag.status == "unknown"
    assert not tag.ok
    assert tag.missing_ranks == (2, 3)
    lines = failure_lines(result)
    assert len(lines) == 4
    assert all("not on the nodes read (node02 not read)" in x for x in lines), lines
    assert not [x for x in lines if ": missing: " in x]


def test_a_truncated_rank_is_incomplete_whichever_node_was_not_read() -> None:
    first = node("node01", range(0, 2))
    broken = dataclasses.replace(first.rank_files[1], fault="truncated: 10 bytes")
    first = dataclasses.replace(first, rank_files=(first.rank_files[0], broken))
    down = NodeScan("node02", "/ckpt", error="unreachable: connection refused")
    [tag] = audit([first, down]).tags
    assert tag.status == "incomplete"


def test_latest_naming_a_tag_no_node_read_has_says_which_node_was_not_read() -> None:
    first = dataclasses.replace(node("node01", range(0, 2)), latest=(("", "global_step3"),))
    down = NodeScan("node02", "/ckpt", error="unreachable: connection refused")
    [latest] = audit([first, down]).latest
    assert latest.problem is not None
    assert "(node02 not read)" in latest.problem


def mp_model_file(holds_optimizer: bool) -> RankFile:
    """ZeRO-0/1/2's one model file per mp rank (no dp rank in its name)."""
    meta = ShardMeta(dp_world_size=2, mp_world_size=1, global_steps=2)
    meta = dataclasses.replace(meta, holds_optimizer=holds_optimizer)
    name = "mp_rank_00_model_states.pt"
    return RankFile(f"{TAG}/{name}", TAG, None, 0, "model", 4096, meta, None, "ok", 1000.0)


def test_deepspeed_without_zero_is_whole_in_its_one_model_file() -> None:
    """Stage 0: the optimizer state is inside mp_rank_00_model_states.pt and DeepSpeed writes
    no zero_pp_rank_*_optim_states.pt; none is missing."""
    [tag] = audit([NodeScan("node01", "/ckpt", rank_files=(mp_model_file(True),))]).tags
    assert tag.status == "complete", tag
    assert tag.missing == ()


def test_zero_2_without_its_optimizer_files_is_incomplete() -> None:
    """Stages 1-2: the model file holds no optimizer; every dp rank's optim file is needed."""
    [tag] = audit([NodeScan("node01", "/ckpt", rank_files=(mp_model_file(False),))]).tags
    assert tag.status == "incomplete"
    assert tag.missing == (
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    )


def test_a_model_file_holding_the_optimizer_still_needs_the_optim_files_the_tag_has() -> None:
    """bf16 without ZeRO writes both: the optimizer in the model file and bf16_ files per
    rank; one of those missing is missing."""
    meta = ShardMeta(dp_world_size=2, mp_world_size=1, global_steps=2)
    name = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    optim = RankFile(f"{TAG}/{name}", TAG, 0, 0, "optim", 4096, meta, None, "ok", 1000.0)
    scan = NodeScan("node01", "/ckpt", rank_files=(mp_model_file(True), optim))
    [tag] = audit([scan]).tags
    assert tag.missing == ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",)


def test_shard_meta_says_whether_the_model_file_holds_the_optimizer_state() -> None:
    assert shard_meta({"optimizer": {"state": {}, "param_groups": []}}).holds_optimizer
    assert not shard_meta({"optimizer": None}).holds_optimizer
    assert not shard_meta({}).holds_optimizer


def test_consolidating_a_tag_saved_without_zero_is_refused_naming_its_whole_model_file() -> None:
    """Stage 0 writes no zero_to_fp32.py and no shards: the refusal says where the model is,
    not that the script's node is missing."""
    scan = NodeScan("node01", "/ckpt", rank_files=(mp_model_file(True),))
    with pytest.raises(Refused) as err:
        refuse_without_zero([scan], TAG)
    assert "saved without ZeRO" in str(err.value)
    assert f"node01:{TAG}/mp_rank_00_model_states.pt" in str(err.value)
    # ZeRO-2 (no optimizer in the model file) and ZeRO-3 shards go on to the script
    refuse_without_zero([NodeScan("node01", "/ckpt", rank_files=(mp_model_file(False),))], TAG)
    refuse_without_zero([node("node01", range(WORLD))], TAG)
