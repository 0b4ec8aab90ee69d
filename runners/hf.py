"""`--model hf:CONFIG`: a Hugging Face causal LM from a local `config.json`, random weights.

Built with `AutoModelForCausalLM.from_config` (extra `hf`: transformers) with the hub off
(`HF_HUB_OFFLINE=1`): nothing is downloaded. The blocks are the decoder layers — the
`nn.ModuleList` holding most of the parameters (`model.model.layers` in Llama, Qwen,
Mistral). The batch is the built-in one (`--batch` × `--seq` of the preset, `--inputs`) over
the config's `vocab_size`; the loss the default causal-LM loss.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from .workload import Workload, WorkloadError


def read_config(path: str) -> dict:
    """The JSON of `path` (a config.json, or a directory holding one)."""
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        document = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        message = f"--model hf:{path}: cannot read {file} ({type(e).__name__}: {e})"
        raise WorkloadError(message.splitlines()[0]) from None
    if not isinstance(document, dict) or "model_type" not in document:
        raise WorkloadError(f"--model hf:{path}: {file} has no model_type (not a transformers config.json)")
    return document


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The `nn.ModuleList` of the model holding the most parameters (None if it has none)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)


def hf_workload(path: str, cfg: dict) -> Workload:
    """The `hf:` factory (see the module docstring)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    document = read_config(path)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise WorkloadError("--model hf: needs transformers (pip install 'torch-tracekit[hf]')") from None
    from .inputs import batch, parse_inputs
    from .model import model_config

    fields = {k: v for k, v in document.items() if k not in ("model_type", "transformers_version")}
    try:
        config = AutoConfig.for_model(document["model_type"], **fields)
        config.use_cache = False
        model = AutoModelForCausalLM.from_config(config).float()
    except Exception as e:
        raise WorkloadError(f"--model hf:{path}: transformers cannot build it ({type(e).__name__}: {e})"
                            .splitlines()[0]) from None
    layers = decoder_layers(model)
    if layers is None:
        raise WorkloadError(f"--model hf:{path}: no decoder layers (no nn.ModuleList) in {type(model).__name__}")
    shape = model_config(cfg["preset"], **cfg["overrides"])
    sizes = SimpleNamespace(batch=shape.batch, seq=shape.seq, vocab=config.vocab_size)
    inputs = parse_inputs(cfg["inputs"], sizes.seq)

    def batch_of(step: int, rank: int, device: torch.device):
        tokens, targets, _, real = batch(sizes, inputs, cfg["seed"], rank, step, device)
        return tokens, targets, real
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    return Workload(model, list(layers), batch_of,
                    info={"architecture": architectures[0], "model_type": config.model_type, "config": str(path),
                          "batch": sizes.batch, "seq": sizes.seq, "vocab": sizes.vocab})
