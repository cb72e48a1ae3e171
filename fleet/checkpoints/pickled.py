"""Read a checkpoint's `data.pkl` without running it.

A `.pt` file is a pickle, and a pickle is a program: the default loader imports any module it
names and calls whatever it is told to (`os.system` included). fleet only needs a few plain
values from it (`dp_world_size`, `global_steps`, `partition_count`, how many tensors), so this
reader walks the opcodes (pickletools.genops, which parses and never executes) and builds only
plain data: None, bools, numbers, strings, bytes, lists, tuples and dicts. Every import becomes
a `Global` naming it, every call an `Opaque` recording what would have been called with what,
every persistent id (torch's tensor storages) a `Persistent`: nothing it was not told about is
ever constructed, no module is imported, no code runs.

Nesting is bounded (MAX_DEPTH): a pickle of a few bytes per level can nest a tuple millions deep,
and CPython hashes a tuple (a dict key) by recursing in C with no guard, so a deep enough key
crashes the process; `repr` and `==` of a deep value raise RecursionError. Every container made
or filled records its depth, and one deeper than MAX_DEPTH makes the pickle corrupt.
"""

from __future__ import annotations

import pickletools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_PICKLE_BYTES = 4 * 1024 * 1024  # a DeepSpeed data.pkl is ~1.4 KB; a model's is larger
# Containers (tuples, lists, dicts, calls, persistent ids) inside one another. A real DeepSpeed
# ZeRO-3 data.pkl nests 9 deep (optimizer states), a model's 7; 100 is far above any state dict
# and far below CPython's recursion limit (1000), so `repr`, `==` and `hash` of the value work.
MAX_DEPTH = 100


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
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as exc:
        raise PickleFault(f"malformed pickle: {exc}") from None
    raise PickleFault("the pickle has no STOP")


