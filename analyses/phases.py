"""FSDP phases: where in the step each GPU activity was launched.

For each activity, the annotations and ops enclosing its launching call (same thread,
start ≤ call start, end ≥ call end) give:
- `phase`: the runner's own `tracekit#<phase>` annotation whose time range holds the launch
  (any thread: the autograd engine launches backward kernels from its own threads while the
  main thread waits inside `tracekit#backward`), or, where the launch is not in the trace (a
  `cupti` recording), the one its `External id` names — forward, backward, optimizer, checkpoint;
  without one (traces of other harnesses), `optimizer` inside `Optimizer.step#…`/
  `Optimizer.zero_grad#…`; `data loading` inside a DataLoader's op
  (`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`, any name holding
  "DataLoader"; idle time the host spends there is of that phase too, `diff.idle_items`); `backward` inside an autograd engine function, an autograd node
  or backward op (`CudnnConvolutionBackward`, `aten::cudnn_convolution_backward_weight`: any
  name holding "backward"), an FSDP backward hook, or launched from an autograd thread (one
  that records no `ProfilerStep#N` and runs backward ops: PyTorch 1.8-era traces); else
  `forward` — or `unknown` where the trace holds none of these signs, or the launch is not
  in it;
- `fsdp`: the innermost FSDP label (FSDP1's `FullyShardedDataParallel.forward`, which wraps
  the module's whole forward, is not one) — FSDP2 `FSDP::pre_forward (blocks.3)`,
  `fsdp::all_gather_copy_in`, `FSDP::post_backward_reduce (…)`…, FSDP1
  `FullyShardedDataParallel._pre_forward`, `.rate_limiter`, … — with its unit (the FQN in
  parentheses) split off into `unit`;
- `op`: the CPU op that launched it: the one with its External id that encloses its launching
  call on the call's thread (an op that does not enclose the call did not launch it: 2022-era
  traces give device activities their correlation id as External id, which unrelated CPU ops
  may carry); in a `lean` trace, where there is none, the one `naming.named` copied from the
  full step (`derived["lean-names"]`, which gives its FSDP label too where the trace has none:
  a `cupti` recording's); else (no External id that such an op has: MTIA's, some runtimes', a
  collision) the innermost CPU op enclosing its launching call on the call's thread. Device
  work whose launching call is not in the trace has no launching thread, and no op.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.timeline import INNERMOST_FIRST, kept
from tracekit.core.model import ENGINE, Trace
from tracekit.core.steps import RUNNER_PHASE

FSDP_LABEL = r"^(FSDP::|fsdp::|FullyShardedDataParallel\.)"
MODULE_FORWARD = "FullyShardedDataParallel.forward"
BACKWARD = r"(?i)backward|^autograd::engine::evaluate_function"
DATA_LOADING = r"(?i)dataloader"  # `enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__`, …
DATA_PHASE = "data loading"
MARKERS = FSDP_LABEL + r"|^Optimizer\.(step|zero_grad)#|" + BACKWARD + "|" + DATA_LOADING


def launch_context(trace: Trace) -> pl.DataFrame:
    """One row per GPU activity (row index into trace.gpu): phase, fsdp, unit, op. Made once
    per trace (in memory: a diff's items and its idle parts both read it)."""
    return kept(trace, ("launch-context",), lambda: made_launch_context(trace))


def made_launch_context(trace: Trace) -> pl.DataFrame:
    gpu = trace.gpu.with_row_index("row").select("row", "correlation", "ext_id")
    calls = trace.calls.select("correlation", pl.col("tid").alias("c_tid"), pl.col("start").alias("c_start"),
                               pl.col("end").alias("c_end")).unique("correlation")
    launches = gpu.join(calls, on="correlation", how="left")
    marks = trace.ops.filter(pl.col("name").str.contains(MARKERS)).select(
        pl.col("tid").alias("m_tid"), pl.col("start").alias("m_start"), pl.col("end").alias("m_end"),
        pl.col("name").alias("m_name"))
    found = launches.filter(pl.col("c_start").is_not_null()).join_where(  # an interval join; thread after
        marks, pl.col("m_start") <= pl.col("c_start"), pl.col("m_end") >= pl.col("c_end"),
    ).filter(pl.col("m_tid") == pl.col("c_tid"))
    fsdp = (found.filter(pl.col("m_name").str.contains(FSDP_LABEL) & (pl.col("m_name") != MODULE_FORWARD))
            .sort("row", "m_start", descending=[False, True])
            .group_by("row", maintain_order=True).agg(label=pl.col("m_name").first()))
    coarse = found.group_by("row").agg(
        optimizer=pl.col("m_name").str.starts_with("Optimizer.").any(),
        data=pl.col("m_name").str.contains(DATA_LOADING).any(),
        backward=pl.col("m_name").str.contains(BACKWARD).any())
    runner = trace.ops.filter(pl.col("name").str.contains(RUNNER_PHASE)).select(
        r_start="start", r_end="end", runner_phase=pl.col("name").str.extract(RUNNER_PHASE, 1))
    by_runner = (launches.filter(pl.col("c_start").is_not_null())
                 .join_where(runner, pl.col("r_start") <= pl.col("c_start"), pl.col("r_end") >= pl.col("c_end"))
                 .group_by("row").agg(pl.col("runner_phase").first()))
    named_ranges = trace.ops.filter(pl.col("name").str.contains(RUNNER_PHASE) & pl.col("ext_id").is_not_null()).select(
        "ext_id", runner_phase=pl.col("name").str.extract(RUNNER_PHASE, 1))
    uncalled = (launches.filter(pl.col("c_start").is_null()).join(named_ranges, on="ext_id")  # `cupti`: no calls
                .select("row", "runner_phase"))
    by_runner = pl.concat([by_runner, uncalled])
    autograd = autograd_threads(trace.ops)
    signs = runner.height > 0 or marks.height > 0  # the trace says anything of its phases
    # lazy: only the columns selected of the rows kept are copied
    cpu = trace.ops.lazy().with_row_index("o_row").filter(pl.col("cat") == "cpu_op").select(
        "o_row", "ext_id", o_tid="tid", o_start="start", o_end="end", enclosing=pl.col("name")).collect(engine=ENGINE)
    called = launches.filter(pl.col("c_start").is_not_null())
    around_call = ((pl.col("o_tid") == pl.col("c_tid")) & (pl.col("o_start") <= pl.col("c_start"))
                   & (pl.col("o_end") >= pl.col("c_end")))
    launcher = innermost(called.join(cpu, on="ext_id").filter(around_call)).rename({"enclosing": "op"})
    unlinked = called.join(launcher, on="row", how="anti")
    around = unlinked.drop("ext_id").join_where(  # an interval join; thread after
        cpu.drop("ext_id"), pl.col("o_start") <= pl.col("c_start"), pl.col("o_end") >= pl.col("c_end"))
    enclosing = innermost(around.filter(pl.col("o_tid") == pl.col("c_tid")))
    named = trace.derived.get("lean-names", pl.DataFrame(schema={"row": pl.UInt32, "op": pl.String,
                                                                 "label": pl.String}))
    return (launches.select("row", "ext_id", "c_tid").join(fsdp, on="row", how="left").join(coarse, on="row", how="left")
            .join(by_runner, on="row", how="left").join(launcher, on="row", how="left")
            .join(named.rename({"op": "named_op", "label": "named_label"}), on="row", how="left")
            .join(enclosing, on="row", how="left").with_columns(label=pl.coalesce("label", "named_label"))
            .with_columns(op=pl.coalesce("op", "named_op", "enclosing"),
                phase=pl.when(pl.col("runner_phase").is_not_null()).then(pl.col("runner_phase"))
                .when(pl.col("optimizer")).then(pl.lit("optimizer"))
                .when(pl.col("data")).then(pl.lit(DATA_PHASE))
                .when(pl.col("backward") | pl.col("c_tid").is_in(autograd)).then(pl.lit("backward"))
                .when(pl.col("c_tid").is_not_null() & signs).then(pl.lit("forward")).otherwise(pl.lit("unknown")),
                fsdp=pl.col("label").str.replace(r" \(.*\)$", ""),
                unit=pl.col("label").str.extract(r"\((.*)\)$", 1))
            .select("row", "phase", "fsdp", "unit", "op").sort("row"))


def innermost(pairs: pl.DataFrame) -> pl.DataFrame:
    """row, enclosing: of each row's (launch, CPU op) pairs, the innermost op's name."""
    return (pairs.sort("row", *INNERMOST_FIRST, descending=[False, True, False, True])
            .group_by("row", maintain_order=True).agg(pl.col("enclosing").first()))


def autograd_threads(ops: pl.DataFrame) -> list:
    """The threads that record no `ProfilerStep#N` but run backward ops: the autograd
    engine's device threads."""
    per_thread = ops.group_by("tid").agg(
        steps=pl.col("name").str.starts_with("ProfilerStep#").any(), backward=pl.col("name").str.contains(BACKWARD).any())
    return per_thread.filter(~pl.col("steps") & pl.col("backward"))["tid"].to_list()


# FSDP1's and FSDP2's labels (unit stripped) → one phase vocabulary (docs/diff.md, "--by fsdp").
# A label of all-gather work lands in `pre-forward all-gather` during forward, `pre-backward`
# during backward (the unshard before a module's backward, prefetched or not).
POST_BACKWARD = (r"^(FullyShardedDataParallel\._post_backward_hook(_reshard_only)?|FSDP::post_backward_"
                 r"(reduce|rs_wait|accumulate|reshard)|FSDP::root_post_backward_callback|fsdp::chunk_cat)$")
POST_FORWARD = r"^(FullyShardedDataParallel\._post_forward|FSDP::post_forward|FSDP::cast_forward_outputs)$"
ALL_GATHER = (r"^(FullyShardedDataParallel\.(_pre_forward(_prefetch)?|_root_pre_forward|_to_kwargs|rate_limiter|"
              r"_pre_backward_(hook|prefetch)|_post_backward_prefetch)|"
              r"FSDP::(all_gather(_copy_out)?|pre_forward|root_pre_forward|pre_backward|(forward|backward)_prefetch .*|"
              r"cast_forward_inputs|inputs_to_device)|fsdp::(all_gather_copy_in|split_with_sizes_copy))$")


def fsdp_phase(phase: pl.Expr, label: pl.Expr) -> pl.Expr:
    """The FSDP phase of an item from its coarse `phase` and FSDP `label`: pre-forward
    all-gather, forward, pre-backward, backward, post-backward reduce-scatter, optimizer (or
    the coarse phase, e.g. checkpoint); a label not in the table stays itself, unpaired."""
    return (pl.when(label.is_null()).then(phase)
            .when(label.str.contains(POST_BACKWARD)).then(pl.lit("post-backward reduce-scatter"))
            .when(label.str.contains(POST_FORWARD)).then(pl.lit("forward"))
            .when(label.str.contains(ALL_GATHER) & (phase == "forward")).then(pl.lit("pre-forward all-gather"))
            .when(label.str.contains(ALL_GATHER) & (phase == "backward")).then(pl.lit("pre-backward"))
            .otherwise(label))
