"""`python -m fleet` runs the CLI."""

from fleet.cli import main

main()
