"""FLOPs and bytes from recorded shapes: hand computations on a real H200 `full` trace,
TraceLens' published formulas on every GEMM and attention op of it, the H200 peaks, and
`unknown` where shapes are missing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import synth
import tracekit
from tracekit.analyses.flops import op_work, roofline
from tracekit.analyses.peaks import PEAKS, device_key, merged

RUN = Path(__file__).parent / "data" / "h200x2-blocks4"


def ops_by_shape(variant: str) -> pl.DataFrame:
    trace = tracekit.load(RUN / variant / "rank0.pt.trace.json.gz")
    return op_work(trace).join(trace.ops.with_row_index("op_row"), on="op_row")


@pytest.mark.parametrize("name, dims, flops, moved", [
    # 2·M·N·K with M=4096, K=32000, N=768; bytes (MK + KN + MN)·2 (bf16)
    ("aten::mm", "[[4096, 32000], [32000, 768]]", 2 * 4096 * 32000 * 768, (4096 * 32000 + 32000 * 768 + 4096 * 768) * 2),
    # 2·M·N·K + M·N (bias) with M=4096, K=N=768; bytes (N + MK + KN + MN)·2
    ("aten::addmm", "[[768], [4096, 768], [768, 768], [], []]", 2 * 4096 * 768 * 768 + 4096 * 768,
     (768 + 4096 * 768 + 768 * 768 + 4096 * 768) * 2),
    # causal attention B=4, H=12, N=1024, d=64: forward 4·B·H·N²·d / 2; Q, K, V, O of B·H·N·d
    ("aten::_scaled_dot_product_cudnn_attention", None, 4 * 4 * 12 * 1024 * 1024 * 64 // 2, 4 * (4 * 12 * 1024 * 64) * 2),
    # backward 2·B·H·N²·(3d + 2d) / 2; Q, K, V, dO read and dQ, dK, dV written
    ("aten::_scaled_dot_product_cudnn_attention_backward", None, 2 * 4 * 12 * 1024 * 1024 * 5 * 64 // 2,
     7 * (4 * 12 * 1024 * 64) * 2),
])
def test_hand_computed_flops_on_the_h200_trace(name, dims, flops, moved):
    ops = ops_by_shape("fsdp2").filter(pl.col("name") == name)
    if dims:
        ops = ops.filter(pl.col("input_dims") == dims)
    assert ops.height > 0
    assert ops["flops"].unique().to_list() == [flops]
    assert ops["bytes"].unique().to_list() == [moved]
    assert ops["dtype"].unique().to_list() == ["bf16"]


def test_scaled_mm_by_hand():
    """fp8 A [4096, 768] · B [768, 3072], out_dtype 15 (bfloat16): 2·M·N·K; M·K + K·N bytes of
    fp8 read, M·N·2 written."""
    ops = ops_by_shape("fsdp2-fp8").filter((pl.col("name") == "aten::_scaled_mm") &
                                           (pl.col("input_dims").str.starts_with("[[4096, 768], [768, 3072]")))
    assert ops.height > 0
    assert ops.select("flops", "bytes", "dtype").unique().rows() == [
        (2 * 4096 * 768 * 3072, 4096 * 768 + 768 * 3072 + 4096 * 3072 * 2, "fp8")]


# TraceLens' formulas as it publishes them (AMD-AGI/TraceLens, TraceLens/PerfModel/perf_model.py:
# GEMM.flops_func / bytes_func, SDPA.flops_func / bytes_func / flops_bwd_func / bytes_bwd_func),
# written out again here and applied to the shapes read from the raw trace JSON.
def tracelens_gemm(m, n, k, bias, bpe):
    return 2 * m * n * k + (m * n if bias else 0), m * k * bpe + k * n * bpe + m * n * bpe + (n if bias else 0) * bpe


def tracelens_sdpa(b, n_q, h_q, n_kv, h_kv, d_qk, d_v, causal, bpe, backward):
    if backward:  # flash_impl: the scores recomputed
        flops = (b * h_q * (2 * n_q * n_kv * d_qk) + b * h_q * (2 * n_kv * n_q * d_v) + b * n_kv * d_v * (h_q // h_kv - 1)
                 + b * h_q * (2 * n_q * n_kv * d_v) + b * h_q * (2 * n_q * n_kv * d_qk)
                 + b * h_q * (2 * n_kv * n_q * d_qk) + b * n_kv * d_qk * (h_q // h_kv - 1))
        elems = (b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v + b * n_q * h_q * d_v
                 + b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v)
    else:
        flops = b * h_q * (2 * n_q * n_kv * d_qk) + b * h_q * (2 * n_q * d_v * n_kv)
        elems = b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v + b * n_q * h_q * d_v
    return (flops / 2 if causal else flops), elems * bpe


def raw_ops(variant: str) -> dict[int, dict]:
    with gzip.open(RUN / variant / "rank0.pt.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})}


@pytest.mark.parametrize("variant", ["fsdp1", "fsdp2", "fsdp2-compile"])
def test_tracelens_formulas_agree_on_every_gemm_and_attention(variant):
    raw = raw_ops(variant)
    ours = ops_by_shape(variant).filter(pl.col("family").is_in(["matmul", "attention"]))
    checked = 0
    for ext_id, name, flops, moved in ours.select("ext_id", "name", "flops", "bytes").iter_rows():
        args = raw[ext_id]["args"]
        dims, causal_args = args["Input Dims"], args["Concrete Inputs"]
        if name == "aten::mm":
            expected = tracelens_gemm(dims[0][0], dims[1][1], dims[0][1], False, 2)
        elif name == "aten::addmm":
            expected = tracelens_gemm(dims[1][0], dims[2][1], dims[1][1], True, 2)
        elif name == "aten::linear":
            expected = tracelens_gemm(dims[0][0] * dims[0][1], dims[1][0], dims[0][2], True, 2)
        elif name.startswith("aten::_scaled_dot_product_cudnn_attention"):
            backward = name.endswith("_backward")
            q, k, v = dims[1:4] if backward else dims[0:3]
            causal = causal_args[14 if backward else 6] == "True"
            expected = tracelens_sdpa(q[0], q[2], q[1], k[2], k[1], q[3], v[3], causal, 2, backward)
        else:
            continue
        assert (flops, moved) == expected, name
        checked += 1
    assert checked >= 50


@pytest.mark.parametrize("variant", ["fsdp1", "fsdp2", "fsdp2-fp8", "fsdp2-compile"])
def test_h200_gemms_run_within_the_peak(variant):
    trace = tracekit.load(RUN / variant / "rank0.pt.trace.json.gz")
    gemms = roofline(trace).filter(pl.col("family") == "matmul")
    assert gemms.height > 0 and gemms["flops"].null_count() == 0
    assert gemms["pct_peak"].null_count() == 0
    assert (gemms["pct_peak"] > 0).all() and (gemms["pct_peak"] <= 100).all()
    peak = gemms.select(pl.col("dtype").replace_strict({"bf16": 989.4, "fp8": 1978.9}, default=None))
    assert (gemms["tflops"] <= peak.to_series()).all()


def test_unknown_without_shapes_never_a_guess(tmp_path):
    """An mm with its shapes recorded gets 2·M·N·K; one without gets null, and so does its
    kernel's TFLOP/s."""
    events = [synth.step(1, 0.0, 100.0),
              synth.op("aten::mm", 1.0, 10.0, **{"Input Dims": [[64, 32], [32, 16]],
                                                   "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}),
              *synth.launched("gemm_a", 2.0, 20.0, 2.0, corr=1),
              synth.op("aten::mm", 30.0, 10.0),
              *synth.launched("gemm_b", 31.0, 50.0, 2.0, corr=2)]
    trace = tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))
    rows = roofline(trace).join(trace.gpu.with_row_index("row").select("row", "name"), on="row").sort("name")
    assert rows.select("name", "flops", "bytes", "dtype").rows() == [
        ("gemm_a", 2 * 64 * 16 * 32, (64 * 32 + 32 * 16 + 64 * 16) * 4, "fp32"), ("gemm_b", None, None, None)]
    assert rows["tflops"][0] == pytest.approx(2 * 64 * 16 * 32 / 2000 / 1e3)
    assert rows["tflops"][1] is None
    assert rows["pct_peak"].null_count() == 2  # no deviceProperties: no peak to compare with


