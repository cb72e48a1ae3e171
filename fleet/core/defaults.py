"""fleet's built-in defaults, each defined once (loads nothing: `fleet --help` shows them).

The CLI's options and help texts, `fleet config`'s built-in column, the engine and the node-side
checks read them from here. The shipped playbooks state the same values in their `vars:` (they
are documents an operator reads and copies); tests/core/test_defaults.py keeps both equal.
"""

from __future__ import annotations

# Hosts worked on at once (-f/--forks).
FORKS = 32

# Worker processes (--workers, fleet/engine/workers.py): by default one per usable core, but only
# as many as give each at least WORKER_MIN_HOSTS hosts; below that a run stays in one process.
# A worker costs a fork, its pipe and the merging of its events in the parent (~0.05 s of CPU
# in all, bench/scale.py); a cold host costs ~1.6 ms of the client's CPU through libssh2
# (fleet/ssh/native.py), so a second process pays back from a few hundred hosts. At 128 hosts,
# two workers spent more CPU than one process (0.41 against 0.37 s) in the same wall time.
# A host that connects through paramiko (a ProxyJump, a certificate, --ssh-engine paramiko)
# costs ~4x that, so such hosts fill a worker at WORKER_MIN_HOSTS_PARAMIKO.
WORKER_MIN_HOSTS = 128
WORKER_MIN_HOSTS_PARAMIKO = 32

# --ssh-engine: "auto" connects runs of steps through libssh2 where a host suits it
# (fleet/ssh/native.py), "paramiko" always through paramiko. The first is the default.
SSH_ENGINES = ("auto", "paramiko")

# SSH: the TCP connect when neither --connect-timeout nor the ssh config's ConnectTimeout is set;
# the banner after TCP connects (a stalled node sends none); authentication.
CONNECT_TIMEOUT_S = 10.0
BANNER_TIMEOUT_S = 15.0
AUTH_TIMEOUT_S = 15.0
# Warm connections (--persist): seconds a connection stays open after a command for the next one
# to reuse (Ansible's ControlPersist); 0: none.
PERSIST_S = 60.0

# Where things are when no flag, environment variable or config file says otherwise.
INVENTORY = "./inventory.yaml"
SSH_CONFIG = "~/.ssh/config"
LOG_DIR = "~/.local/state/fleet/runs"  # run records ($XDG_STATE_HOME when set: runlog.py)
HOST_KEYS = "strict"

# The rendezvous port (MASTER_PORT): what launch renders, preflight checks free on rank 0 and
# cleanup frees.
PORT = 39500

# Training processes: extended regexes on each process's full command line (like pkill -f).
PATTERNS = ("torchrun", r"train\.py")

# Seconds between SIGTERM and SIGKILL: cleanup and kill-docker; stop (torchrun itself escalates
# to KILL after 30 s); a launch's rollback of a start that failed. Whole numbers: playbooks
# render them into node-side commands.
GRACE_S = 10
STOP_GRACE_S = 30
ROLLBACK_GRACE_S = 10

# launch: processes per node (the inventory var `gpus` wins) and the torchrun to start.
NPROC_PER_NODE = 8
LAUNCHER = "torchrun"

# preflight: fail below this free space on the output dir's filesystem.
MIN_FREE_GB = 50

# janitor: seconds between passes; files modified more recently than this are never touched.
JANITOR_INTERVAL_S = 3
JANITOR_MIN_AGE_S = 10

# logs: lines shown from the end of each node's log. status --watch: seconds between refreshes.
LOG_LINES = 20
WATCH_INTERVAL_S = 2.0


def shown(patterns: tuple[str, ...] = PATTERNS) -> str:
    """Patterns as help texts show them, escapes dropped: `torchrun, train.py`."""
    return ", ".join(p.replace("\\", "") for p in patterns)
