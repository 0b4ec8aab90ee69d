"""Does running in a rotation shift a variant's step? From an interleaved run's manifest: per
variant, the first step of each block (right after another variant's block) against the block's
other steps (the variant's own steady state, as if alone), each step the slowest rank's; and the
variant's median step in the rotation. Prints one JSON object.

    python3 docs/runs/block_edges.py OUT/manifest.json
"""

from __future__ import annotations

import json
import statistics
import sys


def edges(manifest: dict) -> dict:
    k = manifest["comparison"]["block_steps"]
    out = {}
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok":
            continue
        steps = [max(values) for values in zip(*(r["step_ms"]["all"] for r in entry["ranks"]))]
        blocks = [steps[i:i + k] for i in range(0, len(steps), k)]
        first = [b[0] for b in blocks]
        rest = [x for b in blocks for x in b[1:]]
        out[variant] = {"blocks": len(blocks), "first_ms": round(statistics.median(first), 3),
                        "rest_ms": round(statistics.median(rest), 3) if rest else None,
                        "first_over_rest": round(statistics.median(first) / statistics.median(rest), 4) if rest else None,
                        "median_ms": round(statistics.median(steps), 3)}
    return out


if __name__ == "__main__":
    print(json.dumps(edges(json.load(open(sys.argv[1]))), indent=1))