def test_peaks_table_names_devices_and_takes_overrides():
    """Per-SKU rows (`test_roofline.py::test_each_sku_has_its_own_row` has them all); a
    user's table overrides a row's figures and adds devices, named by a word of the name."""
    assert device_key("NVIDIA H200") == "H200 SXM" and device_key("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert device_key("AMD Instinct MI300X") == "MI300X" and device_key("NVIDIA A100-SXM4-80GB") == "A100 SXM 80GB"
    assert device_key("NVIDIA B200") == "B200" and device_key("Tesla T4") is None
    table = merged({"H200 SXM": {"bf16": 900.0}, "L40S": {"bf16": 362.0, "mem_tbps": 0.864}})
    assert table["H200 SXM"]["bf16"] == 900.0 and table["H200 SXM"]["fp8"] == PEAKS["H200 SXM"]["fp8"]
    assert device_key("NVIDIA L40S", table) == "L40S" and device_key("NVIDIA L40", table) is None
    assert device_key("NVIDIA H200", table) == "H200 SXM"


def test_kernels_report_tflops_within_the_h200_peak():
    from click.testing import CliRunner

    from tracekit.front.cli import main

    result = CliRunner().invoke(main, ["kernels", "--format", "json", "--top", "100", "--rank", "0",
                                       str(RUN / "fsdp2")])
    assert result.exit_code == 0, result.output
    groups = json.loads(result.stdout)["traces"][0]["steps"][0]["kernels"]
    gemms = [g for g in groups if g["name"].startswith("nvjet")]
    assert gemms and all(g["tflops"] is not None for g in gemms)
    for g in gemms:  # bf16 on an H200: 989.4 dense TFLOP/s
        assert 0 < g["tflops"] <= 989.4
        assert g["pct_peak"] == pytest.approx(g["tflops"] / 989.4 * 100, abs=0.01)
    assert all(g["tflops"] is None for g in groups if g["category"] == "comm")


def mm_step(tmp_path, name, m, kernel_us):
    """A GPU-bound step: one mm of [m, 32]·[32, 16] whose kernel runs `kernel_us`, the host
    blocked in cudaDeviceSynchronize meanwhile."""
    events = [synth.step(1, 0.0, 200.0),
              synth.op("aten::mm", 1.0, 3.0, **{"Input Dims": [[m, 32], [32, 16]], "Input type": ["float", "float"],
                                                  "Concrete Inputs": ["", ""]}),
              *synth.launched("gemm", 2.0, 10.0, kernel_us, corr=1),
              synth.call("cudaDeviceSynchronize", 5.0, 190.0, corr=2)]
    return tracekit.load(synth.write(tmp_path, name, synth.doc(events)))


def test_diff_splits_gemm_delta_into_flops_and_efficiency(tmp_path):
    """B does twice the FLOPs at A's rate: all of the Δ is FLOPs; C does A's FLOPs at half the
    rate: all of it efficiency. The GEMM sets both steps' length: on both critical paths."""
    from tracekit.analyses.diff import diff_traces

    a = mm_step(tmp_path, "a.json", 64, 20.0)
    for other, m, why, d_flops, d_eff in (("b.json", 128, "FLOPs", 20_000, 0), ("c.json", 64, "efficiency", 0, 20_000)):
        b = mm_step(tmp_path, other, m, 40.0)
        (gemm,) = diff_traces(a, b, 1, 1).all_items.filter(pl.col("kind") == "compute").to_dicts()
        assert (gemm["why"], gemm["d_flops_ns"], gemm["d_efficiency_ns"], gemm["critical"]) == (why, d_flops, d_eff, "both")
        assert gemm["a_flops"] == 2 * 64 * 16 * 32 and gemm["b_flops"] == 2 * m * 16 * 32
