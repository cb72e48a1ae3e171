"""Every `fleet ...` command shown in a shell code block of README.md or docs/ parses: the CLI
resolves it to a command and accepts its options and arguments. Nothing is run."""

from __future__ import annotations

import click
import pytest
from doctext import Example, doc_files, examples, load_generator, shlex_join

ROOT_GROUP = load_generator().root_group()
EXAMPLES = [e for path in doc_files() for e in examples(path)]

# Placeholders the docs use for "your value here", and what stands in for them.
PLACEHOLDERS = {"...": None}


def resolve(argv: tuple[str, ...]) -> click.Context:
    """Parse argv as `fleet` would, down to the leaf command, without invoking anything."""
    args = [a for a in argv if a not in PLACEHOLDERS]
    ctx = ROOT_GROUP.make_context("fleet", args)
    command: click.Command = ROOT_GROUP
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None
        assert sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return ctx


def test_the_docs_show_many_examples() -> None:
    assert len(EXAMPLES) >= 35
    assert {e.where.split(":")[0] for e in EXAMPLES} >= {"README.md"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.where)
def test_every_example_parses(example: Example) -> None:
    try:
        ctx = resolve(example.argv)
    except click.exceptions.Exit:  # --help, --version
        return
    except click.ClickException as exc:
        pytest.fail(f"{example.where}: fleet {shlex_join(example.argv)}: {exc.format_message()}")
    assert ctx.command_path.startswith("fleet")


@pytest.mark.parametrize(
    "argv",
    [("exec", "-w", "gpu[01-16]", "nvidia-smi", "-L"), ("cleanup", "--bogus"), ("nope",)],
)
def test_a_bad_example_is_caught(argv: tuple[str, ...]) -> None:
    with pytest.raises(click.ClickException):
        resolve(argv)
