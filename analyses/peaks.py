"""Peak throughput of the devices tracekit knows: dense tensor TFLOP/s per dtype and memory
bandwidth, from the vendors' datasheets (figures "with sparsity" halved). Users override or
add devices with a JSON file of the same shape (`tracekit kernels --peaks FILE`).

| device | source |
|---|---|
| H100 SXM5 | NVIDIA H100 Tensor Core GPU datasheet (2023), SXM column |
| H200 SXM | NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column |
| A100 SXM4 80GB | NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column |
| B200 | NVIDIA HGX B200 datasheet (2024), per GPU (HGX B200 8-GPU figures ÷ 8) |
| MI300X | AMD Instinct MI300X accelerator datasheet (2023) |

`fp64` is the FP64 tensor-core (matrix) rate; `fp32` the non-tensor FP32 rate (tensor-core TF32 is `tf32`): a float32 matmul runs on
TF32 tensor cores only where the program allowed it, which a trace does not record.
"""

from __future__ import annotations

PEAKS: dict[str, dict[str, float]] = {
    # dense TFLOP/s per dtype; mem_tbps: HBM bandwidth, TB/s (10^12 bytes/s)
    "H100": {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
             "int8": 1978.9, "mem_tbps": 3.35},
    "H200": {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
             "int8": 1978.9, "mem_tbps": 4.8},
    "A100": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0,
             "mem_tbps": 2.039},
    "B200": {"fp64": 37.0, "fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0,
             "int8": 4500.0, "mem_tbps": 8.0},
    "MI300X": {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9,
               "int8": 2614.9, "mem_tbps": 5.3},
}


def device_key(name: str | None, peaks: dict = PEAKS) -> str | None:
    """The key of `peaks` that the device name names (`NVIDIA H200` → `H200`), longest
    match first; None for an unknown device."""
    if not name:
        return None
    for key in sorted(peaks, key=len, reverse=True):
        if key.lower() in name.lower():
            return key
    return None


def merged(overrides: dict | None) -> dict[str, dict[str, float]]:
    """PEAKS with a user's table laid over it (per device, per figure)."""
    table = {k: dict(v) for k, v in PEAKS.items()}
    for device, figures in (overrides or {}).items():
        table.setdefault(device, {}).update(figures)
    return table
