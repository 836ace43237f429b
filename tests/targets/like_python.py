"""Behaves differently per mode, to compare `python` with `jaxtop run`.

Modes: info (paths, a warning), raise (an uncaught exception), sigint (waits
for Ctrl-C; sigint-jax after a jax computation), chdir (uses __file__ after os.chdir), stderr (writes to stderr,
then to stdout), partial (stderr without newline, then stdout).
"""
import os
import sys
import time
import warnings

mode = sys.argv[1] if len(sys.argv) > 1 else "info"
if mode == "info":
    print(__file__, sys.argv[0], sys.path[0], __name__)
    warnings.warn("careful with that")
elif mode == "raise":
    def inner():
        raise ValueError("boom")
    inner()
elif mode in ("sigint", "sigint-jax"):
    if mode == "sigint-jax":
        import jax.numpy as jnp

        jnp.ones(3).block_until_ready()
    import threading

    # Say "waiting" from another thread once the main thread is asleep, so
    # SIGINT always lands inside the sleep: the traceback (line and carets)
    # is then the same in every run.
    threading.Timer(0.3, lambda: print("waiting", flush=True)).start()
    time.sleep(60)
elif mode == "chdir":
    os.chdir("/")
    with open(__file__) as f:
        print(f.readline().strip())
elif mode == "stderr":
    print("to stderr", file=sys.stderr)
    print("to stdout")
elif mode == "partial":
    sys.stderr.write("partial")
    print("to stdout")
