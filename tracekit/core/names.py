"""Names: which GPU activities are collectives, their kind, and kernel identity across traces.

Everything here is a polars expression, applied column-wise.
"""

from __future__ import annotations

import polars as pl

# NCCL (ncclDevKernel_*, older ncclKernel_*, symmetric-memory ncclSymk*) and RCCL kernels.
COLLECTIVE_KERNEL = r"nccl(Dev)?Kernel|ncclSymk|rccl"

# Alternatives in priority order: the regex takes the leftmost match, and at one position
# the first alternative, so "reducescatter" wins over "reduce" and "allgather" over "gather".
_KINDS = {
    "allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce",
    "alltoall": "all_to_all", "sendrecv": "send_recv", "send": "send_recv", "recv": "send_recv",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}
_KIND_PATTERN = "(" + "|".join(_KINDS) + ")"


def collective_kind(text: pl.Expr) -> pl.Expr:
    """snake_case collective kind from a `Collective name` arg or an NCCL kernel name."""
    squashed = text.str.to_lowercase().str.replace_all("_", "", literal=True)
    return squashed.str.extract(_KIND_PATTERN, 1).replace_strict(_KINDS, default=None, return_dtype=pl.String)


def gpu_category(kind: pl.Expr, name: pl.Expr) -> pl.Expr:
    """`comm` for collective kernels, `memcpy`/`memset` by activity kind, else `compute`."""
    return (
        pl.when(kind == "gpu_memcpy").then(pl.lit("memcpy"))
        .when(kind == "gpu_memset").then(pl.lit("memset"))
        .when(name.str.contains(COLLECTIVE_KERNEL)).then(pl.lit("comm"))
        .otherwise(pl.lit("compute"))
    )


# Generic launchers whose meaning is in the functor they run: kept as `family<functor>`.
_WRAPPERS = ["elementwise_kernel", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel",
             "reduce_kernel", "multi_tensor_apply_kernel", "index_elementwise_kernel"]
_FUNCTOR = r"([A-Za-z0-9_]+(?:_kernel_cuda|Functor|_functor))"


def kernel_identity(name: pl.Expr) -> pl.Expr:
    """A kernel's name with launch-specific detail removed, so that one kernel matches itself
    across variants: no `void `, namespaces `at::native::`/anonymous, template and argument
    lists; generic launchers keep their functor (`vectorized_elementwise_kernel<
    bfloat16_copy_kernel_cuda>`, `multi_tensor_apply_kernel<CopyFunctor>`); generated
    triton/inductor kernels lose their trailing numbers; `nvjet_*` GEMM tile configurations
    fold to `nvjet gemm`, cuDNN's generated attention kernels to `cudnn sdpa fwd`/`bwd`; NCCL
    kernels keep their collective (`ncclDevKernel_AllGather`)."""
    clean = (name.str.replace(r"^void ", "").str.replace_all(r"\(anonymous namespace\)::", "")
             .str.replace_all(r"\bat::native::", "").str.replace_all(r"\bat_cuda_detail::cub::detail::", "cub::"))
    family = clean.str.extract(r"^([^<(]+)", 1).str.strip_chars()
    functor = clean.str.extract(_FUNCTOR, 1)
    out = (
        pl.when(family.is_in(_WRAPPERS) & functor.is_not_null()).then(family + "<" + functor + ">")
        .when(family.str.contains(r"sdpa.*fprop")).then(pl.lit("cudnn sdpa fwd"))
        .when(family.str.contains(r"sdpa.*bprop")).then(pl.lit("cudnn sdpa bwd"))
        .when(family.str.starts_with("nvjet_")).then(pl.lit("nvjet gemm"))
        .when(family.str.contains(r"^ncclDevKernel_[A-Za-z]+_")).then(family.str.extract(r"^(ncclDevKernel_[A-Za-z]+)", 1))
        .otherwise(family.str.replace(r"^(triton_[a-z]+_[A-Za-z0-9_]*?)(_\d+)+$", "$1"))
    )
    return pl.when(out.is_null() | (out == "")).then(name).otherwise(out)

