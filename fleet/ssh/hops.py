"""A ProxyJump hop as ssh_config and ssh -J write it: `[user@]host[:port]`."""

from __future__ import annotations

from fleet.core.digits import is_digits


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop: `[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://...`.
    Raises ValueError with the problem."""
    text = spec.strip()
    if text.startswith("ssh://"):
        text = text[len("ssh://") :].rstrip("/")
    user, _, rest = text.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail and not tail.startswith(":"):
            raise ValueError("text after ']' must be ':PORT'")
        port_text = tail[1:]
    elif rest.count(":") > 1:
        host, port_text = rest, ""  # a bare IPv6 address
    else:
        host, _, port_text = rest.partition(":")
    if not host:
        raise ValueError("a hop without a host")
    if port_text and (not is_digits(port_text) or not 1 <= int(port_text) <= 65535):
        raise ValueError("a hop's port must be a number 1-65535")
    return user or None, host, int(port_text) if port_text else None
