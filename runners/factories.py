"""Choosing the model factory `--model` names, and checking what it returns.

- `builtin` (the default): the synthetic transformer of `--preset` (`runners/model.py`);
- `hf:CONFIG`: a Hugging Face causal LM built from a local `config.json` (`runners/hf.py`);
- `MODULE:FACTORY` or `path/to/file.py:FACTORY`: the user's own.
Above both the contract (`runners/workload.py`) and the built-in and `hf:` factories.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Callable

from torch import nn

from .model import builtin_workload
from .workload import Workload, WorkloadError


def load_factory(spec: str, cfg: dict) -> Callable[[], Workload]:
    """The factory `--model spec` names (see the module docstring); `cfg` is the run's
    configuration (preset, shapes, inputs, seed) for the built-in and `hf:` factories."""
    from functools import partial

    if spec == "builtin":
        return partial(builtin_workload, cfg)
    if spec.startswith("hf:"):
        from .hf import hf_workload  # transformers only when asked for (extra hf)

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
