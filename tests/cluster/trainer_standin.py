#!/usr/bin/env python3
"""A stand-in for `torchrun` on the test nodes (no GPU or PyTorch here): it parses the launcher
arguments fleet renders, records them with its environment, and does the one thing a real
rendezvous needs: rank 0 listens on the master port, the other ranks connect to it.

Drop a file /tmp/fail-launch on a node to make it exit at once (a node that fails to start).
"""

import argparse
import json
import os
import socket
import sys
import time

if os.path.exists("/tmp/fail-launch"):
    print("stand-in: refusing to start (/tmp/fail-launch exists)", flush=True)
    sys.exit(1)

parser = argparse.ArgumentParser()
for name in ("nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port"):
    parser.add_argument(f"--{name}", required=True)
args, rest = parser.parse_known_args()
keys = ("NODE_RANK", "NNODES", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "EXTRA", "SPACED")
record = {
    "argv": sys.argv[1:],
    "args": vars(args),
    "rest": rest,
    "env": {k: os.environ.get(k) for k in keys},
    "hostname": socket.gethostname(),
    "pid": os.getpid(),
    "connected": None,
}
rank = int(args.node_rank)
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(args.master_port)))
    server.listen(64)
else:
    deadline = time.monotonic() + 30
    while record["connected"] is None:
        try:
            socket.create_connection((args.master_addr, int(args.master_port)), timeout=1).close()
            record["connected"] = True
        except OSError:
            if time.monotonic() > deadline:
                record["connected"] = False
            time.sleep(0.2)
with open("/tmp/trainer-record.json.tmp", "w") as fh:
    json.dump(record, fh)
os.replace("/tmp/trainer-record.json.tmp", "/tmp/trainer-record.json")
step = 0
while True:
    print(f"rank {rank} step {step}", flush=True)
    step += 1
    time.sleep(0.5)
