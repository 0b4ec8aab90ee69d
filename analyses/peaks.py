"""Peak throughput of the devices tracekit knows, one row per SKU: dense tensor TFLOP/s per
dtype and memory bandwidth, from the vendors' datasheets (figures "with sparsity" halved).
Users override or add devices with a JSON file of the same shape (`tracekit kernels --peaks
FILE`).

| row | source |
|---|---|
| H100 SXM | NVIDIA H100 Tensor Core GPU datasheet (2023), "H100 SXM" column |
| H100 PCIe | the same datasheet, "H100 PCIe" column (the 80 GB card: 2 TB/s) |
| H100 NVL | NVIDIA H100 NVL datasheet (2024), per GPU (94 GB, 3.9 TB/s) |
| H200 SXM | NVIDIA H200 Tensor Core GPU datasheet (2024), "H200 SXM" column |
| H200 NVL | the same datasheet, "H200 NVL" column |
| GH200 96GB, GH200 144GB | NVIDIA GH200 Grace Hopper Superchip datasheet (2024): the GPU with 96 GB HBM3 (4 TB/s) or 144 GB HBM3e (4.9 TB/s) |
| A100 SXM 80GB, A100 PCIe 80GB | NVIDIA A100 Tensor Core GPU datasheet (2021), "A100 80GB SXM" and "A100 80GB PCIe" columns (2,039 and 1,935 GB/s) |
| A100 40GB | NVIDIA A100 Tensor Core GPU datasheet (2020), 40 GB, PCIe and SXM alike (1,555 GB/s) |
| B200 | NVIDIA HGX B200 datasheet (2024), per GPU (HGX B200 8-GPU figures ÷ 8) |
| GB200 | NVIDIA GB200 NVL72 datasheet (2024), "Individual Blackwell GPU" of the GB200 NVL72 (8 TB/s) |
| MI300X | AMD Instinct MI300X accelerator datasheet (2023) |

`fp64` is the FP64 tensor-core (matrix) rate; `fp32` the non-tensor FP32 rate; `tf32` the
tensor-core rate of a float32 matmul run as TF32 (`flops.py` picks it from the kernel's name).
"""

from __future__ import annotations

import re

PEAKS: dict[str, dict[str, float]] = {
    # dense TFLOP/s per dtype; mem_tbps: HBM bandwidth, TB/s (10^12 bytes/s)
    "H100 SXM": {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
                 "int8": 1978.9, "mem_tbps": 3.35},
    "H100 PCIe": {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0,
                  "int8": 1513.0, "mem_tbps": 2.0},
    "H100 NVL": {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5,
                 "int8": 1670.5, "mem_tbps": 3.9},
    "H200 SXM": {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
                 "int8": 1978.9, "mem_tbps": 4.8},
    "H200 NVL": {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5,
                 "int8": 1670.5, "mem_tbps": 4.8},
    "GH200 96GB": {"fp64": 67.0, "fp32": 67.0, "tf32": 494.0, "bf16": 990.0, "fp16": 990.0, "fp8": 1979.0,
                   "int8": 1979.0, "mem_tbps": 4.0},
    "GH200 144GB": {"fp64": 67.0, "fp32": 67.0, "tf32": 494.0, "bf16": 990.0, "fp16": 990.0, "fp8": 1979.0,
                    "int8": 1979.0, "mem_tbps": 4.9},
    "A100 SXM 80GB": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0,
                      "mem_tbps": 2.039},
    "A100 PCIe 80GB": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0,
                       "mem_tbps": 1.935},
    "A100 40GB": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0,
                  "mem_tbps": 1.555},
    "B200": {"fp64": 37.0, "fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0,
             "int8": 4500.0, "mem_tbps": 8.0},
    "GB200": {"fp64": 40.0, "fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0,
              "int8": 5000.0, "mem_tbps": 8.0},
    "MI300X": {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9,
               "int8": 2614.9, "mem_tbps": 5.3},
}
GIB = 2**30


def words(name: str) -> set[str]:
    """The device name's words, upper case: `NVIDIA A100-SXM4-80GB` → {NVIDIA, A100, SXM4, 80GB}."""
    return set(re.findall(r"[A-Z0-9]+", name.upper()))


def sku(name: str, memory: int | None = None) -> str | None:
    """The row of `PEAKS` for a device name as CUDA reports it (Kineto's `deviceProperties`)
    and its memory in bytes (`totalGlobalMem`), where they say which SKU it is; None where
    they do not (a bare `H100`, an A100 of unknown memory, a device not in the table).
    Names are matched word by word, so `GH200` is not an `H200`, nor `GB200` a `B200`."""
    w = words(name)
    gib = (memory or 0) / GIB
    if "GB200" in w:
        return "GB200"
    if "B200" in w:
        return "B200"
    if "GH200" in w:
        return None if not gib else ("GH200 144GB" if gib > 110 else "GH200 96GB")
    if "H200" in w:
        return "H200 NVL" if "NVL" in w else "H200 SXM"  # the SXM part reports a bare `NVIDIA H200`
    if "H100" in w:
        if "PCIE" in w:
            return "H100 PCIe"
        if "NVL" in w:
            return "H100 NVL"
        return "H100 SXM" if w & {"SXM", "SXM5", "HBM3"} else None  # `NVIDIA H100 80GB HBM3`: the SXM5 part
    if "A100" in w:  # 40 GB: PCIe and SXM share every figure; `PG509` is the SXM4 board
        if "40GB" in w or 0 < gib < 60:
            return "A100 40GB"
        if "80GB" in w or gib >= 60:
            return "A100 PCIe 80GB" if "PCIE" in w else "A100 SXM 80GB" if w & {"SXM4", "SXM", "PG509"} else None
        return None
    return "MI300X" if "MI300X" in w else None


def device_key(name: str | None, peaks: dict = PEAKS, memory: int | None = None) -> str | None:
    """The row of `peaks` for the device: a row the user added (`--peaks`) whose name is a
    word or words of the device name (`L40S` for `NVIDIA L40S`; longest first), else its SKU
    (`sku`) where `peaks` has that row; None for a device `peaks` does not know."""
    if not name:
        return None
    for key in sorted((k for k in peaks if k not in PEAKS), key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, re.IGNORECASE):
            return key
    known = sku(name, memory)
    return known if known in peaks else None


def merged(overrides: dict | None) -> dict[str, dict[str, float]]:
    """PEAKS with a user's table laid over it (per device, per figure)."""
    table = {k: dict(v) for k, v in PEAKS.items()}
    for device, figures in (overrides or {}).items():
        table.setdefault(device, {}).update(figures)
    return table
