"""What the runner trains: the contract a model factory fulfils (`--model`, docs/profile.md).

A factory is a callable without arguments that returns a `Workload`. `--model` names one:
- `builtin` (the default): the synthetic transformer of `--preset` (`runners/model.py`);
- `hf:CONFIG`: a Hugging Face causal LM built from a local `config.json` (`runners/hf.py`);
- `MODULE:FACTORY` or `path/to/file.py:FACTORY`: the user's own.
Every rank calls the factory after seeding torch with `--seed`, so every variant starts from
the same weights; the batch function must likewise depend only on (step, rank).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

IGNORE_INDEX = -100  # targets the default loss leaves out (padding, masked prompts)


def causal_lm_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """The default loss: mean cross-entropy of the logits (`outputs`, or `outputs.logits` as
    Hugging Face models return them) against next-token `targets`, in fp32, targets equal to
    `IGNORE_INDEX` left out."""
    logits = getattr(outputs, "logits", outputs)
    return nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


def fused_adamw(params) -> torch.optim.Optimizer:
    """The default optimizer: AdamW, lr 1e-4, fused (one kernel per step for all parameters,
    torchtitan's default): the foreach form issues a dozen list ops per step, which on FSDP2's
    DTensor parameters cost tens of ms of host time a training job would not spend."""
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


@dataclass
class Workload:
    """A model and what it takes to train it.

    - `model`: the whole model (on the CPU or the meta device; the runner moves it);
    - `blocks`: its repeated blocks, each wrapped as one unit (FSDP1 unit, FSDP2
      `fully_shard`, per-block `torch.compile`, float8 conversion of their `nn.Linear`s);
      modules of `model`, at least one;
    - `batch(step, rank, device)`: the batch of training step `step` (0, 1, …) on `rank`,
      `(inputs, targets)` or `(inputs, targets, real_tokens)` — real tokens (what the loss
      counts, no padding) make `tokens_per_s`. `inputs` is passed to the model as
      `model(inputs)`, `model(*inputs)` for a tuple, `model(**inputs)` for a dict;
    - `loss(outputs, targets)`: a scalar tensor (default `causal_lm_loss`);
    - `optimizer(params)`: the optimizer over the wrapped model's parameters (default
      `fused_adamw`);
    - `info`: what the manifest records about the model (`model.architecture`, …).
    """

    model: nn.Module
    blocks: list[nn.Module]
    batch: Callable[[int, int, torch.device], tuple]
    loss: Callable[[Any, torch.Tensor], torch.Tensor] = causal_lm_loss
    optimizer: Callable[[Any], torch.optim.Optimizer] = fused_adamw
    info: dict = field(default_factory=dict)


class WorkloadError(ValueError):
    """A `--model` that cannot be used (one line, naming the problem)."""


def load_factory(spec: str, cfg: dict) -> Callable[[], Workload]:
    """The factory `--model spec` names (see the module docstring); `cfg` is the run's
    configuration (preset, shapes, inputs, seed) for the built-in and `hf:` factories."""
    from functools import partial

    if spec == "builtin":
        from .model import builtin_workload
        return partial(builtin_workload, cfg)
    if spec.startswith("hf:"):
        from .hf import hf_workload
        return partial(hf_workload, spec[3:], cfg)
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise WorkloadError(f"--model {spec!r}: expected builtin, hf:CONFIG, MODULE:FACTORY or path/to/file.py:FACTORY")
    try:
        module = import_file(where) if where.endswith(".py") else importlib.import_module(where)
    except Exception as e:
        message = f"--model {spec}: cannot import {where} ({type(e).__name__}: {e})"
        raise WorkloadError(message.splitlines()[0]) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise WorkloadError(f"--model {spec}: {where} has no callable {name!r}")
    return factory


def import_file(path: str):
    """The module defined by the Python file at `path` (imported once per process)."""
    import sys

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no file {path}")
    name = f"tracekit_model_{file.stem}"
    if name not in sys.modules:  # imported once per process, as a module named in --model is
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def build_workload(factory: Callable[[], Workload], spec: str) -> Workload:
    """`factory()`, checked against the contract (a bad one raises WorkloadError: one line)."""
    try:
        workload = factory()
    except WorkloadError:
        raise
    except Exception as e:
        raise WorkloadError(f"--model {spec}: the factory raised {type(e).__name__}: {e}".splitlines()[0]) from None
    if not isinstance(workload, Workload):
        raise WorkloadError(f"--model {spec}: the factory returned {type(workload).__name__}, not a "
                            "tracekit.runners.workload.Workload")
    if not isinstance(workload.model, nn.Module):
        raise WorkloadError(f"--model {spec}: Workload.model is a {type(workload.model).__name__}, not an nn.Module")
    blocks = list(workload.blocks or [])
    if not blocks:
        raise WorkloadError(f"--model {spec}: no blocks found (Workload.blocks is empty)")
    inside = {id(m) for m in workload.model.modules()}
    if not all(isinstance(b, nn.Module) and id(b) in inside and b is not workload.model for b in blocks):
        raise WorkloadError(f"--model {spec}: Workload.blocks must be submodules of Workload.model")
    for name, fn in (("batch", workload.batch), ("loss", workload.loss), ("optimizer", workload.optimizer)):
        if not callable(fn):
            raise WorkloadError(f"--model {spec}: Workload.{name} is not callable")
    if len(inspect.signature(workload.batch).parameters) != 3:
        raise WorkloadError(f"--model {spec}: Workload.batch takes (step, rank, device)")
    workload.blocks = blocks
    return workload


def describe(workload: Workload, spec: str) -> dict:
    """The manifest's `model`: the `--model` given, the architecture (the model's class unless
    the factory says), the parameter count, the block count, the optimizer (its function's
    name), and the factory's `info`."""
    return {"spec": spec, "architecture": type(workload.model).__name__,
            "parameters": sum(p.numel() for p in workload.model.parameters()), "blocks": len(workload.blocks),
            "optimizer": getattr(workload.optimizer, "__name__", type(workload.optimizer).__name__), **workload.info}
