"""Reading fleet's own Markdown for the docs tests: files, code blocks, the `fleet ...` commands
they show, links and heading anchors; and the reference generator, loaded from scripts/."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = frozenset({"sh", "shell", "bash", "console"})
OPERATORS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "(", ")"})

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the file line of its first body line, its body."""

    lang: str
    line: int
    body: str


@dataclass(frozen=True)
class Example:
    """A `fleet ...` command shown in a code block, as argv after `fleet`."""

    where: str  # "docs/guides/launch.md:42"
    text: str
    argv: tuple[str, ...]


def load_generator() -> ModuleType:
    """scripts/gen-reference as a module (it has no .py suffix: it is run as a script)."""
    if "gen_reference" in sys.modules:
        return sys.modules["gen_reference"]
    path = ROOT / "scripts" / "gen-reference"
    loader = importlib.machinery.SourceFileLoader("gen_reference", str(path))
    spec = importlib.util.spec_from_loader("gen_reference", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def rel(path: Path) -> str:
    """A path as the checkout names it."""
    return str(path.relative_to(ROOT))


def code_blocks(text: str) -> list[Block]:
    """Every fenced block (``` with an optional language), in order."""
    blocks: list[Block] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fence = _FENCE.match(line)
        if lang is None and fence:
            lang, start, body = fence.group(2), number + 1, []
        elif lang is not None and fence and not fence.group(2):
            blocks.append(Block(lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line.strip())
    return blocks


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out = []
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


def prose(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced blocks, with inline code spans blanked out."""
    return [(n, _CODE_SPAN.sub("``", line)) for n, line in outside_fences(text)]


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """The commands of a shell block: `$ ` lines of a console block, every line of the others,
    with `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    pending = ""
    pending_line = 0
    for offset, raw in enumerate(block.body.splitlines()):
        line = raw
        if not pending:
            if block.lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            pending_line = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((pending_line, pending + line))
        pending = ""
    return out


def fleet_argvs(command_line: str) -> list[tuple[str, ...]]:
    """The argv after `fleet` of every `fleet` command in a shell line (pipes, `&&`, `;`)."""
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    found = []
    segment: list[str] = []
    for token in [*tokens, ";"]:
        if token in OPERATORS:
            env = [w for w in segment if re.fullmatch(r"[A-Z_]+=\S*", w)]
            words = segment[len(env) :] if segment[: len(env)] == env else segment
            if any(w.startswith("_FLEET_COMPLETE=") for w in env):
                words = []  # click's shell-completion mode, not a command line
            if words[:1] == ["sudo"]:
                words = words[1:]
            if words[:1] == ["fleet"]:
                found.append(tuple(words[1:]))
            segment = []
        else:
            segment.append(token)
    return found


def examples(path: Path) -> list[Example]:
    """Every `fleet ...` command in the shell code blocks of one Markdown file."""
    out = []
    for block in code_blocks(path.read_text(encoding="utf-8")):
        if block.lang not in SHELL_LANGS:
            continue
        for line, text in shell_lines(block):
            out += [Example(f"{rel(path)}:{line}", text, a) for a in fleet_argvs(text)]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of every heading (duplicates numbered, as GitHub does); a heading's code
    spans count as their text: a heading `fleet cleanup` in backticks is #fleet-cleanup."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in outside_fences(text):
        match = re.match(r"#{1,6} (.+)$", line)
        if not match:
            continue
        base = slug(match.group(1).replace("`", ""))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link in a file's prose."""
    text = path.read_text(encoding="utf-8")
    return [(n, m.group(2)) for n, line in prose(text) for m in _LINK.finditer(line)]


def is_external(target: str) -> bool:
    """A link that leaves the checkout (web, mail)."""
    return bool(re.match(r"[a-z][a-z0-9+.-]*:", target))


def shlex_join(argv: tuple[str, ...]) -> str:
    """argv as one shell line, for messages."""
    return shlex.join(argv)
