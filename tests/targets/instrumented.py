"""jaxtop.instrument() from inside a program: idempotent, and stop() undoes it."""
import os
import sys

import jaxtop

fd2_before = os.readlink("/proc/self/fd/2")
h = jaxtop.instrument(interval_s=0.05)
assert jaxtop.instrument() is h
import jax
import jax.numpy as jnp
import numpy as np

levels = {n: getattr(jax.config, n) for n in ("jax_transfer_guard_host_to_device", "jax_transfer_guard_device_to_host")}
assert os.path.exists(h.socket_path)
assert os.readlink("/proc/self/fd/2") != fd2_before  # captured
jax.jit(lambda a: a + 1)(np.ones(3))
print("socket", h.socket_path, "levels", levels, flush=True)
sys.stdin.readline()  # the test connects meanwhile
h.stop()
assert not os.path.exists(h.socket_path)
assert os.readlink("/proc/self/fd/2") == fd2_before
after = {n: getattr(jax.config, n) for n in levels}
assert after == {n: None for n in levels}, after
h2 = jaxtop.instrument()
assert h2 is not h and h2.running
h2.stop()
print("ok", flush=True)
sys.stderr.write("stderr after stop\n")
