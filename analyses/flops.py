"""FLOPs and bytes of each CPU op and device kernel, from the shapes a `full` recording holds.

The formulas (docs/metrics.md "FLOPs and bytes"; TraceLens' perf model, AMD-AGI/TraceLens
`TraceLens/PerfModel/perf_model.py`, classes GEMM and SDPA, gives the same ones):
- **matmul family**, A [.., M, K] · B [.., K, N], batch b: FLOPs = 2·b·M·N·K (+ b·M·N for a
  bias: `addmm`, `baddbmm`, `linear` with bias); bytes = the inputs read + the output
  written (b·M·N of the first input's dtype; `_scaled_mm`: of its `out_dtype`).
- **attention** (`_scaled_dot_product_{flash,efficient,cudnn}_attention`), Q [B, Hq, Nq, d],
  K [B, Hkv, Nkv, d], V [B, Hkv, Nkv, dv]: forward 2·B·Hq·Nq·Nkv·(d + dv); backward
  2·B·Hq·Nq·Nkv·(2·d + 2·dv + d) + the GQA reduction B·Nkv·(d + dv)·(Hq/Hkv − 1) (the scores
  recomputed, then dV, dP, dQ, dK); causal halves both (Nq = Nkv only, else unknown);
  softmax left out. Bytes: Q, K, V read and O written (forward); Q, K, V, dO read and dQ, dK,
  dV written (backward).
- **convolution** (`aten::convolution`, `aten::convolution_backward`), N-d: 2·B·Cout·|out|·
  (Cin/groups)·|kernel| (+ B·Cout·|out| with a bias); backward twice that (input and weight
  gradients). |out| from the input, stride, padding and dilation (forward) or the output
  gradient's shape (backward).
- **elementwise** ops: one FLOP per output element (the broadcast of the tensor inputs);
  **normalisation** ops (`native_layer_norm`, `native_layer_norm_backward`, `_fused_rms_norm`):
  bytes only (FLOPs unknown). Bytes: every tensor input read, the output written.
An op whose shapes or needed scalars are not recorded gets null FLOPs and bytes: unknown,
never a guess. A kernel takes the FLOPs of the innermost CPU op enclosing its launch — past
ops that only carry out their caller's work (`_cudnn_attention_forward`, `cudnn_convolution`,
…) — when that op has a formula, shared among its kernels in proportion to their durations;
a kernel of an op without one (an `amax` inside a float8 `mm`) has none.
"""

from __future__ import annotations

import json
import re
from math import prod

import polars as pl

from tracekit.analyses.peaks import PEAKS, device_key
from tracekit.core.model import Trace

DTYPES = {  # Kineto's `Input type` → (compute dtype, bytes per element)
    "c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2), "float": ("fp32", 4), "double": ("fp64", 8),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "signed char": ("int8", 1), "unsigned char": ("int8", 1),
    "int": ("int32", 4), "long int": ("int64", 8), "bool": ("bool", 1),
}
SCALAR_TYPES = {"5": 2, "6": 4, "7": 8, "15": 2}  # `out_dtype` as c10::ScalarType → bytes (Half, Float, Double, BFloat16)
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm")
# op → (index of Q, K, V in its inputs, index of is_causal, backward)
ATTENTION = {
    "aten::_scaled_dot_product_flash_attention": (0, 1, 2, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, 2, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, 2, 6, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, 3, 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, 3, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, 3, 14, True),
}
CONVOLUTION = ("aten::convolution", "aten::convolution_backward")
ELEMENTWISE = tuple(f"aten::{n}{s}" for n in (
    "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "pow", "relu", "gelu", "silu", "sigmoid",
    "tanh", "gelu_backward", "silu_backward", "threshold_backward", "sigmoid_backward", "tanh_backward",
    "where", "clamp", "clamp_min", "lerp", "addcmul", "addcdiv") for s in ("", "_"))
NORMS = ("aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::_fused_rms_norm",
         "aten::_fused_rms_norm_backward")
