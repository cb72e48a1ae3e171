"""The methods every dataclass gets, compiled once and kept beside fleet's bytecode.

Python 3.11 writes each dataclass's `__init__`, `__repr__`, `__eq__`, `__hash__` and, for a
frozen one, `__setattr__` and `__delattr__` as source text and compiles each with `exec` when the
class is made: about 0.4 ms a class, 28 ms of every fleet command for its ~70 dataclasses (a
fifth of a one-host `exec`). The text depends only on the class's definition, so its compiled
code is the same every run, as a module's bytecode is.

`install()` puts a caching `exec` in the dataclasses module's namespace (its name lookups find
it before the builtin). For each text, it runs the code object compiled for it (`compile` with
what `exec` of a string uses: filename `<string>`, no inherited `__future__` flags), compiled
now or loaded from the cache file; anything else goes to the builtin `exec` unchanged. So a
class is made exactly as without the cache, only sooner. At exit, the process that installed it
writes the cache when it compiled something new (atomically, never under
`PYTHONDONTWRITEBYTECODE`).

Trust: the cache is code, so it is read only where Python's own bytecode for fleet lives (the
package's `__pycache__`, or `sys.pycache_prefix`), only if the file and every directory above it
are owned by the operator or root and writable by nobody else (fleet.core.trust), and only if
it was written by this Python's bytecode version. Anything else, broken or missing, is ignored:
the classes are then compiled as usual.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from types import CodeType
from typing import Any

from fleet.core import trust

# More than fleet's own dataclasses ever make (~140 classes, up to 6 methods each); past this,
# entries no longer used (edited classes) are dropped when the cache is written again.
MAX_ENTRIES = 4096
_MAGIC = importlib.util.MAGIC_NUMBER


class CodeCache:
    """Source text -> compiled code, loaded from and written to one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loaded: dict[str, CodeType] = {}
        self.used: dict[str, CodeType] = {}
        self.hits = 0
        self.misses = 0
        # Why a cache file that is there was not used (untrusted, another Python's, broken):
        # said by `--debug`, as every command then starts ~25 ms slower. None: used, or none yet.
        self.refused: str | None = None
        self._owner = os.getpid()

    def load(self) -> None:
        """Read the cache file when it exists, is trusted and is this Python's; else nothing."""
        try:
            with trust.open_checked(self.path) as fh:
                data = fh.read()
        except FileNotFoundError:
            return  # not written yet: the first command writes it
        except trust.Untrusted as exc:
            self.refused = exc.reason
            return
        except OSError as exc:
            self.refused = f"cannot be read ({exc.strerror or exc})"
            return
        if not data.startswith(_MAGIC):
            foreign = data[2:4] == b"\r\n"  # a bytecode magic number of another version
            self.refused = "written by another Python version" if foreign else "broken"
            return
        try:
            table = marshal.loads(data[len(_MAGIC) :])  # noqa: S302 (trusted as bytecode is)
        except (EOFError, ValueError, TypeError):
            self.refused = "broken"
            return
        if not isinstance(table, dict):
            self.refused = "broken"
            return
        self.loaded = {
            k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, CodeType)
        }

    def code(self, source: str) -> CodeType:
        """The code object `exec(source)` would compile, compiled at most once."""
        found = self.used.get(source) or self.loaded.get(source)
        if found is None:
            found = compile(source, "<string>", "exec", dont_inherit=True)
            self.misses += 1
        else:
            self.hits += 1
        self.used[source] = found
        return found

    def exec(
        self,
        source: Any,
        globals: dict[str, Any] | None = None,
        locals: Any = None,
        /,
    ) -> None:
        """`exec` as the dataclasses module calls it; a string's code comes from the cache."""
        if isinstance(source, str) and globals is not None:
            source = self.code(source)
        builtins.exec(source, globals, locals)  # noqa: S102 (the text dataclasses generated)

    def save(self) -> None:
        """Write the cache when this process compiled something new (not in its forks)."""
        if not self.misses or os.getpid() != self._owner or sys.dont_write_bytecode:
            return
        table = dict(self.loaded)
        table.update(self.used)
        if len(table) > MAX_ENTRIES:
            table = dict(self.used)
        aside = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError, ValueError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(_MAGIC + marshal.dumps(table))
                os.replace(aside, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(aside)


_INSTALLED: CodeCache | None = None


def default_path() -> Path | None:
    """The cache file, beside this module's own bytecode (None: this Python keeps none)."""
    try:
        pyc = Path(importlib.util.cache_from_source(__file__))
    except NotImplementedError:  # no sys.implementation.cache_tag
        return None
    return pyc.with_name(f"dataclass-methods.{sys.implementation.cache_tag}.marshal")


def refusal() -> str | None:
    """The line `--debug` says when the installed cache's file was there but not used."""
    cache = _INSTALLED
    if cache is None or cache.refused is None:
        return None
    return (
        f"dataclass-method cache {cache.path} not used: {cache.refused} "
        "(every command compiles its classes again, ~25 ms)"
    )


def install(path: Path | None = None) -> CodeCache | None:
    """Make dataclasses compile through the cache from now on, in this process and its forks
    (once; a second call returns the first cache). None when there is nowhere to keep it."""
    global _INSTALLED  # noqa: PLW0603 (one cache per process)
    if _INSTALLED is not None:
        return _INSTALLED
    path = path if path is not None else default_path()
    if path is None:
        return None
    cache = CodeCache(path)
    cache.load()
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    atexit.register(cache.save)
    _INSTALLED = cache
    return cache
