import sys

import jax.numpy as jnp

a = jnp.ones(4) + 1
mode = sys.argv[1] if len(sys.argv) > 1 else "raise"
print("argv", sys.argv, "name", __name__, flush=True)
if mode == "raise":
    def inner():
        raise ValueError("boom from the user's program")
    inner()
elif mode == "exit":
    sys.exit(7)
