"""`tracekit comms`: collectives per rank, step, device and process group.

- bytes: the collective's message size in the nccl-tests convention: max(In, Out msg nelems)
  × dtype size — the gathered output of an all-gather, the input of a reduce-scatter, the
  buffer of an all-reduce. From the args Kineto copies onto the NCCL kernel, else from the
  `record_param_comms` op with the same External id, else (older traces, whose kernels and
  `record_param_comms` carry no sizes) from the `nccl:<collective>` annotation that encloses
  the kernel's launching call on its thread, of the kernel's kind (or `nccl:all_to_all` for a
  send/recv kernel: NCCL runs an all-to-all as grouped sends and receives): its largest
  `Input Dims` tensor × the size of its first known `Input type`. Null (unknown, never 0)
  where none of these says it.
- kernel_ns: the kernel's duration. algbw = bytes / kernel_ns (GB/s = bytes/ns), null for a
  kernel of zero duration; busbw = algbw × `busbw_factor`: (n−1)/n for all-gather,
  reduce-scatter, all-to-all, gather and scatter, 2(n−1)/n for all-reduce, 1 otherwise
  (n = group size), as nccl-tests computes it.
- exposed_ns: the kernel's share of the partition's comm parts (`timeline.py`): the time it
  ran with no compute of its step on its device — the same figure as `diff`'s comm items.
- On CPU-only traces (gloo) the collectives are the CPU ops (`record_param_comms`, else the
  `c10d::` ops), their duration standing in for kernel time; bytes only where the op has the
  element counts.
- Across the ranks of one run, the i-th collective of a process group (launch order) on each
  of the group's ranks is the same collective. Kernels whose launch is not in the trace (the
  tail of a collective launched before profiling began) are left out of the matching (`seq`
  null): one rank's trace may hold such a tail and another's not. `tracekit lint` warns when
  the ranks of a group hold different numbers of (launched) collectives
  (`collective_count_mismatch`). The group's ranks come from the trace's
  process-group table (`distributedInfo.pg_config`) or the kernel's `Process Group Ranks`;
  so sub-groups (TP, HSDP, pipeline pairs) match even when the run holds only some of the
  world's ranks. When every rank of the group is in the run: transfer_ns = the least kernel
  time over them, wait_ns = kernel_ns − transfer_ns (waiting for peers); `mismatched` counts
  collectives whose ranks disagree on kind, dtype or bytes. Send/recv match only in groups of
  two. Otherwise transfer and wait are null.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.counts import known_sum
from tracekit.analyses.summary import collective_ops
from tracekit.analyses.timeline import INNERMOST_FIRST, kept, timeline
from tracekit.core.loading import COMM_ARGS
from tracekit.core.model import ENGINE, Trace
from tracekit.core.names import collective_kind

DTYPE_BYTES = {
    "Float": 4, "float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}
# `Input type` names (c10's) → the dtype names Kineto writes on NCCL kernels
INPUT_TYPES = {
    "float": "Float", "double": "Double", "c10::Half": "Half", "c10::BFloat16": "BFloat16", "int": "Int",
    "long": "Long", "long int": "Long", "short": "Short", "short int": "Short", "signed char": "Char",
    "unsigned char": "Byte", "bool": "Bool", "c10::Float8_e4m3fn": "Float8_e4m3fn", "c10::Float8_e5m2": "Float8_e5m2",
    "c10::complex<float>": "ComplexFloat", "c10::complex<double>": "ComplexDouble",
}
RANKS = pl.List(pl.Int64)


def group_ranks(trace: Trace) -> pl.DataFrame:
    """pg, ranks: the process-group table of the trace (`distributedInfo.pg_config`)."""
    rows = [{"pg": str(pg.get("pg_name")), "ranks": str(pg.get("ranks"))} for pg in trace.meta.get("pg_config", [])]
    table = pl.DataFrame(rows, schema={"pg": pl.String, "ranks": pl.String})
    return table.select("pg", pl.col("ranks").str.extract_all(r"\d+").cast(RANKS).alias("pg_ranks_table"))


def collective_kernels(trace: Trace) -> pl.DataFrame:
    """One row per collective kernel: row (into trace.gpu), step, device, pg, pg_ranks,
    coll_kind, dtype, group_size, bytes, stream, start, end, kernel_ns, exposed_ns, algbw_gbps,
    busbw_gbps, seq (launch order within the pg; null for a kernel whose launch is not in the
    trace). On a CPU-only trace (gloo) the collective's CPU op stands in for the kernel (row,
    device and stream null, exposed_ns null). Made once per trace (in memory:
    a diff's material and the run's collective arrivals both read it)."""
    return kept(trace, ("collective-kernels",), lambda: made_collective_kernels(trace))


def made_collective_kernels(trace: Trace) -> pl.DataFrame:
    if trace.has_gpu:
        shares = timeline(trace).shares.select("row", exposed_ns="share_ns")
        kernels = trace.gpu.with_row_index("row").filter(pl.col("category") == "comm").join(
            shares, on="row", how="left").with_columns(
            launched=pl.col("correlation").is_in(trace.calls["correlation"].drop_nulls().implode()))
        ops = trace.ops.filter(pl.col("name") == "record_param_comms").select(
            "ext_id", *[pl.col(c).alias(f"{c}_op") for c in COMM_ARGS]).unique("ext_id")
        kernels = kernels.join(ops, on="ext_id", how="left").with_columns(
            pl.coalesce(c, f"{c}_op").alias(c) for c in COMM_ARGS).with_columns(pl.col("device").fill_null(0))
        kernels = kernels.join(annotated_sizes(trace, kernels), on="row", how="left")
    else:
        kernels = collective_ops(trace).with_columns(
            stream=pl.lit(None, pl.Int64), device=pl.lit(None, pl.Int64), correlation=pl.col("start"),
            exposed_ns=pl.lit(None, pl.Int64), launched=pl.lit(True), row=pl.lit(None, pl.UInt32),
            a_dtype=pl.lit(None, pl.String), a_nelems=pl.lit(None, pl.Int64))
    n = pl.col("group_size").cast(pl.Float64)
    factor = (pl.when(pl.col("coll_kind").is_in(["all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]))
              .then((n - 1) / n).when(pl.col("coll_kind") == "all_reduce").then(2 * (n - 1) / n).otherwise(1.0))
    own = message_bytes(pl.max_horizontal("in_nelems", "out_nelems"), pl.col("dtype"))
    out = kernels.select(
        "row", "step", "device", pl.col("pg_name").fill_null("?").alias("pg"),
        pl.col("pg_ranks").str.extract_all(r"\d+").cast(RANKS).alias("pg_ranks"),
        "coll_kind", pl.when(own.is_null()).then(pl.coalesce("dtype", "a_dtype")).otherwise("dtype").alias("dtype"),
        "group_size", pl.coalesce(own, message_bytes(pl.col("a_nelems"), pl.col("a_dtype"))).alias("bytes"),
        "stream", "start", "end", "correlation", (pl.col("end") - pl.col("start")).alias("kernel_ns"), "exposed_ns",
        "launched",
    ).with_columns(algbw_gbps=pl.when(pl.col("kernel_ns") > 0).then(pl.col("bytes") / pl.col("kernel_ns")),
                   busbw_factor=factor)
    out = (out.join(group_ranks(trace), on="pg", how="left")
           .with_columns(pg_ranks=pl.coalesce("pg_ranks", "pg_ranks_table")).drop("pg_ranks_table")
           .with_columns(busbw_gbps=pl.col("algbw_gbps") * pl.col("busbw_factor")))
    seq = pl.when(pl.col("launched")).then(pl.col("launched").cast(pl.Int64).cum_sum().over("pg") - 1)
    return out.sort("correlation", "start").with_columns(seq=seq).drop("correlation", "launched")


def message_bytes(nelems: pl.Expr, dtype: pl.Expr) -> pl.Expr:
    """Elements × the dtype's size in bytes; null where either is unknown."""
    return nelems * dtype.replace_strict(DTYPE_BYTES, default=None)


