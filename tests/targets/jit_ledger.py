"""Three jitted functions of known sizes; ``step`` compiles for three shapes, then a new dtype.

Modes (the first argument):

* ``run``: the workload. Under ``jaxtop run`` the agent keeps the ledger; with
  ``--inprocess LOG`` the script instruments itself and adds the ledger with
  public APIs only (``register_sample_field``/``register_command``).
* ``expect``: prints one JSON line: ``lower(...).compile().memory_analysis()``
  of every call of the workload, computed apart from it (compiling here again
  must not touch the ledger of the run under test).

``--user-explain`` turns ``jax_explain_cache_misses`` on after ``import jax``,
as a program would. Each call stands on a line of its own, marked ``# call:``,
so a test can find the call sites.
"""
import json
import logging
import sys
import time

import numpy as np

INPROCESS = "--inprocess" in sys.argv
if INPROCESS:
    import jaxtop

    handle = jaxtop.instrument(interval_s=0.05, log_path=sys.argv[sys.argv.index("--inprocess") + 1])

import jax
import jax.numpy as jnp

if INPROCESS:
    from jaxtop.probes.executables import JitLedgerProbe

    probe = JitLedgerProbe(interval_s=0.2, full_every_s=1.0)
    probe.start()
    final: list[int] = []
    # The agent's last sample at exit forces a pass and a whole table; here
    # the script asks for the same before it ends.
    handle.agent.register_sample_field("jit", lambda: probe.sample(force=bool(final), full=bool(final)))
    handle.agent.register_command("jit_ledger", probe.command)

if "--user-explain" in sys.argv:
    jax.config.update("jax_explain_cache_misses", True)


def matmul(a, b):
    return jnp.tanh(a @ b).sum(axis=0) + (a.T @ a).sum()


def sort_rows(x):
    return jnp.sort(x, axis=-1) * 2 + jnp.cumsum(x, axis=0)


def step(x):
    return jnp.tanh(x @ x.T).sum(axis=1)


def ones(shape, dtype=np.float32):
    return np.ones(shape, dtype)


#: (function, argument shapes and dtypes) of every call, in order.
CALLS = [
    ("matmul", [((128, 64), "float32"), ((64, 32), "float32")]),
    ("sort_rows", [((256, 256), "float32")]),
    ("step", [((100, 64), "float32")]),
    ("step", [((200, 64), "float32")]),
    ("step", [((300, 64), "float32")]),
    ("step", [((300, 64), "float16")]),
]


def expect() -> None:
    out = []
    for name, shapes in CALLS:
        args = [ones(s, np.dtype(d)) for s, d in shapes]
        m = jax.jit(globals()[name]).lower(*args).compile().memory_analysis()
        out.append({"name": name, "shapes": shapes, "argument_bytes": m.argument_size_in_bytes,
                    "output_bytes": m.output_size_in_bytes, "alias_bytes": m.alias_size_in_bytes,
                    "temp_bytes": m.temp_size_in_bytes, "code_bytes": m.generated_code_size_in_bytes})
    print(json.dumps(out), flush=True)


def run() -> None:
    # A program's own logging: with it, root has a handler that any record
    # jaxtop caused would reach if it were not kept away.
    logging.warning("user log line before the compiles")
    jmatmul, jsort, jstep = jax.jit(matmul), jax.jit(sort_rows), jax.jit(step)
    jmatmul(ones((128, 64)), ones((64, 32))).block_until_ready()  # call:matmul
    jsort(ones((256, 256))).block_until_ready()  # call:sort_rows
    jstep(ones((100, 64))).block_until_ready()  # call:step:0
    jstep(ones((200, 64))).block_until_ready()  # call:step:1
    jstep(ones((300, 64))).block_until_ready()  # call:step:2
    jstep(ones((300, 64), np.float16)).block_until_ready()  # call:step:3
    jstep(ones((200, 64))).block_until_ready()  # cached: no compile
    sys.stderr.write("user stderr line after the compiles\n")
    if "--user-explain" in sys.argv:
        print("explain", jax.config.jax_explain_cache_misses, flush=True)  # still the program's choice
    if INPROCESS:
        final.append(1)
        time.sleep(0.5)


if __name__ == "__main__":
    expect() if sys.argv[1] == "expect" else run()
