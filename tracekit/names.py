"""Names: which GPU activities are collectives, their kind, and kernel identity across traces.

Everything here is a polars expression, applied column-wise.
"""

from __future__ import annotations

import polars as pl

# NCCL (ncclDevKernel_*, older ncclKernel_*, symmetric-memory ncclSymk*) and RCCL kernels.
COLLECTIVE_KERNEL = r"nccl(Dev)?Kernel|ncclSymk|rccl"

# Ordered: the first pattern found in the squashed (lower case, no '_') name wins.
_KINDS = [
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("barrier", "barrier"),
]

COLLECTIVE_KINDS = [kind for _, kind in _KINDS if kind != "send_recv"] + ["send_recv"]


def collective_kind(text: pl.Expr) -> pl.Expr:
    """snake_case collective kind from a `Collective name` arg or an NCCL kernel name."""
    squashed = text.str.to_lowercase().str.replace_all("_", "", literal=True)
    expr = pl.lit(None, dtype=pl.String)
    for pattern, kind in reversed(_KINDS):
        expr = pl.when(squashed.str.contains(pattern, literal=True)).then(pl.lit(kind)).otherwise(expr)
    return expr


def gpu_category(kind: pl.Expr, name: pl.Expr) -> pl.Expr:
    """`comm` for collective kernels, `memcpy`/`memset` by activity kind, else `compute`."""
    return (
        pl.when(kind == "gpu_memcpy").then(pl.lit("memcpy"))
        .when(kind == "gpu_memset").then(pl.lit("memset"))
        .when(name.str.contains(COLLECTIVE_KERNEL)).then(pl.lit("comm"))
        .otherwise(pl.lit("compute"))
    )


def kernel_identity(name: pl.Expr) -> pl.Expr:
    """A kernel's name with launch-specific detail removed, so that one kernel matches itself
    across variants: no `void `, template arguments `<…>`, argument lists `(…)`, lambda and
    anonymous-namespace noise, trailing numbers of generated (triton/inductor) kernels, and
    `nvjet_*` GEMM tile configurations folded to `nvjet gemm`."""
    out = name.str.replace(r"^void ", "")
    # Remove nested <...> and (...) by repeated innermost-first stripping.
    for _ in range(6):
        out = out.str.replace_all(r"<[^<>]*>", "").str.replace_all(r"\([^()]*\)", "")
    out = (
        out.str.replace_all(r"\{lambda[^}]*\}(#\d+)?", "")
        .str.replace_all(r"\(anonymous namespace\)::", "")
        .str.replace_all(r"::+$", "")
        .str.replace(r"^(triton_[a-z]+_[A-Za-z0-9_]*?)(_\d+)+$", "$1")
        .str.replace(r"^nvjet_.*", "nvjet gemm")
        .str.replace(r"^(ncclDevKernel_[A-Za-z]+)_.*$", "$1")
        .str.strip_chars()
    )
    return pl.when(out == "").then(name).otherwise(out)
