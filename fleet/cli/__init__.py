"""The `fleet` command line: click declarations, one module per family of verbs, the shared
options, and the per-concern settings built once from them; `main` maps every error to a
documented exit code. The only package that imports click.

May import: everything below it (fleet.ops, fleet.engine, ..., fleet.core, fleet.sandbox).
"""

from fleet.cli.app import cli, main

__all__ = ["cli", "main"]
