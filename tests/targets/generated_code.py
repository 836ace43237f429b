"""Generated code: N functions made with exec, each with a file name of its
own, each calling a jitted function once with a NumPy value (one implicit
transfer at a line of its own file).

    python generated_code.py N

Prints ``rss_mb=R seconds=S`` at the end (RSS after the loop).
"""
import sys
import time

import numpy as np

import jax

n = int(sys.argv[1])
step = jax.jit(lambda x: x + 1)
value = np.ones(4, np.float32)
step(value).block_until_ready()
t0 = time.monotonic()
for i in range(n):
    namespace = {"step": step, "value": value}
    code = compile(f"def gen_{i}():\n    return step(value)\n", f"<generated {i}>", "exec")
    exec(code, namespace)
    namespace[f"gen_{i}"]()
with open("/proc/self/statm") as f:
    rss = int(f.read().split()[1]) * 4096
print(f"rss_mb={rss / 2**20:.0f} seconds={time.monotonic() - t0:.1f}", flush=True)
