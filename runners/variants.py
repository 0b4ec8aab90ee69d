"""The variants by name: each a fixed set of options that `parallelize.py` applies. Apart from
it (and from torch) so that a misspelt `--variants` is refused before torch is imported."""

from __future__ import annotations

VARIANTS = {
    "ddp": {"wrap": "ddp"},
    "fsdp1": {"wrap": "fsdp1", "limit_all_gathers": True},
    "fsdp1-nolimit": {"wrap": "fsdp1", "limit_all_gathers": False},
    "fsdp2": {"wrap": "fsdp2"},
    "fsdp2-root": {"wrap": "fsdp2", "per_block": False},
    "fsdp2-noreshard": {"wrap": "fsdp2", "reshard_after_forward": False},
    "fsdp2-compile": {"wrap": "fsdp2", "compile": True},
    "fsdp2-fp8": {"wrap": "fsdp2", "float8": True},
    # torchao's float8 casts are separate eager kernels unless compiled: this is how it is meant to run.
    "fsdp2-compile-fp8": {"wrap": "fsdp2", "float8": True, "compile": True},
    # The same data parallelism through Lightning (optional extra `lightning`), to see what it costs.
    "lightning-ddp": {"wrap": "ddp", "lightning": True},
    "lightning-fsdp2": {"wrap": "fsdp2", "lightning": True},
}


CONTROL = "{}-control"  # the A/A control: a second, independent copy of the baseline variant (`--control`)


def base_variant(name: str) -> str:
    """The variant whose options `name` takes: itself, or for an A/A control (`CONTROL`) its
    baseline's."""
    base = name.removesuffix(CONTROL.format(""))
    return base if name != base and base in VARIANTS else name


def check_variants(names: list[str]) -> list[str]:
    """`names`, if each is a known variant and none repeats (else ValueError: one line)."""
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"variant(s) named twice: {', '.join(twice)} (use --repeats to run a variant again)")
    if not names:
        raise ValueError("no variants given")
    return names


def mirrored(names: list[str], round_index: int) -> list[str]:
    """The blocks of round `round_index` (from 0): the variants in order then reversed, the
    reverse of that in odd rounds (A B C C B A, C B A A B C)."""
    forward, backward = list(names), list(reversed(names))
    return forward + backward if round_index % 2 == 0 else backward + forward