FORMULA_OPS = (*MATMUL, *ATTENTION, *CONVOLUTION, *ELEMENTWISE, *NORMS)
# a few FLOPs per byte by construction, so never near a FLOP/s peak; nor can their bandwidth be
# judged against the HBM's: an operand still in L2 from the kernel before is read faster (up to
# 225 % of the A100's HBM bandwidth on HTA's trace_diff trace, 143 % on the H200 ddp traces)
MEMORY_BOUND = ("elementwise", "norm")
# a float32 op whose kernel runs on TF32 tensor cores: CUTLASS `tensorop_s1688`/`s16816`, cuBLAS and
# cuDNN `…tf32…` (an `xmma` kernel without `tf32` in its name may be plain FP32 FMA: stays fp32)
TF32_KERNEL = r"(?i)tf32|s1688|s16816"
# ops that only carry out their caller's work: a kernel they launch counts for the caller
IMPLEMENTATION = tuple(f"aten::_{kind}_attention_{way}" for kind in ("cudnn", "flash", "efficient")
                       for way in ("forward", "backward")) + (
    "aten::_convolution", "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::miopen_convolution",
    "aten::_convolution_backward", "aten::cudnn_convolution_backward")
WORK = {"op_row": pl.UInt32, "family": pl.String, "dtype": pl.String, "flops": pl.Int64, "bytes": pl.Int64}


def size(dtype: str) -> int | None:
    return DTYPES.get(dtype, (None, None))[1]


def nbytes(dims: list, dtype: str) -> int | None:
    s = size(dtype)
    return None if s is None or not isinstance(dims, list) else prod(dims) * s


def total(parts) -> int | None:
    """Sum, or None when any part is unknown."""
    parts = list(parts)
    return None if any(p is None for p in parts) else sum(parts)


def matmul(name: str, dims: list, types: list, concrete: list) -> tuple | None:
    """(flops, bytes, dtype) of a matmul-family op; None when its shapes do not fit."""
    bias = None
    if name in ("aten::addmm", "aten::baddbmm"):
        bias, (a, ta), (b, tb) = (dims[0], types[0]), (dims[1], types[1]), (dims[2], types[2])
    elif name == "aten::linear":
        (a, ta), (w, tb) = (dims[0], types[0]), (dims[1], types[1])
        if len(w) != 2 or not a:
            return None
        b = [w[1], w[0]]  # weight [N, K] used as [K, N]
        if len(dims) > 2 and dims[2]:
            bias = (dims[2], types[2])
    else:
        (a, ta), (b, tb) = (dims[0], types[0]), (dims[1], types[1])
    if len(a) < 1 or len(b) < 2 and name != "aten::matmul":
        return None
    if name == "aten::linear" or (name == "aten::matmul" and len(b) == 2):
        m, k, n, batch = prod(a[:-1]), a[-1], b[-1], 1
        if b[0] != k:
            return None
    elif len(a) >= 2 and len(b) >= 2:
        m, k, n = a[-2], a[-1], b[-1]
        batch = max(prod(a[:-2]), prod(b[:-2]))
        if b[-2] != k:
            return None
    else:
        return None
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)
    out_size = size(ta)
    if name == "aten::_scaled_mm":
        out = concrete[6] if len(concrete) > 6 else ""
        out_size = SCALAR_TYPES.get(str(out).strip(), None)
    read = total([nbytes(a, ta), nbytes(b if name != "aten::linear" else dims[1], tb),
                  nbytes(bias[0], bias[1]) if bias else 0])
    written = None if out_size is None else batch * m * n * out_size
    return flops, total([read, written]), DTYPES.get(ta, ("?",))[0]


