"""Wrapping the model per variant: one `apply_*` per technique, one composer.

A variant is a name for a fixed set of options (`VARIANTS`). `parallelize` applies them in
this order, which each step depends on:
1. float8 conversion (swaps nn.Linear before anything wraps or compiles it);
2. per-block torch.compile (compiled blocks are then sharded, as torchtitan does);
3. data parallelism: DDP, FSDP1 or FSDP2 (per block, then the root) — natively, or through
   Lightning Fabric's `DDPStrategy` / `ModelParallelStrategy` (the `lightning-*` variants),
   which then also owns the backward pass and the optimizer.
It returns a `Parallel`: the wrapped model, how to run backward, how to wrap the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .variants import VARIANTS, base_variant, check_variants


@dataclass
class Parallel:
    """A wrapped model, its backward pass and the optimizer made for it."""

    model: nn.Module
    backward: Callable = torch.Tensor.backward
    setup_optimizer: Callable = lambda optimizer: optimizer  # noqa: E731


def why_skipped(variant: str, device: torch.device) -> str | None:
    """The reason a variant cannot run on this device, or None."""
    if VARIANTS[base_variant(variant)].get("lightning"):
        try:
            import lightning.fabric  # noqa: F401
        except ImportError:
            return "Lightning is not installed (pip install 'torch-tracekit[lightning]')"
    if VARIANTS[base_variant(variant)].get("float8"):
        if device.type != "cuda":
            return "float8 training needs a CUDA GPU (compute capability 8.9 or newer)"
        if torch.cuda.get_device_capability(device) < (8, 9):
            return f"float8 needs compute capability 8.9+, this GPU has {torch.cuda.get_device_capability(device)}"
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            return "torchao is not installed (pip install 'torch-tracekit[profile]')"
    return None


def apply_float8(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Swap the blocks' nn.Linear for torchao Float8Linear with float8 all-gather under FSDP2."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    ids = {id(b) for b in blocks}
    prefixes = tuple(f"{fqn}." for fqn, m in model.named_modules() if id(m) in ids)
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _module, fqn: fqn.startswith(prefixes))


def apply_compile(blocks: list[nn.Module]) -> None:
    """torch.compile each block separately, in place (`module.compile()`): module names stay
    those of the eager model, so traces and diffs of compiled and eager variants align."""
    for block in blocks:
        block.compile()


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def apply_fsdp1(model: nn.Module, blocks: list[nn.Module], device: torch.device, mixed: bool,
                limit_all_gathers: bool) -> nn.Module:
    """FullyShardedDataParallel with one unit per block (a lambda policy on those modules)
    plus the root."""
    from functools import partial

    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    ids = {id(b) for b in blocks}
    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    return FullyShardedDataParallel(
        model, auto_wrap_policy=partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in ids),
        mixed_precision=precision,
        device_id=device, use_orig_params=True, limit_all_gathers=limit_all_gathers)


def apply_fsdp2(model: nn.Module, blocks: list[nn.Module], mixed: bool, per_block: bool, reshard_after_forward: bool,
                mesh=None) -> nn.Module:
    """fully_shard each block (unless root only), then the root (over `mesh`, default: all ranks)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed \
        else MixedPrecisionPolicy()
    if per_block:
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def apply_lightning(model: nn.Module, blocks: list[nn.Module], wrap: str, device: torch.device,
                    mixed: bool) -> Parallel:
    """Lightning Fabric in these already-launched workers (it reuses their process group):
    `DDPStrategy` under bf16 autocast (`bf16-mixed`, as the native ddp variant), or
    `ModelParallelStrategy` with tensor-parallel size 1 whose parallelize function is
    `apply_fsdp2` on the data-parallel mesh."""
    import os

    from lightning.fabric import Fabric
    from lightning.fabric.strategies import DDPStrategy, ModelParallelStrategy

    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if wrap == "ddp":
        strategy, precision = DDPStrategy(), "bf16-mixed" if mixed else "32-true"
    else:
        strategy = ModelParallelStrategy(
            lambda m, mesh: apply_fsdp2(m, blocks, mixed, True, True, mesh["data_parallel"]),
            data_parallel_size=world, tensor_parallel_size=1)
        precision = "32-true"
    fabric = Fabric(accelerator=device.type, devices=local, num_nodes=world // local, strategy=strategy,
                    precision=precision)
    fabric.launch()
    return Parallel(fabric.setup_module(model), fabric.backward, fabric.setup_optimizers)


def parallelize(model: nn.Module, blocks: list[nn.Module], variant: str, device: torch.device, mixed: bool) -> Parallel:
    """The model wrapped as `variant` (see the module docstring for the order); `blocks` are
    its repeated blocks, each wrapped as one unit."""
    options = VARIANTS[check_variants([base_variant(variant)])[0]]
    if options.get("float8"):
        apply_float8(model, blocks)
    if options.get("compile"):
        apply_compile(blocks)
    if options.get("lightning"):
        return apply_lightning(model, blocks, options["wrap"], device, mixed)
    if options["wrap"] == "ddp":
        return Parallel(apply_ddp(model, device))
    if options["wrap"] == "fsdp1":
        return Parallel(apply_fsdp1(model, blocks, device, mixed, options["limit_all_gathers"]))
    return Parallel(apply_fsdp2(model, blocks, mixed, options.get("per_block", True),
                                options.get("reshard_after_forward", True)))


def precision_path(variant: str, mixed: bool) -> str:
    """How the variant computes, in words (`tracekit report` shows it beside the losses)."""
    options = VARIANTS[base_variant(variant)]
    if not mixed:
        return "fp32"
    base = "bf16 autocast, fp32 params and grads" if options["wrap"] == "ddp" \
        else "bf16 params, fp32 gradient reduction (mixed-precision policy)"
    base += " (via Lightning)" if options.get("lightning") else ""
    return base + (", float8 linears (torchao)" if options.get("float8") else "")


def after_optimizer_step(model: nn.Module, variant: str) -> None:
    """Per-step work a technique needs after the optimizer step (float8 scales for FSDP2)."""
    if VARIANTS[base_variant(variant)].get("float8"):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
