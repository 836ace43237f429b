"""A program whose subprocess, given the program's own stderr, makes
implicit transfers that JAX logs there (as a forked child would): N of them.
The program itself makes one at the line marked OWN.

    python child_transfers.py N
"""
import os
import subprocess
import sys

import numpy as np

import jax

n = int(sys.argv[1])
jax.jit(lambda x: x + 1)(np.ones(3, np.float32)).block_until_ready()  # OWN
child = ("import numpy as np, jax, jax.numpy as jnp\n"
         f"for _ in range({n}): jnp.sin(np.ones(3, np.float32)).block_until_ready()\n")
env = dict(os.environ, JAX_TRANSFER_GUARD="log", JAX_PLATFORMS="cpu")
env.pop("PYTHONPATH", None)
subprocess.run([sys.executable, "-c", child], env=env, check=True)  # its stderr is ours
print("done", flush=True)
