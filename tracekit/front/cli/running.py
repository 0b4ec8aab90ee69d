"""Verbs that run the model: profile and capacity (the runners, tracekit.runners)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .common import emit, format_option, main, render_frame
from .comparing import show_report


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="tracekit-out", show_default=True,
              help="Output directory: manifest.json and <variant>/rank<r>.pt.trace.json.gz.")
@click.option("--variants", default="ddp,fsdp1,fsdp2", show_default=True,
              help="Comma-separated: ddp, fsdp1, fsdp1-nolimit, fsdp2, fsdp2-root, fsdp2-noreshard, "
                   "fsdp2-compile, fsdp2-fp8, fsdp2-compile-fp8, lightning-ddp, lightning-fsdp2.")
@click.option("--model", default="builtin", show_default=True,
              help="builtin (the synthetic transformer of --preset), hf:CONFIG (a local transformers config.json "
                   "or a directory with one; random weights, extra hf), or MODULE:FACTORY / path/to/file.py:FACTORY "
                   "returning a tracekit.runners.workload.Workload (docs/profile.md).")
@click.option("--preset", type=click.Choice(["tiny", "small", "medium", "large"]), default="tiny", show_default=True,
              help="The built-in model's shapes; for hf: its batch and seq.")
@click.option("--blocks", type=int)
@click.option("--hidden", type=int)
@click.option("--heads", type=int)
@click.option("--seq", type=int)
@click.option("--batch", type=int, help="Sequences per rank (weak scaling).")
@click.option("--global-batch", type=int, help="Sequences in total, split over the ranks (strong scaling).")
@click.option("--inputs", default="fixed", show_default=True,
              help="fixed, variable-length, variable-mask or buckets:L1,L2,... (docs/profile.md).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when available (NCCL), else cpu (gloo).")
@click.option("--nproc", type=int, default=None, help="Workers to start (default: GPUs, or 2 on CPU). "
              "Ignored under torchrun/srun.")
@click.option("--precision", type=click.Choice(["bf16", "fp32"]), default=None,
              help="bf16 parameters with fp32 reduction (default on cuda) or fp32 (default on cpu).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--steps", type=int, default=20, show_default=True, help="Sequential: timed unprofiled steps.")
@click.option("--profile-steps", type=int, default=1, show_default=True,
              help="Steps recorded with the profiler after the timed ones (0: none).")
@click.option("--profile-mode", type=click.Choice(["cupti", "device", "lean", "light", "full"]), default="cupti",
              show_default=True,
              help="cupti: kernels, copies and memsets straight from CUPTI (extra `cupti`; else device, saying "
                   "why), the runner's step and phase marks written in, then one full step for names; device: "
                   "the same through torch.profiler, with runtime calls; lean: device activity and annotations; "
                   "light: every CPU op; full: every CPU op with shapes (and stacks with --with-stack). "
                   "docs/profile.md.")
@click.option("--profile-rounds", type=int, default=None,
              help="cupti mode: capture the recorded steps in this many rounds, each between two blocks of the same "
                   "steps unprofiled (C R C R ... C), one trace holding every round's steps; what the recording cost "
                   "is then measured against the steps run right beside it [default: 9 in cupti mode; 1, the only "
                   "choice, in the others].")
@click.option("--compare", type=click.Choice(["interleaved", "sequential"]), default=None,
              help="interleaved: every variant built side by side in each worker and timed in alternated blocks "
                   "(--rounds, --block-steps), the recorded rounds alternated too; sequential: each variant in its "
                   "own workers, one after another (--steps, --repeats) [default: interleaved; sequential with "
                   "--repeats > 1, --checkpoint or Lightning variants, or where the variants do not fit together].")
@click.option("--rounds", type=int, default=10, show_default=True,
              help="Interleaved: timed rounds; each runs every variant twice, in mirrored order (A B C C B A).")
@click.option("--block-steps", type=int, default=5, show_default=True,
              help="Interleaved: steps of one variant run back to back in a block.")
@click.option("--control", is_flag=True,
              help="Add an A/A control: a second, independent copy of the first variant, compared like the others "
                   "(its difference should be 0; the report warns when its interval excludes 0).")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Sequential: run the whole variant matrix this many times, the order alternated (A B, B A, ...); "
                   "the report's intervals are then across repeats. Traces are recorded in the last repeat.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (full mode).")
@click.option("--memory", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="One more step per variant with every allocation recorded (<variant>/memory/; "
                   "`tracekit memory OUT`).")
@click.option("--checkpoint", type=click.Choice(["sync", "async"]), default=None,
              help="Save model and optimizer state with torch.distributed.checkpoint during the timed steps.")
@click.option("--checkpoint-every", type=int, default=5, show_default=True, help="Timed steps between saves.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep OUT/<variant>/ckpt after the run.")
@click.option("--memory-fraction", type=float, default=None,
              help="Limit each rank to this fraction of its GPU's memory (a smaller GPU, for capacity).")
@click.option("--collective-timeout", "collective_timeout_s", type=float, default=600, show_default=True,
              help="Seconds a collective may wait for peers before the variant fails on every rank.")
@click.option("--overwrite", is_flag=True, help="Write into an existing --out.")
@click.option("--strict", is_flag=True, help="Exit 1 when any variant failed (error or oom). Without it the exit "
              "status is 1 only when no variant succeeded; failures are in the manifest either way.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Print the variants side by side at the end (`tracekit report OUT` prints it later).")
@format_option
def profile(out, variants, preset, blocks, hidden, heads, seq, batch, overwrite, strict, report, fmt, **options):
    """Record profiled optimizer steps per variant (one trace per rank) and report them side by side.

    A variant that fails (an exception, out of memory, a worker that dies) is recorded in the
    manifest, one line on stderr, and the next variant runs on fresh workers. Exit status: 0,
    or 1 when no variant succeeded (or, with --strict, when any failed); 2 for bad options."""
    from tracekit.runners.launch import make_config, prepare_out, profile as run_profile, refuse_existing_out

    refuse_existing_out(Path(out), overwrite)
    options["memory"] = options["memory"] == "on"
    cfg = make_config({"out": str(out), "variants": [v.strip() for v in variants.split(",") if v.strip()],
                       "preset": preset, "overrides": {"blocks": blocks, "hidden": hidden, "heads": heads,
                                                       "seq": seq, "batch": batch}, **options})
    prepare_out(Path(out), overwrite)  # every rank under torchrun: each refuses an existing OUT
    manifest = run_profile(cfg)
    if os.environ.get("RANK", "0") != "0":
        return
    traces = " and one trace per rank per variant" if cfg["profile_steps"] else " (no traces: --profile-steps 0)"
    click.echo(f"tracekit profile: wrote {out}/manifest.json{traces}", err=True)
    statuses = [e.get("status") for e in manifest["variants"].values()]
    if report and "ok" in statuses:
        show_report(out, fmt)
    if "ok" not in statuses or (strict and any(s in ("error", "oom") for s in statuses)):
        sys.exit(1)


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="tracekit-capacity", show_default=True,
              help="Output directory: capacity.json and one profile output per probe.")
@click.option("--variants", default="ddp,fsdp1,fsdp2", show_default=True, help="Comma-separated, as for profile.")
@click.option("--presets", default="small,medium,large", show_default=True, help="Comma-separated, smallest first.")
@click.option("--batches", default="1,2,4,8", show_default=True, help="Sequences per rank, comma-separated.")
@click.option("--seq", type=int)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None)
@click.option("--nproc", type=int, default=None)
@click.option("--precision", type=click.Choice(["bf16", "fp32"]), default=None)
@click.option("--memory-fraction", type=float, default=None,
              help="Limit each rank to this fraction of its GPU's memory (a smaller GPU).")
@click.option("--collective-timeout", "collective_timeout_s", type=float, default=600, show_default=True)
@click.option("--overwrite", is_flag=True, help="Write into an existing --out.")
@format_option
def capacity(out, variants, presets, batches, seq, overwrite, fmt, **options):
    """The largest preset and batch each variant trains: out-of-memory is evidence, not a crash."""
    from tracekit.analyses.capacity import capacity_table
    from tracekit.runners.capacity import capacity as run_capacity
    from tracekit.runners.launch import prepare_out

    try:
        sizes = [int(b) for b in batches.split(",")]
    except ValueError:
        raise click.BadParameter("whole numbers, e.g. 1,2,4,8", param_hint="--batches") from None
    prepare_out(Path(out), overwrite)  # every rank under torchrun: each refuses an existing OUT
    defaults = {"seed": 0, "inputs": "fixed", "with_stack": False, "profile_mode": "cupti", "profile_rounds": None,
                "repeats": 1, "compare": "sequential", "rounds": 1, "block_steps": 1, "control": False,
                "checkpoint_every": 5,
                "keep_checkpoints": False, "global_batch": None,
                "overrides": {"blocks": None, "hidden": None, "heads": None, "seq": seq, "batch": None}}
    result = run_capacity({**defaults, **options, "out": str(out),
                           "variants": [v.strip() for v in variants.split(",") if v.strip()]},
                          [p.strip() for p in presets.split(",") if p.strip()], sizes)
    if os.environ.get("RANK", "0") == "0":
        emit(render_frame(capacity_table(result), fmt))
