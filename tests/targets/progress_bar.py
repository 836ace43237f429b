"""A progress bar drawn on stderr with carriage returns, implicit transfers
between its updates, and no newline until the very end (or none at all).

Args (environment): PROGRESS_N steps (default 30); PROGRESS_TQDM=1 draws the
bar with tqdm instead of by hand; PROGRESS_NO_NEWLINE=1 leaves the last
update without a newline.
"""
import os
import sys

import numpy as np

import jax

N = int(os.environ.get("PROGRESS_N", "30"))
f = jax.jit(lambda a, b: a * 2 + b)
x = np.ones((8, 4), np.float32)
y = np.zeros((8, 4), np.float32)

if os.environ.get("PROGRESS_TQDM"):
    from tqdm import tqdm

    # No time-dependent fields, and a redraw on every update, so two runs
    # write the same bytes.
    for i in tqdm(range(N), file=sys.stderr, mininterval=0, miniters=1, bar_format="{n}/{total}", ascii=True):
        f(x, y).block_until_ready()  # two NumPy args: two h2d per call
else:
    for i in range(N):
        sys.stderr.write(f"\rstep {i}/{N} [{'#' * (i * 10 // N):<10}]")
        sys.stderr.flush()
        f(x, y).block_until_ready()
        os.write(2, b"\r%d" % i)  # a partial write that ends in digits
        f(x, y).block_until_ready()
    sys.stderr.write(f"\rstep {N}/{N} [##########]")
    sys.stderr.flush()
if not os.environ.get("PROGRESS_NO_NEWLINE"):
    sys.stderr.write("\n")
print("done", flush=True)