def attention(name: str, dims: list, types: list, concrete: list) -> tuple | None:
    iq, ik, iv, icausal, backward = ATTENTION[name]
    q, k, v = dims[iq], dims[ik], dims[iv]
    if not all(isinstance(x, list) and len(x) == 4 for x in (q, k, v)) or len(concrete) <= icausal:
        return None
    causal = str(concrete[icausal]).strip()
    if causal not in ("True", "False", "1", "0"):
        return None
    b, hq, nq, d = q
    _, hkv, nkv, _ = k
    dv = v[3]
    if backward:
        flops = 2 * b * hq * nq * nkv * (3 * d + 2 * dv) + b * nkv * (d + dv) * (hq // hkv - 1)
    else:
        flops = 2 * b * hq * nq * nkv * (d + dv)
    if causal in ("True", "1"):
        if nq != nkv:
            return None
        flops //= 2
    s = size(types[iq])
    if s is None:
        return None
    io = b * hq * nq * d + b * hkv * nkv * d + b * hkv * nkv * dv
    moved = (2 * io + b * hq * nq * dv) if backward else (io + b * hq * nq * dv)
    return flops, moved * s, DTYPES[types[iq]][0]


def int_list(text) -> list[int] | None:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(x, int) for x in value) else None


def output_mask(text) -> tuple[bool, bool, bool] | None:
    """`convolution_backward`'s `output_mask` (which of the input, weight and bias gradients
    it computes) from its Concrete Inputs text (`[False, True, False]`); None when not recorded."""
    found = re.findall(r"true|false|1|0", str(text or "").lower())
    if len(found) != 3:
        return None
    return tuple(v in ("true", "1") for v in found)


def convolution(name: str, dims: list, types: list, concrete: list) -> tuple | None:
    if name == "aten::convolution":
        x, w = dims[0], dims[1]
        bias = bool(dims[2]) if len(dims) > 2 else False
        stride, padding, dilation = (int_list(concrete[i]) if len(concrete) > i else None for i in (3, 4, 5))
        transposed = str(concrete[6]).strip() if len(concrete) > 6 else ""
        if None in (stride, padding, dilation) or transposed not in ("False", "0") or len(x) < 3:
            return None
        out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
               for i in range(len(x) - 2)]
        factor, moved = 1, [nbytes(x, types[0]), nbytes(w, types[1]), nbytes([x[0], w[0], *out], types[0])]
    else:
        grad, x, w = dims[0], dims[1], dims[2]
        mask = output_mask(concrete[10] if len(concrete) > 10 else None)
        if len(grad) < 3 or mask is None:
            return None
        out, bias, factor = grad[2:], mask[2], mask[0] + mask[1]  # the gradients asked for, each a forward's FLOPs
        moved = [nbytes(grad, types[0]), nbytes(x, types[1]) if mask[1] else 0, nbytes(w, types[2]) if mask[0] else 0,
                 nbytes(x, types[1]) if mask[0] else 0, nbytes(w, types[2]) if mask[1] else 0,
                 nbytes([w[0]], types[2]) if mask[2] else 0]
    groups = concrete[8] if name == "aten::convolution" and len(concrete) > 8 else None
    groups = int(groups) if str(groups).strip().isdigit() else (1 if name != "aten::convolution" else None)
    if groups is None or len(w) < 3:
        return None
    flops = factor * 2 * x[0] * w[0] * prod(out) * w[1] * prod(w[2:]) + (x[0] * w[0] * prod(out) if bias else 0)
    return flops, total(moved), DTYPES.get(types[0], ("?",))[0]


def elementwise(name: str, dims: list, types: list, concrete: list) -> tuple | None:
    tensors = [(d, t) for d, t in zip(dims, types) if isinstance(d, list) and t in DTYPES]  # [] : 0-d
    if not tensors:
        return None
    rank = max(len(d) for d, _ in tensors)
    shape: list[int] = []
    for axis in range(rank):  # the broadcast shape
        sizes = {d[len(d) - rank + axis] for d, _ in tensors if len(d) - rank + axis >= 0}
        shape.append(max(sizes))
    n = prod(shape)
    out = n * size(tensors[0][1])
    flops = None if name in NORMS else n
    return flops, total([*(nbytes(d, t) for d, t in tensors), out]), DTYPES[tensors[0][1]][0]


