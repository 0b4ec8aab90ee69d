"""The training batches: one per step, random tokens, the same for every variant.

Shape modes (`--inputs`):
- `fixed`: every sequence `seq` tokens (the default);
- `variable-length`: each sequence a random length in [25 %, 100 %] of `seq`, the batch padded
  to its longest (padding is token 0 and left out of the loss);
- `variable-mask`: fixed length, a random 20–80 % prefix of each sequence left out of the loss;
- `buckets:L1,L2,...`: lengths as variable-length, the batch padded up to the next bucket
  (lengths past the largest bucket are padded to `seq`).
"""

from __future__ import annotations

import torch

IGNORE = -100  # cross_entropy's ignore_index


def parse_inputs(text: str, seq: int) -> dict:
    """{"mode", "buckets"} from `--inputs`; a bad value raises ValueError (one line)."""
    if text in ("fixed", "variable-length", "variable-mask"):
        return {"mode": text, "buckets": []}
    if text.startswith("buckets:"):
        try:
            buckets = sorted({int(b) for b in text.split(":", 1)[1].split(",")})
        except ValueError:
            raise ValueError(f"--inputs {text!r}: buckets are whole numbers, e.g. buckets:256,512,1024") from None
        if not buckets or buckets[0] < 1 or buckets[-1] > seq:
            raise ValueError(f"--inputs {text!r}: buckets must lie in 1..seq ({seq})")
        return {"mode": "buckets", "buckets": buckets}
    raise ValueError(f"--inputs {text!r}: choose fixed, variable-length, variable-mask or buckets:L1,L2,...")


def batch(config, inputs: dict, seed: int, rank: int, step: int, device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(tokens, targets, padded length, real tokens) of training step `step` on `rank`; real
    tokens are the targets the loss counts (padding and masked prefixes left out)."""
    g = torch.Generator().manual_seed((seed * 1000 + rank) * 100_003 + step)
    b, seq = config.batch, config.seq
    tokens = torch.randint(1, config.vocab, (b, seq + 1), generator=g)
    inputs_, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    mode = inputs["mode"]
    if mode == "variable-mask":
        keep_from = (torch.rand(b, generator=g) * 0.6 + 0.2) * seq
        targets[torch.arange(seq)[None, :] < keep_from[:, None].long()] = IGNORE
    elif mode in ("variable-length", "buckets"):
        lengths = (torch.rand(b, generator=g) * 0.75 * seq + 0.25 * seq).long().clamp(1, seq)
        length = int(lengths.max())
        if mode == "buckets":
            length = next((bucket for bucket in inputs["buckets"] if bucket >= length), seq)
        pad = torch.arange(length)[None, :] >= lengths[:, None]
        inputs_, targets = inputs_[:, :length], targets[:, :length]
        inputs_[pad], targets[pad] = 0, IGNORE
        seq = length
    real = int((targets != IGNORE).sum())
    if torch.device(device).type == "cuda":  # an asynchronous copy, as a data loader's: no host sync
        return (inputs_.pin_memory().to(device, non_blocking=True), targets.pin_memory().to(device, non_blocking=True),
                seq, real)
    return inputs_.to(device), targets.to(device), seq, real
