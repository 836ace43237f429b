"""One strategy of ``jaxtop demo`` in one variant, run for a few seconds:
what the advisor is judged against (tests/test_advice_programs.py). The
demo's "off" variant is the miss, its "on" variant the fix, at lines of
demo/strategies.py the tests find by reading it.

    python advice_demo.py STRATEGY VARIANT SECONDS [full]

The demo's small sizes unless ``full`` (its sizes for an accelerator, as
``jaxtop demo`` runs them there).

Prints ``ready t=T`` once the variant is compiled and the loop starts (T:
``time.time()``, the clock of the agent's samples, so that the loop can be
told from the start-up in the recording), and ``steps=N`` when it ends.
"""
import sys
import time

import jax

from jaxtop.demo import strategies

name, variant, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
full = sys.argv[4:] == ["full"]
cls = {c.name: c for c in strategies.STRATEGIES}[name]
scale = strategies.Scale.for_backend(jax.default_backend(), small=not full)
device = jax.local_devices()[0]
# Only this strategy is built: the others' arrays and compiles would be
# evidence of misses this run is not about.
errors = []
strategy = cls(scale, device, on_error=errors.append) if cls is strategies.Guard else cls(scale, device)
assert variant in strategy.variants, f"{name} has no variant {variant!r}: {strategy.variants}"
strategy.prepare(variant)
strategy.reset(variant)
print(f"ready t={time.time():.3f}", flush=True)
steps = 0
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    strategy.step(variant)
    steps += 1
strategy.drain(variant)
print(f"steps={steps} errors={len(errors)}", flush=True)