def annotated_sizes(trace: Trace, kernels: pl.DataFrame) -> pl.DataFrame:
    """row, a_dtype, a_nelems: for each collective kernel (`kernels`: row, coll_kind,
    correlation) whose launching call an `nccl:<collective>` annotation of its kind encloses on
    the call's thread (the innermost), that annotation's first known `Input type` and its
    largest `Input Dims` tensor's element count."""
    annotations = trace.ops.lazy().filter(pl.col("name").str.starts_with("nccl:")).with_row_index("o_row").select(
        "o_row", o_tid="tid", o_start="start", o_end="end",
        o_kind=collective_kind(pl.col("name").str.strip_prefix("nccl:")),
        a_dtype=pl.col("input_types").str.extract_all(r'"([^"]*)"').list.eval(
            pl.element().str.strip_chars('"').replace_strict(INPUT_TYPES, default=None)).list.drop_nulls().list.first(),
        a_nelems=pl.col("input_dims").str.extract_all(r"\[[\d, ]+\]").list.eval(  # each tensor's shape
            pl.element().str.strip_chars("[]").str.split(",").list.eval(pl.element().str.strip_chars().cast(pl.Int64)
                                                                         .product()).list.first()).list.max()
    ).collect(engine=ENGINE)
    calls = trace.calls.select("correlation", c_tid="tid", c_start="start", c_end="end").unique("correlation")
    launched = kernels.select("row", "coll_kind", "correlation").join(calls, on="correlation")
    fits = ((pl.col("o_kind") == pl.col("coll_kind"))
            | ((pl.col("coll_kind") == "send_recv") & (pl.col("o_kind") == "all_to_all")))
    return (launched.join_where(annotations, pl.col("o_start") <= pl.col("c_start"), pl.col("o_end") >= pl.col("c_end"))
            .filter((pl.col("o_tid") == pl.col("c_tid")) & fits)
            .sort("row", *INNERMOST_FIRST, descending=[False, True, False, True])
            .group_by("row", maintain_order=True).agg(pl.col("a_dtype", "a_nelems").first()))


