"""The sandbox's one error type (kept apart so that importing it loads nothing else)."""

from __future__ import annotations

from fleet.core.errors import FleetError


class SandboxError(FleetError):
    """The sandbox cannot be started, used or stopped; `message` says why, `hint` what next."""
