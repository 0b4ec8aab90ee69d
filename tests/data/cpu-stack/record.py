import torch
from torch.profiler import profile, ProfilerActivity, schedule
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def train_step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=schedule(wait=0, warmup=1, active=1),
             on_trace_ready=lambda p: p.export_chrome_trace("cpu_stack.json")) as prof:
    for _ in range(2):
        train_step()
        prof.step()
