"""The dataclass methods' code cache (fleet/core/codecache.py): a class made through it is the
class made without it, a second process compiles nothing, a cache file anyone but the
operator could have written, or another Python's, is never run, and `--debug` says why one was
not."""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet.core import codecache


def _make() -> type[Any]:
    """A dataclass using what fleet's use: frozen, keyword-only fields, defaults, a factory, a
    field left out of eq and repr, __post_init__; this module has `from __future__ import
    annotations`, which the generated code must not inherit."""

    @dataclass(frozen=True, kw_only=True)
    class Sample:
        host: str
        port: int = 22
        tags: tuple[str, ...] = field(default_factory=tuple)
        seen: list[str] = field(default_factory=list, compare=False)
        secret: str = field(default="", compare=False, repr=False)

        def __post_init__(self) -> None:
            if self.port <= 0:
                raise ValueError("port")

    return Sample


def _made(monkeypatch: pytest.MonkeyPatch, run: Any) -> type[Any]:
    monkeypatch.setattr(dataclasses, "exec", run, raising=False)
    try:
        return _make()
    finally:
        monkeypatch.undo()


def test_a_class_made_through_the_cache_is_the_class_made_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = codecache.CodeCache(tmp_path / "cache.marshal")
    plain = _made(monkeypatch, builtins.exec)
    cached = _made(monkeypatch, cache.exec)
    assert cache.misses >= 5  # __init__, __repr__, __eq__, __setattr__, __delattr__, __hash__
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        ours, theirs = getattr(cached, name), getattr(plain, name)
        assert inspect.signature(ours) == inspect.signature(theirs), name
        assert ours.__annotations__ == theirs.__annotations__, name
    a, b = plain(host="n1", tags=("x",), secret="s"), cached(host="n1", tags=("x",), secret="t")
    assert repr(b) == repr(a)
    assert repr(b).endswith("Sample(host='n1', port=22, tags=('x',), seen=[])")
    assert hash(b) == hash(a)
    assert b == cached(host="n1", tags=("x",), secret="other")  # secret is not compared
    assert b != cached(host="n2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cached("n1")  # keyword-only
    with pytest.raises(ValueError, match="port"):
        cached(host="n1", port=0)
    assert cached(host="n1").seen is not cached(host="n1").seen  # a fresh list each time
    hits = cache.hits
    _made(monkeypatch, cache.exec)
    assert cache.hits > hits  # the same text is compiled once


# ---------------------------------------------------------------- the file, between processes

_RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fleet.core import codecache
    cache = codecache.install(Path(sys.argv[1]))
    import fleet.core.events
    print(cache.hits, cache.misses)
    print(codecache.refusal() or "-")
    """
)


def _run(path: Path, **env: str) -> tuple[int, int]:
    """A fresh Python that installs the cache at `path` and makes fleet's events: (hits, misses)."""
    out = _ran(path, **env)[0].split()
    return int(out[0]), int(out[1])


def _ran(path: Path, **env: str) -> list[str]:
    """_RUN's lines: "hits misses", then what `--debug` would say of the cache ("-": nothing)."""
    return subprocess.run(
        [sys.executable, "-c", _RUN, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | env,
    ).stdout.splitlines()


@pytest.fixture
def cache_path(trusted_tmp: Path) -> Path:
    """Where nobody but the operator can write (a cache under /tmp is never read: see below)."""
    trusted_tmp.chmod(0o755)
    return trusted_tmp / "pycache" / "dataclass-methods.marshal"


def test_a_second_process_compiles_nothing(cache_path: Path) -> None:
    hits, misses = _run(cache_path)
    assert misses > 20  # fleet.core.events has over a dozen dataclasses
    assert cache_path.read_bytes().startswith(importlib.util.MAGIC_NUMBER)
    assert cache_path.stat().st_mode & 0o777 == 0o644
    assert _run(cache_path) == (hits + misses, 0)
    assert [p.name for p in cache_path.parent.iterdir()] == [cache_path.name]  # no temp file left


def test_nothing_is_written_when_python_writes_no_bytecode(cache_path: Path) -> None:
    _run(cache_path, PYTHONDONTWRITEBYTECODE="1")
    assert not cache_path.parent.exists()


@pytest.mark.parametrize("writable", ["file", "directory"])
def test_a_cache_others_could_have_written_is_never_run(cache_path: Path, writable: str) -> None:
    _, misses = _run(cache_path)
    (cache_path if writable == "file" else cache_path.parent).chmod(0o775)
    assert _run(cache_path)[1] == misses  # every method compiled again: the file was not read


def test_a_cache_under_a_world_writable_directory_is_never_run(tmp_path: Path) -> None:
    path = tmp_path / "dataclass-methods.marshal"  # under /tmp
    _, misses = _run(path)
    assert path.exists()
    assert _run(path)[1] == misses


@pytest.mark.root
def test_a_cache_another_user_owns_is_never_run(cache_path: Path) -> None:
    _, misses = _run(cache_path)
    os.chown(cache_path, 4242, 4242)
    assert _run(cache_path)[1] == misses


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", importlib.util.MAGIC_NUMBER + b"\x00garbage", b"\x00\x00\r\n" + b"x" * 64],
    ids=["empty", "garbage", "magic-then-garbage", "another-python"],
)
def test_a_broken_or_foreign_cache_is_ignored_and_replaced(
    cache_path: Path, content: bytes
) -> None:
    _, misses = _run(cache_path)
    cache_path.write_bytes(content)
    assert _run(cache_path)[1] == misses
    assert _run(cache_path)[1] == 0  # rewritten whole by the run that ignored it


def _group_writable(path: Path) -> None:
    path.chmod(0o664)


def _foreign(path: Path) -> None:
    path.write_bytes(b"\x00\x00\r\n" + b"x" * 64)


def _garbage(path: Path) -> None:
    path.write_bytes(b"garbage")


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (None, None),
        (_group_writable, "not used: writable by its group"),
        (_foreign, "not used: written by another Python version"),
        (_garbage, "not used: broken"),
    ],
    ids=["used", "untrusted", "another-python", "broken"],
)
def test_debug_says_why_a_cache_that_is_there_was_not_used(
    cache_path: Path, spoil: Any, said: str | None
) -> None:
    assert _ran(cache_path)[1] == "-"  # none yet: nothing to say (the first command writes it)
    if spoil is not None:
        spoil(cache_path)
    note = _ran(cache_path)[1]
    if said is None:
        assert note == "-"
    else:
        assert note.startswith(f"dataclass-method cache {cache_path} ")
        assert said in note