class _Machine:
    """The pickle virtual machine's stack and memo, minus every effect."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        # Depth by id, of containers deeper than 1 (the rest are 1): every container is made
        # through `made`, which rewrites its entry, so an id reused after a free is never stale.
        self.depths: dict[int, int] = {}
        # Mutable containers pushed again by GET or DUP, the only ways one can be both inside
        # another and on the stack: filling one then deepens its holders unseen, so the
        # finished value is then measured whole (`regrown`).
        self.shared: set[int] = set()
        self.regrown = False

    def result(self) -> Any:
        if len(self.stack) != 1:
            raise PickleFault(f"STOP with {len(self.stack)} values on the stack")
        if self.regrown:
            _check_nesting(self.stack[0])
        return self.stack[0]

    def depth(self, value: Any) -> int:
        if not isinstance(value, _CONTAINERS):
            return 0
        return self.depths.get(id(value), 1)

    def made(self, container: Any, children: Iterable[Any] = ()) -> None:
        """Push a new container holding `children`, its depth recorded."""
        self.shared.discard(id(container))
        self.depths.pop(id(container), None)
        self._set_depth(container, 1 + self._deepest(children))
        self.stack.append(container)

    def filled(self, target: Any, children: Iterable[Any]) -> None:
        """`children` were put into `target` (APPEND, SETITEM, BUILD): it may be deeper now."""
        deeper = 1 + self._deepest(children)
        if deeper > self.depth(target):
            self.regrown = self.regrown or id(target) in self.shared
            self._set_depth(target, deeper)

    def _deepest(self, children: Iterable[Any]) -> int:
        return max((self.depth(child) for child in children), default=0)

    def again(self, value: Any) -> None:
        """Push a value already made (GET, DUP): a second reference to it."""
        if isinstance(value, list | dict | Opaque):
            self.shared.add(id(value))
        self.stack.append(value)

    def _set_depth(self, container: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise PickleFault(f"nests deeper than {MAX_DEPTH} levels")
        if depth > 1:
            self.depths[id(container)] = depth

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


def _set_items(m: _Machine, target: Any, pairs: list[Any]) -> None:
    if len(pairs) % 2:
        raise PickleFault("SETITEMS with an odd number of values")
    items = target.items if isinstance(target, Opaque) else target
    if not isinstance(items, dict):
        raise PickleFault(f"SETITEM on a {type(target).__name__}")
    m.filled(target, pairs)  # first: a key is hashed only once its depth is known bounded
    for i in range(0, len(pairs), 2):
        items[_key(pairs[i])] = pairs[i + 1]


def _append(m: _Machine, target: Any, values: list[Any]) -> None:
    seq = target.appends if isinstance(target, Opaque) else target
    if not isinstance(seq, list):
        raise PickleFault(f"APPEND on a {type(target).__name__}")
    m.filled(target, values)
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
    m.made(Opaque(func, args), (func, args))


def _newobj_ex(m: _Machine, arg: Any) -> None:
    kwargs, args, cls = m.pop(), m.pop(), m.pop()
    _tuple_of(m, [args, kwargs])
    both = m.pop()
    m.made(Opaque(cls, both), (cls, both))


def _build(m: _Machine, arg: Any) -> None:
    state = m.pop()
    target = m.top()
    if isinstance(target, Opaque):
        m.filled(target, [state])
        target.state = state


def _inst(m: _Machine, arg: Any) -> None:
    module, _, name = str(arg).partition(" ")
    _tuple_of(m, m.pop_mark())
    args = m.pop()
    m.made(Opaque(Global(module, name), args), (args,))


def _obj(m: _Machine, arg: Any) -> None:
    values = m.pop_mark()
    if not values:
        raise PickleFault("OBJ with no class")
    _tuple_of(m, values[1:])
    args = m.pop()
    m.made(Opaque(values[0], args), (values[0], args))


def _memo_get(m: _Machine, arg: Any) -> None:
    if arg not in m.memo:
        raise PickleFault(f"memo {arg} read before it was written")
    m.again(m.memo[arg])


def _dict(m: _Machine, arg: Any) -> None:
    pairs = m.pop_mark()
    m.made({})
    _set_items(m, m.top(), pairs)


def _tuple_of(m: _Machine, values: list[Any]) -> None:
    m.made(tuple(values), values)


def _tuple_n(n: int) -> Any:
    def handler(m: _Machine, arg: Any) -> None:
        _tuple_of(m, [m.pop() for _ in range(n)][::-1])

    return handler


def _setitem(m: _Machine, arg: Any) -> None:
    value, key = m.pop(), m.pop()
    _set_items(m, m.top(), [key, value])


def _setitems(m: _Machine, arg: Any) -> None:
    pairs = m.pop_mark()
    _set_items(m, m.top(), pairs)


def _appends(m: _Machine, arg: Any) -> None:
    values = m.pop_mark()
    _append(m, m.top(), values)


def _append_one(m: _Machine) -> None:
    value = m.pop()
    _append(m, m.top(), [value])


def _list(m: _Machine) -> None:
    values = m.pop_mark()
    m.made(values, values)


def _pop_any(m: _Machine) -> None:
    """POP drops the top value, a MARK included (as pickle's own loader does)."""
    if not m.stack:
        raise PickleFault("POP on an empty stack")
    m.stack.pop()


def _memoize(m: _Machine, arg: Any) -> None:
    m.memo[len(m.memo)] = m.top()


def _put(m: _Machine, arg: Any) -> None:
    m.memo[arg] = m.top()


def _persistent(m: _Machine, pid: Any) -> None:
    m.made(Persistent(pid), (pid,))


def _ext(m: _Machine, arg: Any) -> None:
    m.stack.append(Global("copyreg.extension", str(arg)))


_HANDLERS: dict[str, Any] = {
    "MARK": lambda m, a: m.stack.append(_MARK),
    "POP": lambda m, a: _pop_any(m),
    "POP_MARK": lambda m, a: m.pop_mark(),
    "DUP": lambda m, a: m.again(m.top()),
    "EMPTY_LIST": lambda m, a: m.made([]),
    "EMPTY_DICT": lambda m, a: m.made({}),
    "EMPTY_TUPLE": lambda m, a: m.stack.append(()),
    "EMPTY_SET": lambda m, a: m.made([]),
    "LIST": lambda m, a: _list(m),
    "TUPLE": lambda m, a: _tuple_of(m, m.pop_mark()),
    "FROZENSET": lambda m, a: _tuple_of(m, m.pop_mark()),
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
    "PERSID": lambda m, a: m.made(Persistent(a)),
    "BINPERSID": lambda m, a: _persistent(m, m.pop()),
    "EXT1": _ext,
    "EXT2": _ext,
    "EXT4": _ext,
    "NEXT_BUFFER": lambda m, a: m.made(Persistent("out-of-band buffer")),
    "READONLY_BUFFER": lambda m, a: None,
}


_CONTAINERS = (tuple, list, dict, Opaque, Persistent)


def _children(value: Any) -> Iterator[Any]:
    """What a container holds, as `_Machine.made` and `filled` count it."""
    if isinstance(value, dict):
        yield from value
        yield from value.values()
    elif isinstance(value, Opaque):
        yield from (value.func, value.args, value.state, *value.appends)
        yield from _children(value.items)
    elif isinstance(value, Persistent):
        yield value.pid
    elif isinstance(value, tuple | list):
        yield from value


def _check_nesting(value: Any) -> None:
    """Refuse a value nesting deeper than MAX_DEPTH, walked without recursion; each container is
    measured once (a pickle shares them through its memo), a loop back is not followed."""
    done: dict[int, int] = {}
    path = [(value, _children(value), 0)]  # (container, its children to go, deepest child)
    on_path = {id(value)}
    while path:
        node, rest, deepest = path[-1]
        descended = False
        for child in rest:
            if not isinstance(child, _CONTAINERS) or id(child) in on_path:
                continue
            if id(child) in done:
                deepest = max(deepest, done[id(child)])
                continue
            if len(path) >= MAX_DEPTH:
                raise PickleFault(f"nests deeper than {MAX_DEPTH} levels")
            path[-1] = (node, rest, deepest)
            path.append((child, _children(child), 0))
            on_path.add(id(child))
            descended = True
            break
        if descended:
            continue
        path.pop()
        on_path.discard(id(node))
        done[id(node)] = deepest + 1
        if deepest + 1 > MAX_DEPTH:
            raise PickleFault(f"nests deeper than {MAX_DEPTH} levels")
        if path:
            parent, parent_rest, parent_deepest = path[-1]
            path[-1] = (parent, parent_rest, max(parent_deepest, deepest + 1))


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
