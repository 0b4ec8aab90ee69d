"""`python -m tracekit` is the `tracekit` command."""

from .front.cli import main

main()
