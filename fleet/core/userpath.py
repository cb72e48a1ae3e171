"""`~` and `~user` at the start of a path a person typed (an option, an environment variable, a
config file): expanded as the shell would, and a `~user` naming nobody on this machine is a
clear error rather than pathlib's RuntimeError."""

from __future__ import annotations

import os
from pathlib import Path

from fleet.core.errors import ConfigError


def expand(path: str | Path, where: str = "") -> Path:
    """`path` with a leading `~` or `~user` expanded (Path.expanduser); `where` (e.g. `-l @`,
    `fleet.yaml:3: log_dir: `) starts the message when `~user` is no user here."""
    text = os.fspath(path)
    expanded = os.path.expanduser(text)
    if text.startswith("~") and expanded == text:
        user = text[1:].split("/", 1)[0]
        name = f"~{user}" if user else "~"
        raise ConfigError(
            f"{where}{text}: cannot expand {name}: "
            + (f"no user {user!r} on this machine" if user else "no home directory"),
            hint=f"write the path without {name} (the home directory in full)",
        )
    return Path(expanded)
