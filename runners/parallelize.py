"""Wrapping the model per variant: one `apply_*` per technique, one composer.

A variant is a name for a fixed set of options (`VARIANTS`). `parallelize` applies them in
this order, which each step depends on:
1. float8 conversion (swaps nn.Linear before anything wraps or compiles it);
2. per-block torch.compile (compiled blocks are then sharded, as torchtitan does);
3. data parallelism: DDP, FSDP1 or FSDP2 (per block, then the root).
"""

from __future__ import annotations

import torch
from torch import nn

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
}


def check_variants(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return names


def why_skipped(variant: str, device: torch.device) -> str | None:
    """The reason a variant cannot run on this device, or None."""
    if VARIANTS[variant].get("float8"):
        if device.type != "cuda":
            return "float8 training needs a CUDA GPU (compute capability 8.9 or newer)"
        if torch.cuda.get_device_capability(device) < (8, 9):
            return f"float8 needs compute capability 8.9+, this GPU has {torch.cuda.get_device_capability(device)}"
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            return "torchao is not installed (pip install 'torch-tracekit[profile]')"
    return None


def apply_float8(model: nn.Module) -> None:
    """Swap the blocks' nn.Linear for torchao Float8Linear with float8 all-gather under FSDP2."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _module, fqn: fqn.startswith("blocks."))


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block separately (per-block compilation)."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def apply_fsdp1(model: nn.Module, device: torch.device, mixed: bool, limit_all_gathers: bool) -> nn.Module:
    """FullyShardedDataParallel with one unit per block (plus the root)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from .model import Block

    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({Block}), mixed_precision=precision,
        device_id=device, use_orig_params=True, limit_all_gathers=limit_all_gathers)


def apply_fsdp2(model: nn.Module, mixed: bool, per_block: bool, reshard_after_forward: bool) -> nn.Module:
    """fully_shard each block (unless root only), then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed \
        else MixedPrecisionPolicy()
    if per_block:
        for block in model.blocks:
            fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def parallelize(model: nn.Module, variant: str, device: torch.device, mixed: bool) -> nn.Module:
    """The model wrapped as `variant` (see the module docstring for the order)."""
    options = VARIANTS[check_variants([variant])[0]]
    if options.get("float8"):
        apply_float8(model)
    if options.get("compile"):
        apply_compile(model)
    if options["wrap"] == "ddp":
        return apply_ddp(model, device)
    if options["wrap"] == "fsdp1":
        return apply_fsdp1(model, device, mixed, options["limit_all_gathers"])
    return apply_fsdp2(model, mixed, options.get("per_block", True), options.get("reshard_after_forward", True))


def after_optimizer_step(model: nn.Module, variant: str) -> None:
    """Per-step work a technique needs after the optimizer step (float8 scales for FSDP2)."""
    if VARIANTS[variant].get("float8"):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
