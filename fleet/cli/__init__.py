"""The `fleet` command line: click declarations, one module per family of verbs, the shared
options, and the per-concern settings built once from them; `main` maps every error to a
documented exit code; `console_main` is the command's entry point. The only package that
imports click.

May import: everything below it (fleet.ops, fleet.engine, ..., fleet.core, fleet.sandbox).
"""

from fleet.core import codecache

codecache.install()  # before the imports below make their dataclasses

from fleet.cli.app import cli, console_main, main  # noqa: E402

__all__ = ["cli", "console_main", "main"]
