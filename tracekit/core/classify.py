"""What each device activity is: compute, comm (communication), memcpy or memset.

One table of rules (`RULES`), tried in order, the first match deciding; user patterns
(`--comm-kernel REGEX`, `tracekit.load(..., comm_kernels=[...])`) come before it. An activity
that no rule names is `memcpy`/`memset` by its activity kind, else `compute`. A collective's
kind (all_gather, all_to_all, …) comes from the `Collective name` arg Kineto copies onto NCCL
kernels, else from the rule, else from the kernel name (`names.collective_kind`).
docs/trace-model.md shows the table.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from .names import collective_kind


class Rule(NamedTuple):
    library: str
    pattern: str  # regex searched in the activity's name
    category: str  # compute | comm | memcpy | memset
    kind: str | None = None  # collective kind, when the name does not say it


RULES = (
    Rule("ROCm copy kernels (rocclr blit)", r"^(__amd_rocclr_copy|MEMORY_COPY_)", "memcpy"),
    Rule("ROCm fill kernels (rocclr blit)", r"^__amd_rocclr_fill", "memset"),
    Rule("MTIA DMA transfers", r"^dma", "memcpy"),
    Rule("NCCL", r"nccl(Dev)?Kernel|ncclSymk", "comm"),
    Rule("RCCL", r"(?i)rccl", "comm"),
    Rule("DeepEP (expert-parallel all-to-all; `dpsk::ep::` in DeepSeek's published profiles)",
         r"deep_ep::|::ep::(internode|intranode)::|^(void )?(cached_)?(notify_)?(dispatch|combine)\b", "comm",
         "all_to_all"),
    Rule("NVSHMEM", r"(?i)nvshmem", "comm"),
    Rule("custom all-reduce (vLLM, SGLang, TensorRT-LLM)",
         r"cross_device_reduce|custom_all_reduce|(?i:quick_?reduce)|allreduce_fusion|(?i:lamport)", "comm",
         "all_reduce"),
    Rule("PyTorch symmetric memory", r"(one_shot|two_shot|multimem)_all_reduce|multimem_all_gather", "comm"),
)

ACTIVITY_KINDS = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def classified(gpu: pl.DataFrame, comm_kernels: tuple[str, ...] = ()) -> pl.DataFrame:
    """`gpu` with `category` and `coll_kind` (collectives only). Decided once per distinct
    (kind, name), then joined back."""
    rules = [Rule("user", p, "comm") for p in comm_kernels] + list(RULES)
    names = gpu.select("kind", "name").unique()
    name = pl.col("name")
    category, rule_kind = pl.lit(None, pl.String), pl.lit(None, pl.String)
    for rule in reversed(rules):  # built inside out: the first rule ends outermost
        hit = name.str.contains(rule.pattern)
        category = pl.when(hit).then(pl.lit(rule.category)).otherwise(category)
        rule_kind = pl.when(hit).then(pl.lit(rule.kind, pl.String)).otherwise(rule_kind)
    by_kind = pl.col("kind").replace_strict(ACTIVITY_KINDS, default="compute")
    names = names.with_columns(category=pl.coalesce(category, by_kind), rule_kind=rule_kind)
    gpu = gpu.join(names, on=["kind", "name"], how="left", maintain_order="left")
    is_comm = pl.col("category") == "comm"
    kind = pl.coalesce(collective_kind(pl.col("collective")), pl.col("rule_kind"), collective_kind(name))
    return gpu.with_columns(coll_kind=pl.when(is_comm).then(kind.fill_null("other"))).drop("rule_kind")