def family(name: str) -> str | None:
    if name in MATMUL:
        return "matmul"
    if name in ATTENTION:
        return "attention"
    if name in CONVOLUTION:
        return "convolution"
    if name in NORMS:
        return "norm"
    if name in ELEMENTWISE:
        return "elementwise"
    return None


FORMULAS = {"matmul": matmul, "attention": attention, "convolution": convolution, "norm": elementwise,
            "elementwise": elementwise}


def work_of(name: str, dims_text: str | None, types_text: str | None, concrete_text: str | None) -> tuple:
    """(family, flops, bytes, dtype) of one op; flops/bytes None when unknown."""
    kind = family(name)
    if kind is None or dims_text is None or types_text is None:
        return kind, None, None, None
    try:
        dims, types = json.loads(dims_text), json.loads(types_text)
        concrete = json.loads(concrete_text) if concrete_text else []
        found = FORMULAS[kind](name, dims, types, concrete)
    except (ValueError, IndexError, TypeError, KeyError):
        found = None
    if found is None:
        return kind, None, None, None
    return kind, found[0], found[1], found[2]


def op_work(trace: Trace) -> pl.DataFrame:
    """One row per CPU op with a formula: op_row (into trace.ops), family, dtype, flops,
    bytes (null: unknown)."""
    ops = trace.ops.with_row_index("op_row").filter(pl.col("name").is_in(FORMULA_OPS))
    if "input_dims" not in ops.columns or ops.height == 0:
        return pl.DataFrame(schema=WORK)
    # an op's work depends on its name and args alone, and a step repeats the same few (a
    # trace of ~800 such ops holds ~50 distinct): each distinct one worked out once
    found: dict[tuple, tuple] = {}
    rows = [found[r] if r in found else found.setdefault(r, work_of(*r))
            for r in ops.select("name", "input_dims", "input_types", "concrete_inputs").iter_rows()]
    return pl.DataFrame({
        "op_row": ops["op_row"], "family": [r[0] for r in rows], "dtype": [r[3] for r in rows],
        "flops": [r[1] for r in rows], "bytes": [r[2] for r in rows]}, schema=WORK)


def kernel_work(trace: Trace) -> pl.DataFrame:
    """One row per device activity launched inside an op with a formula: row (into
    trace.gpu), op, family, dtype, flops, bytes — the innermost such op's, shared among its
    kernels by duration (null: unknown)."""
    schema = {"row": pl.UInt32, "op": pl.String, **{k: v for k, v in WORK.items() if k != "op_row"}}
    work = op_work(trace)
    if work.height == 0 or not trace.has_gpu:
        return pl.DataFrame(schema={**schema, "flops": pl.Float64, "bytes": pl.Float64})
    ops = (trace.ops.with_row_index("op_row").filter((pl.col("cat") == "cpu_op") & ~pl.col("name").is_in(IMPLEMENTATION))
           .select("op_row", o_tid="tid", o_start="start", o_end="end", op="name").join(work, on="op_row", how="left"))
    gpu = trace.gpu.with_row_index("row").filter(pl.col("kind") == "kernel").select(
        "row", "correlation", "name", dur=pl.col("end") - pl.col("start"))
    calls = trace.calls.select("correlation", "tid", c_start="start", c_end="end").drop_nulls("correlation").unique("correlation")
    launches = gpu.join(calls, on="correlation")
    found = (launches.join_where(ops, pl.col("o_start") <= pl.col("c_start"), pl.col("o_end") >= pl.col("c_end"))
             .filter(pl.col("o_tid") == pl.col("tid"))
             .sort("row", "o_start", "o_end", "op_row", descending=[False, True, False, True])  # timeline.INNERMOST_FIRST
             .unique("row", keep="first", maintain_order=True)
             .filter(pl.col("family").is_not_null()))
    share = pl.col("dur") / pl.col("dur").sum().over("op_row")
    share = pl.when(pl.col("dur").sum().over("op_row") > 0).then(share).otherwise(1 / pl.len().over("op_row"))
    tf32 = (pl.col("dtype") == "fp32") & pl.col("name").str.contains(TF32_KERNEL).any().over("op_row")
    return found.select("row", "op", "family", pl.when(tf32).then(pl.lit("tf32")).otherwise("dtype").alias("dtype"),
                        flops=pl.col("flops") * share, bytes=pl.col("bytes") * share).sort("row")


