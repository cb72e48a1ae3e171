"""`python -m fleet` runs the CLI."""

from fleet.cli import console_main

console_main()