def test_the_cli_says_the_refusal_only_under_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from fleet.cli import app

    refused = codecache.CodeCache(tmp_path / "x\x1b]0;pwned\x07.marshal")
    refused.refused = "writable by others"
    monkeypatch.setattr(codecache, "_INSTALLED", refused)
    for env, shown in (("", False), ("1", True)):
        monkeypatch.setenv("FLEET_DEBUG", env)
        with pytest.raises(SystemExit):
            app.main(["--version"])
        err = capsys.readouterr().err
        assert ("not used: writable by others" in err) is shown
        assert not {"\x1b", "\x07"} & set(err)  # the path is data: escaped, never raw


def test_a_fork_leaves_the_cache_to_the_process_that_installed_it(cache_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from pathlib import Path
        from fleet.core import codecache
        codecache.install(Path(sys.argv[1]))
        pid = os.fork()
        if pid == 0:
            from dataclasses import dataclass
            @dataclass(frozen=True)
            class Child:
                x: int
            sys.exit(0)  # runs the exit handlers, as a worker leaving normally would
        os.waitpid(pid, 0)
        """
    )
    subprocess.run([sys.executable, "-c", script, str(cache_path)], check=True)
    assert not cache_path.exists()


def test_the_cli_installs_the_cache_beside_its_own_bytecode() -> None:
    script = "import dataclasses, fleet.cli; print(dataclasses.exec.__self__.path)"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    pyc = Path(importlib.util.cache_from_source(codecache.__file__))
    assert Path(out).parent == pyc.parent
    assert Path(out).name == f"dataclass-methods.{sys.implementation.cache_tag}.marshal"
