"""A small real PyTorch job for the cleanup tests: what it leaves on a node is torch's own.

Started by the venv's torchrun (or `python -m torch.distributed.run`) on one sandbox node, gloo on
loopback. Each rank joins the process group, wraps a tiny model in DistributedDataParallel (which
imports torch._dynamo: /tmp/torchinductor_<user>) and trains on batches from a DataLoader with one
persistent worker process, as real jobs do. The batches reach the rank through
torch.multiprocessing's sharing strategy: with `file_descriptor` (Linux's default) the worker
serves each tensor's fd on a unix socket in its /tmp/pymp-*/; with `file_system` they are
/dev/shm/torch_* segments that a torch_shm_manager (socket in /tmp/torch-shm-dir-*/) unlinks when
its clients are gone. A `spawn` DataLoader context adds named semaphores (/dev/shm/sem.mp-*).

    torch_job.py [--steps N] [--until FILE] [--step-s SECONDS] [--ready DIR]
                 [--rank1-sharing file_descriptor|file_system] [--rank1-context fork|spawn]

The --rank1-* options apply to rank 1 only, so one two-rank job shows both ways. --ready DIR:
each rank creates DIR/rank<R> once it has trained a step (the test polls for it). --until FILE:
train on (up to --steps) until FILE exists, then end cleanly. Output lines: `rank R step N`,
`rank R done`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

# The DataLoader lives until the interpreter exits, as in a script that builds it at module
# level: its worker is still running then, and multiprocessing's exit handler SIGTERMs it (it is
# daemonic), so the worker's /tmp/pymp-* stays. A loader collected before exit shuts its worker
# down cleanly and the dir goes with it.
LOADERS: list[DataLoader] = []


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--until", type=Path)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--rank1-sharing", default="file_descriptor")
    parser.add_argument("--rank1-context", default="fork")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    sharing, context = "file_descriptor", "fork"
    if rank == 1:
        sharing, context = args.rank1_sharing, args.rank1_context
    torch.multiprocessing.set_sharing_strategy(sharing)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(
        data, batch_size=4, num_workers=1, persistent_workers=True, multiprocessing_context=context
    )
    LOADERS.append(loader)
    step, stop = 0, False
    while not stop:
        for x, y in loader:
            step += 1
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            print(f"rank {rank} step {step}", flush=True)
            if args.ready and step == 1:
                args.ready.mkdir(parents=True, exist_ok=True)
                (args.ready / f"rank{rank}").touch()
            time.sleep(args.step_s)
            stop = step >= args.steps or stop_agreed(args.until)
            if stop:
                break
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


def stop_agreed(until: Path | None) -> bool:
    """True on every rank once any rank sees FILE (all take the same number of steps: DDP's
    backward is a collective)."""
    if until is None:
        return False
    flag = torch.tensor([1.0 if until.exists() else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if __name__ == "__main__":
    main()
