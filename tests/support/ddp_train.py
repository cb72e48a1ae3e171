"""A real (small) multi-node DDP training job for the end-to-end tests: PyTorch's CPU build, gloo.

Started by `torchrun` through `fleet launch` on every sandbox node. Every rank joins the process
group and proves it with an all-reduce of the ranks (the sum only comes out right when all of them
took part); then it trains a tiny model with DistributedDataParallel, reading batches through a
DataLoader with a worker process (as real jobs do: those workers are part of what a stop must
end), and every few steps writes ZeRO-3-style shards with `torch.save` (the names DeepSpeed gives
them, so the janitor's default globs apply) beside a `latest` file the janitor must keep.

    train.py --ckpt DIR [--steps N (0 = until stopped)] [--save-every K] [--step-s SECONDS]
             [--record FILE] [ANY OTHER ARGS...]

--record writes, once the rank has joined, what fleet and torchrun handed it (host name, the
rendezvous environment, --env values, the arguments it did not know) as JSON to FILE, with
`{rank}` replaced by the rank: the launch tests assert on it.

Output lines the tests read: `rank R allreduce ok world=W sum=S`, `rank R step N loss L`,
`rank R saved DIR/global_stepN`, `rank R done`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def say(line: str) -> None:
    """One line in one write: the ranks of a node share one log (opened for appending), and
    print() under PYTHONUNBUFFERED writes the text and its newline apart, so two ranks'
    lines could run together."""
    os.write(1, (line + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.3)
    parser.add_argument("--record")
    args, rest = parser.parse_known_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    probe = torch.tensor([float(rank)])
    dist.all_reduce(probe)
    expected = world * (world - 1) / 2
    if probe.item() != expected:
        raise SystemExit(f"rank {rank}: all-reduce gave {probe.item()}, expected {expected}")
    say(f"rank {rank} allreduce ok world={world} sum={int(probe.item())}")
    if args.record:
        record(Path(args.record.format(rank=rank)), rest)

    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=16, num_workers=1, persistent_workers=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))

    step = 0
    while args.steps == 0 or step < args.steps:
        for x, y in loader:
            step += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # DDP all-reduces the gradients across every rank here
            optimizer.step()
            say(f"rank {rank} step {step} loss {loss.item():.4f}")
            if step % args.save_every == 0:
                save(args.ckpt, step, rank, local, model, optimizer)
            time.sleep(args.step_s)
            if args.steps and step >= args.steps:
                break
    dist.barrier()
    dist.destroy_process_group()
    say(f"rank {rank} done")


RECORDED_ENV = (
    "NODE_RANK",
    "NNODES",
    "NPROC_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "FLEET_RUN_ID",
    "EXTRA",
    "SPACED",
    "PAYLOAD",
)


def record(path: Path, rest: list[str]) -> None:
    """What this rank was started with, written atomically (a reader never sees half of it)."""
    facts = {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in RECORDED_ENV},
        "rest": rest,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(facts))
    tmp.replace(path)


def save(
    ckpt: Path,
    step: int,
    rank: int,
    local: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Write this rank's shards the way DeepSpeed's stage 3 names them (node-local dir)."""
    out = ckpt / f"global_step{step}"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(optimizer.state_dict(), out / f"zero_pp_rank_{local}_mp_rank_00_optim_states.pt")
    torch.save(model.state_dict(), out / f"zero_pp_rank_{local}_mp_rank_00_model_states.pt")
    if local == 0:
        (ckpt / "latest").write_text(f"global_step{step}\n")
    say(f"rank {rank} saved {out}")


if __name__ == "__main__":
    main()