def counts_per_group(kernels: pl.DataFrame) -> pl.DataFrame:
    """pg, n: how many collectives of each process group the trace holds launched."""
    return kernels.filter(pl.col("seq").is_not_null()).group_by("pg").agg(n=pl.len().cast(pl.Int64))


def matched_across_ranks(per_rank: list[pl.DataFrame], ranks: list[int]) -> list[pl.DataFrame]:
    """Each rank's collective kernels with transfer_ns, wait_ns and mismatched, matching
    (pg, seq) over the ranks of the pg that are in the run (`ranks`, in order)."""
    together = pl.concat([f.filter(pl.col("seq").is_not_null())
                          .select("pg", "seq", "pg_ranks", "coll_kind", "dtype", "bytes", "kernel_ns")
                          .with_columns(rank=pl.lit(r, pl.Int64)) for r, f in zip(ranks, per_rank)])
    expected = pl.coalesce(pl.col("pg_ranks").first().list.len(), pl.lit(len(ranks)))
    matched = together.group_by("pg", "seq").agg(
        transfer=pl.col("kernel_ns").min(), present=pl.len(), expected=expected.cast(pl.UInt32),
        p2p=(pl.col("coll_kind") == "send_recv").any(),
        disagree=(pl.col("coll_kind").n_unique() > 1) | (pl.col("dtype").n_unique() > 1) | (pl.col("bytes").n_unique() > 1))
    complete = (pl.col("present") == pl.col("expected")) & (~pl.col("p2p") | (pl.col("expected") == 2))
    return [f.join(matched, on=["pg", "seq"], how="left", maintain_order="left").with_columns(
                transfer_ns=pl.when(complete).then(pl.col("transfer")),
                mismatched=pl.when(complete).then(pl.col("disagree")))
            .with_columns(wait_ns=pl.col("kernel_ns") - pl.col("transfer_ns"))
            .drop("transfer", "present", "expected", "p2p", "disagree")
            for f in per_rank]


