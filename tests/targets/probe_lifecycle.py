"""Start every probe of the agent through its list, use them, stop them, and
print what the program's world looked like before and after (JSON).

Run as a script by tests/test_probe_list.py: a fresh interpreter, so that
nothing another test installed is mistaken for something left behind.
"""

import json
import logging
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np


def world() -> dict:
    """Everything a probe may change in the program, by identity."""
    from jax._src import monitoring
    from jax._src.array import ArrayImpl

    from jaxtop.agent import labels
    from jaxtop.probes import compile_events
    from jaxtop.probes.cache_misses import MISS_LOGGERS, PERSISTENT_CACHE_LOGGERS
    from jaxtop.probes.donation import _EMITTERS
    from jaxtop.probes.oom.exceptions import error_classes

    loggers = ("jax", *MISS_LOGGERS, *PERSISTENT_CACHE_LOGGERS)
    fd2 = os.fstat(2)
    return {
        "excepthook": id(sys.excepthook),
        "threading.excepthook": id(threading.excepthook),
        "ArrayImpl": {k: id(v) for k, v in vars(ArrayImpl).items()},
        "numpy": {k: id(getattr(np, k)) for k in dir(np) if not k.startswith("_")},
        "monitoring": {name: [id(f) for f in value] for name, value in sorted(vars(monitoring).items())
                       if name.endswith("listeners") and isinstance(value, list)},
        "loggers": {n: [logging.getLogger(n).level, [id(f) for f in logging.getLogger(n).filters]] for n in loggers},
        "config": {k: str(getattr(jax.config, k, None)) for k in (
            "jax_explain_cache_misses", "jax_transfer_guard_host_to_device", "jax_transfer_guard_device_to_host",
            "jax_transfer_guard_device_to_device", "jax_logging_level")},
        "errors": {c.__qualname__: id(c.__init__) for c in error_classes()},
        "donation": {m: id(getattr(sys.modules[m], "warnings", None)) for m in _EMITTERS if m in sys.modules},
        "fd2": [fd2.st_dev, fd2.st_ino],
        "compile_subscribers": {k: len(compile_events.subscribers(k)) for k in (compile_events.DURATION, compile_events.EVENT)},
        "labels_attached": labels._agent_ref is not None,
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("jaxtop")),
    }


jnp.zeros(4).block_until_ready()  # a backend, before the agent exists
before = world()

import jaxtop  # noqa: E402
from jaxtop.probes.base import Probe  # noqa: E402

handle = jaxtop.instrument(interval_s=0.05, slow_interval_s=0.2)
agent = handle.agent
probes = list(agent.probes)

# Use every probe: a compile, a host read, a transfer, a donation, a label.
f = jax.jit(lambda x: x * 2, donate_argnums=0)
x = f(jnp.arange(1000.0))
float(x[0])
y = jnp.asarray(np.ones(8)) + 1
jaxtop.label("x", x)
seen: set = set()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    time.sleep(0.1)
    for line in agent.recent_lines(50):
        record = json.loads(line)
        if record.get("type") == "sample":
            seen.update(record)
    if {"devices", "transfers", "transfer_capture", "process", "compile", "donation", "jit",
        "host_syncs", "labels"} <= seen:
        break
started = {p.name: getattr(p, "reason", None) for p in probes}
during = world()
handle.stop()
time.sleep(0.2)
after = world()
print(json.dumps({
    "probes": [p.name for p in probes],
    "conform": {p.name: isinstance(p, Probe) and isinstance(getattr(p, "needs_jax", None), bool) for p in probes},
    "reasons": started,
    "fields": sorted(seen),
    "changed_during": sorted(k for k in before if before[k] != during[k]),
    "before": before,
    "after": after,
}))
