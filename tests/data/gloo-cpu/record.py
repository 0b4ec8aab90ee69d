"""How rank0/rank1.pt.trace.json.gz were recorded: two CPU processes (gloo), torch 2.13 (CPU),
each step an all_gather and an all_reduce of 1,024 floats, then a little compute; steps 1-2
recorded (run it, then gzip the two files)."""
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

HERE = Path(__file__).parent


def main(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29617")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(1024)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(HERE / f"rank{rank}.pt.trace.json"))) as p:
        for _ in range(3):
            out = [torch.empty(1024) for _ in range(world)]
            dist.all_gather(out, x)
            dist.all_reduce(x)
            (x * 2).sum()
            p.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(main, args=(2,), nprocs=2)
