"""Read a checkpoint's `data.pkl` without running it.

A `.pt` file is a pickle, and a pickle is a program: the default loader imports any module it
names and calls whatever it is told to (`os.system` included). fleet only needs a few plain
values from it (`dp_world_size`, `global_steps`, `partition_count`, how many tensors), so this
reader walks the opcodes (pickletools.genops, which parses and never executes) and builds only
plain data: None, bools, numbers, strings, bytes, lists, tuples and dicts. Every import becomes
a `Global` naming it, every call an `Opaque` recording what would have been called with what,
every persistent id (torch's tensor storages) a `Persistent`: nothing it was not told about is
ever constructed, no module is imported, no code runs.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass, field
from typing import Any

MAX_PICKLE_BYTES = 4 * 1024 * 1024  # a DeepSpeed data.pkl is ~1.4 KB; a model's is larger


class PickleFault(Exception):
    """The bytes are not a pickle this reader accepts (malformed, truncated, too large)."""


@dataclass(frozen=True)
class Global:
    """What `module.name` would have imported."""

    module: str
    name: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class Persistent:
    """A persistent id (torch: a tensor's storage, kept outside the pickle)."""

    pid: Any


@dataclass(eq=False)
class Opaque:
    """A call that was not made: `func(*args)`, then items, appends or state the pickle set on
    its result. Mutable, because a pickle fills an object after making it (OrderedDict's
    SETITEMS); compared by identity, as the object it stands for would be."""

    func: Any
    args: Any = ()
    items: dict[Any, Any] = field(default_factory=dict)
    appends: list[Any] = field(default_factory=list)
    state: Any = None

    def calls(self, dotted: str) -> bool:
        return isinstance(self.func, Global) and self.func.dotted == dotted


_MARK = object()
_PUSH_ARG = {
    "INT",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG",
    "LONG1",
    "LONG4",
    "FLOAT",
    "BINFLOAT",
    "STRING",
    "BINSTRING",
    "SHORT_BINSTRING",
    "UNICODE",
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
    "BINBYTES",
    "SHORT_BINBYTES",
    "BINBYTES8",
    "BYTEARRAY8",
}
_CONSTANT = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_IGNORED = {"PROTO", "FRAME"}


def read_pickle(data: bytes) -> Any:
    """The value the pickle describes, built from plain data and placeholders only."""
    if len(data) > MAX_PICKLE_BYTES:
        raise PickleFault(f"pickle of {len(data)} bytes (at most {MAX_PICKLE_BYTES} are read)")
    machine = _Machine()
    try:
        for op, arg, _pos in pickletools.genops(data):
            if machine.step(op.name, arg):
                return machine.result()
    except PickleFault:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise PickleFault(f"malformed pickle: {exc}") from None
    raise PickleFault("the pickle has no STOP")


class _Machine:
    """The pickle virtual machine's stack and memo, minus every effect."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    def result(self) -> Any:
        if len(self.stack) != 1:
            raise PickleFault(f"STOP with {len(self.stack)} values on the stack")
        return self.stack[0]

    def step(self, name: str, arg: Any) -> bool:
        """Apply one opcode; True at STOP."""
        if name == "STOP":
            return True
        if name in _PUSH_ARG:
            self.stack.append(bytes(arg) if isinstance(arg, bytearray) else arg)
        elif name in _CONSTANT:
            self.stack.append(_CONSTANT[name])
        elif name not in _IGNORED:
            handler = _HANDLERS.get(name)
            if handler is None:
                raise PickleFault(f"opcode {name} is not read")
            handler(self, arg)
        return False

    def pop(self) -> Any:
        value = self.stack.pop()
        if value is _MARK:
            raise PickleFault("a MARK where a value was expected")
        return value

    def pop_mark(self) -> list[Any]:
        """The values above the topmost MARK (which is removed)."""
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                values = self.stack[i + 1 :]
                del self.stack[i:]
                return values
        raise PickleFault("no MARK on the stack")

    def top(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise PickleFault("empty stack")
        return self.stack[-1]


def _key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise PickleFault(f"unhashable dict key of type {type(value).__name__}") from None
    return value


def _set_items(target: Any, pairs: list[Any]) -> None:
    if len(pairs) % 2:
        raise PickleFault("SETITEMS with an odd number of values")
    items = target.items if isinstance(target, Opaque) else target
    if not isinstance(items, dict):
        raise PickleFault(f"SETITEM on a {type(target).__name__}")
    for i in range(0, len(pairs), 2):
        items[_key(pairs[i])] = pairs[i + 1]


def _append(target: Any, values: list[Any]) -> None:
    seq = target.appends if isinstance(target, Opaque) else target
    if not isinstance(seq, list):
        raise PickleFault(f"APPEND on a {type(target).__name__}")
    seq.extend(values)


def _global(m: _Machine, arg: Any) -> None:
    module, _, name = str(arg).partition(" ")
    m.stack.append(Global(module, name))


def _stack_global(m: _Machine, arg: Any) -> None:
    name, module = m.pop(), m.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise PickleFault("STACK_GLOBAL needs two strings")
    m.stack.append(Global(module, name))


def _reduce(m: _Machine, arg: Any) -> None:
    args, func = m.pop(), m.pop()
    m.stack.append(Opaque(func, args))


def _newobj_ex(m: _Machine, arg: Any) -> None:
    kwargs, args, cls = m.pop(), m.pop(), m.pop()
    m.stack.append(Opaque(cls, (args, kwargs)))


def _build(m: _Machine, arg: Any) -> None:
    state = m.pop()
    target = m.top()
    if isinstance(target, Opaque):
        target.state = state


def _inst(m: _Machine, arg: Any) -> None:
    module, _, name = str(arg).partition(" ")
    m.stack.append(Opaque(Global(module, name), tuple(m.pop_mark())))


def _obj(m: _Machine, arg: Any) -> None:
    values = m.pop_mark()
    if not values:
        raise PickleFault("OBJ with no class")
    m.stack.append(Opaque(values[0], tuple(values[1:])))


def _memo_get(m: _Machine, arg: Any) -> None:
    if arg not in m.memo:
        raise PickleFault(f"memo {arg} read before it was written")
    m.stack.append(m.memo[arg])


def _dict(m: _Machine, arg: Any) -> None:
    made: dict[Any, Any] = {}
    _set_items(made, m.pop_mark())
    m.stack.append(made)


def _tuple_n(n: int) -> Any:
    def handler(m: _Machine, arg: Any) -> None:
        values = [m.pop() for _ in range(n)][::-1]
        m.stack.append(tuple(values))

    return handler


def _setitem(m: _Machine, arg: Any) -> None:
    value, key = m.pop(), m.pop()
    _set_items(m.top(), [key, value])


def _setitems(m: _Machine, arg: Any) -> None:
    pairs = m.pop_mark()
    _set_items(m.top(), pairs)


def _appends(m: _Machine, arg: Any) -> None:
    values = m.pop_mark()
    _append(m.top(), values)


def _append_one(m: _Machine) -> None:
    value = m.pop()
    _append(m.top(), [value])


def _pop_any(m: _Machine) -> None:
    """POP drops the top value, a MARK included (as pickle's own loader does)."""
    if not m.stack:
        raise PickleFault("POP on an empty stack")
    m.stack.pop()


def _memoize(m: _Machine, arg: Any) -> None:
    m.memo[len(m.memo)] = m.top()


def _put(m: _Machine, arg: Any) -> None:
    m.memo[arg] = m.top()


def _ext(m: _Machine, arg: Any) -> None:
    m.stack.append(Global("copyreg.extension", str(arg)))


_HANDLERS: dict[str, Any] = {
    "MARK": lambda m, a: m.stack.append(_MARK),
    "POP": lambda m, a: _pop_any(m),
    "POP_MARK": lambda m, a: m.pop_mark(),
    "DUP": lambda m, a: m.stack.append(m.top()),
    "EMPTY_LIST": lambda m, a: m.stack.append([]),
    "EMPTY_DICT": lambda m, a: m.stack.append({}),
    "EMPTY_TUPLE": lambda m, a: m.stack.append(()),
    "EMPTY_SET": lambda m, a: m.stack.append([]),
    "LIST": lambda m, a: m.stack.append(m.pop_mark()),
    "TUPLE": lambda m, a: m.stack.append(tuple(m.pop_mark())),
    "FROZENSET": lambda m, a: m.stack.append(tuple(m.pop_mark())),
    "TUPLE1": _tuple_n(1),
    "TUPLE2": _tuple_n(2),
    "TUPLE3": _tuple_n(3),
    "DICT": _dict,
    "APPEND": lambda m, a: _append_one(m),
    "APPENDS": _appends,
    "ADDITEMS": _appends,
    "SETITEM": _setitem,
    "SETITEMS": _setitems,
    "GET": _memo_get,
    "BINGET": _memo_get,
    "LONG_BINGET": _memo_get,
    "PUT": _put,
    "BINPUT": _put,
    "LONG_BINPUT": _put,
    "MEMOIZE": _memoize,
    "GLOBAL": _global,
    "STACK_GLOBAL": _stack_global,
    "REDUCE": _reduce,
    "NEWOBJ": _reduce,
    "NEWOBJ_EX": _newobj_ex,
    "BUILD": _build,
    "INST": _inst,
    "OBJ": _obj,
    "PERSID": lambda m, a: m.stack.append(Persistent(a)),
    "BINPERSID": lambda m, a: m.stack.append(Persistent(m.pop())),
    "EXT1": _ext,
    "EXT2": _ext,
    "EXT4": _ext,
    "NEXT_BUFFER": lambda m, a: m.stack.append(Persistent("out-of-band buffer")),
    "READONLY_BUFFER": lambda m, a: None,
}


def tensor_count(value: Any) -> int:
    """Tensors in a torch state dict: the values that torch would rebuild as tensors."""
    items = value.items if isinstance(value, Opaque) else value
    if not isinstance(items, dict):
        return 0
    return sum(1 for v in items.values() if _is_tensor(v))


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, Opaque)
        and isinstance(value.func, Global)
        and (value.func.module.startswith("torch") and "rebuild" in value.func.name)
    )


def plain(value: Any, default: Any = None) -> Any:
    """The plain value behind a placeholder where one is obvious: an enum member made by
    calling its class with one plain argument (DeepSpeed's ZeroStageEnum(3)) reads as 3."""
    if isinstance(value, Opaque) and isinstance(value.args, tuple) and len(value.args) == 1:
        inner = value.args[0]
        if isinstance(inner, int | str):
            return inner
    if isinstance(value, int | str | float | bool) or value is None:
        return value
    return default
