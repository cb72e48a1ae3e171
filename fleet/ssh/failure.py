"""ConnectFailed: a host could not be reached or logged into. Its own light module (no paramiko),
so that the warm path (fleet/ssh/warm.py) and the engine can name it without loading paramiko."""

from __future__ import annotations


class ConnectFailed(Exception):
    """A host could not be reached or logged into; `reason` is the short classification."""

    def __init__(self, reason: str, detail: str = "", retryable: bool = False) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retryable = retryable
