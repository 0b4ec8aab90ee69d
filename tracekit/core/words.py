"""Counts and lists in sentences: `1 thing`, `2 things`; `rank 1`, `ranks 0, 1`."""

from __future__ import annotations


def counted(n: int | float, thing: str, things: str | None = None) -> str:
    """`1 thing`, `2 things` (`things` where the plural is not `thing` + `s`); a count that is
    not whole (a mean over ranks, 4.5) as it is, with the plural."""
    shown = f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
    return f"{shown} {thing if n == 1 else things or thing + 's'}"


def listed(thing: str, items) -> str:
    """`thing a` for one item, `things a, b` for several (in the order given)."""
    items = list(items)
    return f"{thing if len(items) == 1 else thing + 's'} {', '.join(map(str, items))}"
