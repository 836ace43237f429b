"""Generated code: N functions made with exec, each with a file name of its
own, each calling a jitted function once, then dropped.

    python generated_code.py N [host|device] [SECONDS]

With SECONDS, it goes on past N functions until that many seconds have
passed (a test of what happens after some seconds then does not depend on
how fast this machine makes N).

``host`` (the default): the call passes a NumPy value, one implicit transfer
at a line of its own file. ``device``: a device array, no transfer (the
call is still noted, its line never needed).

Prints ``rss_mb=R seconds=S alive=A`` at the end: RSS after the loop, and
how many of the N functions' code objects are still alive 1 s after it
(nothing of the program keeps them: plain Python has 0).
"""
import gc
import sys
import time
import weakref

import numpy as np

import jax

n = int(sys.argv[1])
where = sys.argv[2] if len(sys.argv) > 2 else "host"
at_least_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
step = jax.jit(lambda x: x + 1)
value = np.ones(4, np.float32) if where == "host" else jax.numpy.ones(4, np.float32)
step(value).block_until_ready()
codes = []
t0 = time.monotonic()
i = 0
while i < n or time.monotonic() - t0 < at_least_s:
    namespace = {"step": step, "value": value}
    code = compile(f"def gen_{i}():\n    return step(value)\n", f"<generated {i}>", "exec")
    exec(code, namespace)
    namespace[f"gen_{i}"]()
    codes.append(weakref.ref(namespace[f"gen_{i}"].__code__))
    i += 1
seconds = time.monotonic() - t0
del namespace, code
with open("/proc/self/statm") as f:
    rss = int(f.read().split()[1]) * 4096
time.sleep(1.0)
gc.collect()
alive = sum(ref() is not None for ref in codes)
print(f"rss_mb={rss / 2**20:.0f} seconds={seconds:.1f} functions={i} alive={alive}", flush=True)
