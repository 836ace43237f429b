"""A program whose own objects would misbehave if jaxtop's agent ran them on
its thread: a jitted callable object whose ``__eq__`` and ``__hash__`` raise
off the main thread and whose ``__signature__`` sleeps 30 s there, a plain jitted
step beside it, and dict keys whose ``__repr__`` counts its calls. Each
step passes host values to both (implicit transfers at the lines marked
HOSTILE and PLAIN).

    python hostile_callables.py SECONDS

Prints ``reprs=N steps=M`` at the end: the keys' ``__repr__`` calls (jax
makes one or two when it first traces the call; the program none).
"""
import sys
import threading
import time

import numpy as np

import jax

MAIN = threading.main_thread()
REPRS = [0]


class Hostile:
    def __call__(self, x, batch):
        return x + batch[Key("a")]

    def __eq__(self, other):
        if threading.current_thread() is not MAIN:
            raise RuntimeError("hostile eq")
        return self is other

    def __hash__(self):
        if threading.current_thread() is not MAIN:
            raise RuntimeError("hostile hash")
        return 7

    @property
    def __signature__(self):
        if threading.current_thread() is not MAIN:
            time.sleep(30)
        raise AttributeError("__signature__")  # jax's own look (on the main thread) finds none


class Key:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        REPRS[0] += 1
        return f"Key({self.name!r})"

    def __eq__(self, other):
        return isinstance(other, Key) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


seconds = float(sys.argv[1])
hostile = jax.jit(Hostile())
plain = jax.jit(lambda x, y: x * y)
x = jax.numpy.ones(4)
steps = 0
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    batch = {Key("a"): np.ones(4, np.float32)}
    hostile(x, batch).block_until_ready()  # HOSTILE
    plain(x, np.full(4, 2.0, np.float32)).block_until_ready()  # PLAIN
    steps += 1
    time.sleep(0.002)
print(f"reprs={REPRS[0]} steps={steps}", flush=True)
