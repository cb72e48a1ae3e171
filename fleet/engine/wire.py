"""Events as frames on a pipe, from a worker process to its parent (fleet/engine/workers.py).

One frame is one line of JSON (ASCII only, so a node's text can never hold the newline that ends
it, and a lone surrogate survives the trip). Decoding knows every type it accepts by name, in
REGISTRY, and builds nothing else: a frame is data, never code (no pickle), and an unknown type,
a missing or an extra field is a WireError. Secrets never travel here: a worker has them from
fork memory.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    LateOutputIgnored,
    Outcome,
    OutputLine,
    ShellNoiseIgnored,
    StepFinished,
    StepStarted,
)
from fleet.core.result import CleanupDone


class WireError(ValueError):
    """A frame that is not one of the registered types, whole and well formed."""


@dataclass(frozen=True)
class WorkerFigures:
    """A worker's own account, its last frame: what its process cost (getrusage RUSAGE_SELF)
    and how many hosts it ran. The parent keeps them in the run record (summary.json).
    `stays`: the worker lives on after the run, as the keeper of its connections
    (fleet/engine/workers.py's Stay); the parent neither waits for it nor ends it."""

    index: int
    pid: int
    hosts: int
    user_s: float
    sys_s: float
    maxrss_kb: int
    stays: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _tuple_of_str(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WireError("expected a list of strings")
    return tuple(value)


def _cleanup_done(value: Any) -> CleanupDone | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError("expected an object for 'done'")
    fields = dict(value)
    fields["port_holders"] = tuple(fields.get("port_holders", ()))
    fields["failed"] = tuple(fields.get("failed", ()))
    done: CleanupDone = _build(CleanupDone, fields)
    return done


# Every type a worker sends, by the name on the wire, with how its non-JSON fields are rebuilt
# (enums, tuples, nested values); fields not named here are str, int, float, bool or None.
REGISTRY: dict[str, tuple[type, dict[str, Callable[[Any], Any]]]] = {
    "HostConnecting": (HostConnecting, {}),
    "HostConnected": (HostConnected, {}),
    "StepStarted": (StepStarted, {}),
    "OutputLine": (OutputLine, {}),
    "ShellNoiseIgnored": (ShellNoiseIgnored, {"lines": _tuple_of_str}),
    "LateOutputIgnored": (LateOutputIgnored, {"lines": _tuple_of_str}),
    "StepFinished": (StepFinished, {"stderr_tail": _tuple_of_str}),
    "HostFinished": (
        HostFinished,
        {"outcome": Outcome, "stderr_tail": _tuple_of_str, "done": _cleanup_done},
    ),
    "WorkerFigures": (WorkerFigures, {}),
}
_NAMES = {cls: name for name, (cls, _) in REGISTRY.items()}


def encode(item: Event | WorkerFigures) -> bytes:
    """One frame: the item's fields as a JSON object with its type's name, and a newline."""
    name = _NAMES.get(type(item))
    if name is None:
        raise WireError(f"not a wire type: {type(item).__name__}")
    fields = item.to_dict()
    fields["event"] = name
    return json.dumps(fields, separators=(",", ":")).encode("ascii") + b"\n"


def decode(frame: bytes) -> Event | WorkerFigures:
    """The item a frame holds; WireError when it is not a registered type, whole."""
    try:
        fields = json.loads(frame)
    except ValueError as exc:
        raise WireError(f"not a JSON frame: {exc}") from None
    if not isinstance(fields, dict):
        raise WireError("a frame is a JSON object")
    name = fields.pop("event", None)
    entry = REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        raise WireError(f"unknown frame type {str(name)[:40]!r}")
    cls, converters = entry
    for key, convert in converters.items():
        if key in fields:
            try:
                fields[key] = convert(fields[key])
            except (TypeError, ValueError) as exc:
                raise WireError(f"{name}.{key}: {exc}") from None
    built: Event | WorkerFigures = _build(cls, fields)
    return built


# Each type's field names, and whether an instance can be filled in directly (read once: the
# hot path, once per event of every worker).
_FIELDS: dict[type, tuple[frozenset[str], bool]] = {}


def _build(cls: type, fields: dict[str, Any]) -> Any:
    """cls(**fields), exactly its fields: a missing or an unknown one is a WireError.

    A frame names every field (encode writes them all), in their order: then the instance's
    attributes are set as they are, which is what a frozen dataclass's __init__ does one
    object.__setattr__ at a time (~2.5 us a frame) for a type with no __post_init__."""
    known = _FIELDS.get(cls)
    if known is None:
        names = frozenset(f.name for f in dataclasses.fields(cls))
        direct = not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
        known = _FIELDS[cls] = (names, direct)
    names, direct = known
    if direct and fields.keys() == names:
        built: Any = object.__new__(cls)
        built.__dict__.update(fields)
        return built
    extra = fields.keys() - names
    if extra:
        raise WireError(f"{cls.__name__}: unknown field {sorted(extra)[0][:40]!r}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise WireError(f"{cls.__name__}: {exc}") from None