def device_peaks(trace: Trace, peaks: dict | None = None) -> pl.DataFrame:
    """device, peak_key (the row of `peaks`, default `peaks.PEAKS`, that its name and memory
    name: `peaks.device_key`), peak_sku (that row, or `unknown: <device name>` for a device the
    table has no row for: its figures null, never another SKU's) and each figure of the row,
    for the devices of the trace's `deviceProperties`."""
    table = PEAKS if peaks is None else peaks
    rows = []
    for props in trace.meta.get("device_properties") or []:
        key = device_key(props.get("name"), table, props.get("totalGlobalMem"))
        rows.append({"device": props.get("id"), "peak_key": key,
                     "peak_sku": key or (f"unknown: {props['name']}" if props.get("name") else None),
                     **{f"peak_{k}": v for k, v in table.get(key, {}).items()}})
    figures = sorted({f"peak_{k}" for v in table.values() for k in v})
    return pl.DataFrame(rows, schema={"device": pl.Int64, "peak_key": pl.String, "peak_sku": pl.String,
                                      **{f: pl.Float64 for f in figures}})


def roofline(trace: Trace, peaks: dict | None = None) -> pl.DataFrame:
    """One row per kernel with a formula op: row, op, family, dtype, flops, bytes, tflops
    (flops / duration), gbps (bytes / duration, GB/s), peak_tflops (the device's peak for the
    dtype), peak_gbps (its memory bandwidth, GB/s), pct_peak (tflops / peak_tflops × 100; null
    for the memory-bound families, elementwise and norm: see `MEMORY_BOUND`), intensity (flops
    / bytes), ridge (peak FLOP/s over peak bandwidth, FLOP/byte) and bound (`compute` when
    intensity ≥ ridge, else `memory`). Unknown → null."""
    work = kernel_work(trace)
    gpu = trace.gpu.with_row_index("row").select("row", pl.col("device").fill_null(0), dur=pl.col("end") - pl.col("start"))
    table = work.join(gpu, on="row", how="left").join(device_peaks(trace, peaks), on="device", how="left")
    peak_cols = [c for c in table.columns if c.startswith("peak_") and c not in ("peak_key", "peak_sku", "peak_mem_tbps")]
    peak = pl.coalesce([pl.when(pl.col("dtype") == c.removeprefix("peak_")).then(pl.col(c)) for c in peak_cols]) \
        if peak_cols else pl.lit(None, pl.Float64)
    mem = pl.col("peak_mem_tbps") if "peak_mem_tbps" in table.columns else pl.lit(None, pl.Float64)
    ridge = peak / mem
    intensity = pl.col("flops") / pl.col("bytes")
    return table.with_columns(
        tflops=pl.when(pl.col("dur") > 0).then(pl.col("flops") / pl.col("dur") / 1e3),
        gbps=pl.when(pl.col("dur") > 0).then(pl.col("bytes") / pl.col("dur")),
    ).select("row", "op", "family", "dtype", "flops", "bytes", "tflops", "gbps", peak_tflops=peak,
             peak_gbps=mem * 1e3,
             pct_peak=pl.when(~pl.col("family").is_in(MEMORY_BOUND)).then(pl.col("tflops") / peak * 100),
             intensity=intensity, ridge=ridge,
             bound=pl.when(intensity.is_null() | ridge.is_null()).then(pl.lit(None, pl.String))
             .when(intensity >= ridge).then(pl.lit("compute")).otherwise(pl.lit("memory")))
