"""`python -m tracekit` is the `tracekit` command."""

from .front.start import main

main()
