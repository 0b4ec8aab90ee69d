"""What a host gives N processes at once (`host_share.sh`): a fixed piece of work after a start
signal file appears; prints its seconds. cpu: a pure-Python loop (no memory traffic); mem: numpy
copies of a 256 MB array (memory bandwidth)."""
import os
import sys
import time

kind, go = sys.argv[1], sys.argv[2]
if kind == "mem":
    import numpy as np
    a = np.ones(32 << 20)  # 256 MB, touched
    b = np.empty_like(a)
    np.copyto(b, a)
while not os.path.exists(go):
    time.sleep(0.001)
t = time.perf_counter()
if kind == "cpu":
    s = 0
    for i in range(20_000_000):
        s += i
else:
    for _ in range(8):
        np.copyto(b, a)
print(f"{time.perf_counter() - t:.3f}")
