"""Where warm connections' keeper sockets live: a directory only the operator can enter.

Checked as tmux and ssh-agent check theirs, with lstat (a symlink is never followed): owned by
this uid, mode exactly 0700, a real directory. `$XDG_RUNTIME_DIR/fleet` when XDG_RUNTIME_DIR is
the user's own 0700 directory (systemd makes it so); else systemd's `/run/user/UID/fleet` when
that is the user's own (sudo and cron drop XDG_RUNTIME_DIR, and nobody else can make a directory
in /run/user); else `/tmp/fleet-UID`, created 0700. A directory that fails a check is refused
(Unusable), never repaired: someone else may control it. Anyone can make /tmp/fleet-UID first,
so a command that meets a refused directory runs without warm connections (and says so) rather
than not at all (fleet/engine/runner.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from fleet.core.errors import ConfigError
from fleet.core.trust import dir_at

# systemd's per-user runtime directories (root-owned, so only root makes one for a uid).
RUN_USER = Path("/run/user")


class Unusable(ConfigError):
    """The socket directory cannot be used: refused, not makeable, or too long a path."""


def _private_dir(path: Path) -> str | None:
    """Why `path` is not this user's own private directory, or None when it is."""
    info = dir_at(path)
    if isinstance(info, str):
        return info
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not {os.getuid()}"
    if stat.S_IMODE(info.st_mode) != 0o700:
        return f"mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
    return None


def base_dir(env: Mapping[str, str] | None = None, run_user: Path = RUN_USER) -> Path:
    """The directory to use, before it is made: the runtime dir when it is ours (the one the
    environment names, else systemd's for this uid), else /tmp."""
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and _private_dir(Path(runtime)) is None:
        return Path(runtime) / "fleet"
    systemd = run_user / str(os.getuid())
    if _private_dir(systemd) is None:
        return systemd / "fleet"
    return Path("/tmp") / f"fleet-{os.getuid()}"


def socket_dir(
    create: bool = True, env: Mapping[str, str] | None = None, run_user: Path = RUN_USER
) -> Path:
    """The checked socket directory (made 0700 when missing and `create`); Unusable when it
    is not this user's own private directory."""
    path = base_dir(env, run_user)
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise Unusable(
                f"{path}: cannot make the warm connections' directory: {exc.strerror or exc}",
                hint="pass --persist 0 to connect afresh, or fix the directory",
            ) from None
    problem = _private_dir(path)
    if problem is not None and not (problem == "missing" and not create):
        raise Unusable(
            f"{path}: refused as the warm connections' directory: {problem}",
            hint="it must be your own directory, mode 0700, not a symlink: remove it (if it is "
            "not yours, ask who made it) or pass --persist 0",
        )
    return path