def census(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per step: `collectives` = [{pg, kind, dtype, device, stream, count, bytes,
    kernel_ns, exposed_ns, algbw_gbps, busbw_gbps, transfer_ns, wait_ns, mismatched}]
    (bandwidths from summed bytes and time; bytes null where one collective's is unknown)."""
    for column, dtype in (("transfer_ns", pl.Int64), ("wait_ns", pl.Int64), ("mismatched", pl.Boolean)):
        if column not in kernels.columns:
            kernels = kernels.with_columns(pl.lit(None, dtype).alias(column))
    rows = (kernels.filter(pl.col("step").is_not_null())
            .group_by("step", "pg", pl.col("coll_kind").alias("kind"), "dtype", "device", "stream")
            .agg(count=pl.len().cast(pl.Int64), bytes=pl.when(pl.col("bytes").null_count() == 0).then(pl.col("bytes").sum()),
                 kernel_ns=pl.col("kernel_ns").sum(),
                 exposed_ns=known_sum("exposed_ns"),
                 busbw_factor=pl.col("busbw_factor").first(),
                 transfer_ns=known_sum("transfer_ns"), wait_ns=known_sum("wait_ns"),
                 mismatched=pl.when(pl.col("mismatched").count() > 0).then(pl.col("mismatched").sum().cast(pl.Int64)))
            .with_columns(algbw_gbps=pl.when(pl.col("kernel_ns") > 0).then(pl.col("bytes") / pl.col("kernel_ns")).round(3))
            .with_columns(busbw_gbps=(pl.col("algbw_gbps") * pl.col("busbw_factor")).round(3))
            .drop("busbw_factor")
            .sort("step", "pg", "kind", "dtype", "device", "stream"))  # one kind's two dtypes by name, not by chance
    per_step = rows.group_by("step", maintain_order=True).agg(collectives=pl.struct(
        "pg", "kind", "dtype", "device", "stream", "count", "bytes", "kernel_ns", "exposed_ns", "algbw_gbps",
        "busbw_gbps", "transfer_ns", "wait_ns", "mismatched"))
    return steps.select("step").join(per_step, on="step", how="left").sort("step")


def material(trace: Trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What `comms` needs of one trace (small, for a worker to send back): its collective
    kernels and its steps."""
    return collective_kernels(trace), trace.steps.select("step")


def census_of_run(materials: list[tuple[pl.DataFrame, pl.DataFrame]], ranks: list[int]) -> list[pl.DataFrame]:
    """Per trace of one run (its `material`, its rank), the per-step census; the run's ranks
    are matched."""
    kernels = [k for k, _ in materials]
    if len(materials) > 1:
        kernels = matched_across_ranks(kernels, ranks)
    return [census(k, steps) for k, (_, steps) in zip(kernels, materials)]


def comms(traces: list[Trace]) -> list[pl.DataFrame]:
    """Per trace of one run, the per-step census; the run's ranks are matched."""
    return census_of_run([material(t) for t in traces], [t.rank for t in traces])


def peer_waits(traces: list[Trace]) -> list[pl.DataFrame]:
    """Per trace of one run, each collective kernel's interval (device, stream, start, end, ns)
    and `wait_end`: start + wait_ns, the time it waited for its peers before transferring
    (`matched_across_ranks`; null where its peers are not all in the run)."""
    kernels = [collective_kernels(t) for t in traces]
    if len(kernels) > 1:
        kernels = matched_across_ranks(kernels, [t.rank for t in traces])
    else:
        kernels = [k.with_columns(wait_ns=pl.lit(None, pl.Int64)) for k in kernels]
    return [k.select("step", "device", "stream", "start", "end", wait_end=pl.col("start") + pl.col("wait_ns"))
            for k in kernels]
