"""Counts in sentences: `1 thing`, `2 things`."""

from __future__ import annotations


def counted(n: int | float, thing: str, things: str | None = None) -> str:
    """`1 thing`, `2 things` (`things` where the plural is not `thing` + `s`); a count that is
    not whole (a mean over ranks, 4.5) as it is, with the plural."""
    shown = f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
    return f"{shown} {thing if n == 1 else things or thing + 's'}"
