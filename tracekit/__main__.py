"""`python -m tracekit` is the `tracekit` command."""

from .cli import main

main()
