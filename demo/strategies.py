"""The ten memory strategies, each a pair (or triple) of variants compiled
up front, so flipping one changes only what it is about.

What a strategy exposes, and the sizes it runs at, are in
:mod:`jaxtop.demo.base`.
"""

from __future__ import annotations

import collections
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

# Scale, Metric and Strategy are importable from here, as before they had a
# module of their own.
from jaxtop.demo.base import TIMING_CAVEAT, Metric, Scale, Strategy  # noqa: F401
from jaxtop.demo.base import analysis as _analysis
from jaxtop.probes.buffer_detail import MIN_HOLE_BUFFER, hole_ratio


class Placement(Strategy):
    name = "placement"
    title = "explicit device_put"
    about = "NumPy batches fed to a jitted step (an implicit host-to-device copy every step) vs data placed with device_put and prefetched one step ahead."
    metrics = (Metric("h2d_per_step", "implicit h2d transfers/step", "count", "zero", short="implicit h2d/step",
                      caveat="a copy was still implicit"),
               Metric("step_s", "step time", "s", "", short="step"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        rng = np.random.default_rng(0)
        self.batches = [rng.standard_normal((scale.batch, scale.width), dtype=np.float32) for _ in range(8)]
        self.w = jax.device_put(jnp.ones((scale.width, scale.width), jnp.float32) * 0.01, device)
        self.fn = jax.jit(lambda w, x: jnp.tanh(x @ w).sum(axis=0))
        self.i = 0
        self.next_dev = None

    def prepare(self, variant: str) -> None:
        self.fn(self.w, jax.device_put(self.batches[0], self.device)).block_until_ready()

    def step(self, variant: str) -> None:
        self.i += 1
        batch = self.batches[self.i % len(self.batches)]
        if variant == "off":
            out = self.fn(self.w, batch)  # NumPy argument: implicit transfer
        else:
            current = self.next_dev if self.next_dev is not None else jax.device_put(batch, self.device)
            # Prefetch: start the next explicit copy before computing this step.
            self.next_dev = jax.device_put(self.batches[(self.i + 1) % len(self.batches)], self.device)
            out = self.fn(self.w, current)
        out.block_until_ready()


class Donation(Strategy):
    name = "donation"
    title = "buffer donation"
    about = "A state update without vs with donate_argnums: with donation XLA writes the new state into the old buffer (alias) instead of allocating another."
    metrics = (Metric("alias_size_in_bytes", "aliased (reused) bytes", "bytes", "up", short="aliased",
                      caveat="XLA could not alias the buffer"),
               Metric("new_output_bytes", "new output bytes/step", "bytes", "zero", short="new out/step",
                      caveat="XLA could not alias the buffer"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        self.state = jax.device_put(jnp.zeros((scale.state_elems,), jnp.float32), device)
        self.grad = jax.device_put(jnp.full((scale.state_elems,), 1e-3, jnp.float32), device)
        update = lambda s, g: s - 0.1 * g
        self.fns = {"off": jax.jit(update), "on": jax.jit(update, donate_argnums=0)}

    def prepare(self, variant: str) -> None:
        # Compiled by its first call, as a program's step is: the jit ledger
        # then names the step's line as the one that compiled it (the
        # advisor looks there for the outputs it keeps). The analysis below
        # finds that executable in jax's cache.
        self.step(variant)
        compiled = self.fns[variant].lower(self.state, self.grad).compile()
        a = _analysis(compiled)
        if a.get("output_size_in_bytes") is not None and a.get("alias_size_in_bytes") is not None:
            a["new_output_bytes"] = a["output_size_in_bytes"] - a["alias_size_in_bytes"]
        self._static[variant] = a

    def step(self, variant: str) -> None:
        self.state = self.fns[variant](self.state, self.grad)
        self.state.block_until_ready()


class InPlace(Strategy):
    name = "inplace"
    title = "in-place update"
    about = "Growing a buffer by concatenation (a new, larger array and a recompile for every new shape) vs writing rows into a preallocated, donated buffer with lax.dynamic_update_slice."
    metrics = (Metric("alloc_bytes_per_step", "bytes allocated/step", "bytes", "down", short="alloc/step",
                      caveat="the preallocated buffer was copied"),
               Metric("compiles_per_step", "compiles/step", "count", "zero", short="compiles/step",
                      caveat="a compile came from elsewhere"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        w = scale.width
        self.row = jax.device_put(jnp.ones((1, w), jnp.float32), device)
        self.buf = jax.device_put(jnp.zeros((scale.grow_rows, w), jnp.float32), device)
        self.index = jax.device_put(jnp.zeros((), jnp.int32), device)
        self._restart_growth()

        def write(buf, row, i):
            buf = lax.dynamic_update_slice(buf, row, (i % buf.shape[0], 0))
            return buf, i + 1

        self.write = jax.jit(write, donate_argnums=(0, 2))
        self.allocated_bytes = 0  # bytes of new buffers the "off" variant made

    def _restart_growth(self) -> None:
        # A buffer that grows without end meets a new shape at every step. The
        # demo's buffer starts again at one row to stay bounded, and with a
        # new jitted function each time: the jit cache of the previous round
        # would otherwise hide the compiles after the first grow_rows steps,
        # and what was measured would depend on how long the demo had run.
        self.grown = jax.device_put(jnp.zeros((1, self.scale.width), jnp.float32), self.device)
        self.concat = jax.jit(lambda b, r: jnp.concatenate([b, r], axis=0))

    def prepare(self, variant: str) -> None:
        if variant == "on":
            self.buf, self.index = self.write(self.buf, self.row, self.index)
            a = _analysis(self.write.lower(self.buf, self.row, self.index).compile())
            self._static["on"] = {"alloc_bytes_per_step": (a.get("output_size_in_bytes") or 0) - (a.get("alias_size_in_bytes") or 0)}

    def reset(self, variant: str) -> None:
        self._restart_growth()

    def step(self, variant: str) -> None:
        if variant == "off":
            if self.grown.shape[0] >= self.scale.grow_rows:
                self._restart_growth()
            self.grown = self.concat(self.grown, self.row)  # new shape: new executable, new buffer
            self.grown.block_until_ready()
            self.allocated_bytes += int(self.grown.nbytes)
        else:
            self.buf, self.index = self.write(self.buf, self.row, self.index)
            self.buf.block_until_ready()


class Batching(Strategy):
    name = "batching"
    title = "batching"
    about = "One jitted call per item (a dispatch and a host-to-device copy each) vs one call on the whole batch."
    metrics = (Metric("h2d_per_step", "implicit h2d transfers/step", "count", "down", short="implicit h2d/step",
                      caveat="the guard's log lines were not counted"),
               Metric("dispatches_per_step", "dispatches/step", "count", "down", short="dispatches/step"),
               Metric("step_s", "step time", "s", "down", short="step", caveat=TIMING_CAVEAT))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        rng = np.random.default_rng(1)
        self.items = rng.standard_normal((scale.items, scale.width), dtype=np.float32)
        self.w = jax.device_put(jnp.ones((scale.width, scale.width), jnp.float32) * 0.01, device)
        self.one = jax.jit(lambda w, x: jnp.tanh(x @ w))
        self.many = jax.jit(lambda w, xs: jnp.tanh(xs @ w))

    def prepare(self, variant: str) -> None:
        if variant == "off":
            self.one(self.w, self.items[0]).block_until_ready()
            self._static["off"] = {"dispatches_per_step": self.scale.items}
        else:
            self.many(self.w, self.items).block_until_ready()
            self._static["on"] = {"dispatches_per_step": 1}

    def step(self, variant: str) -> None:
        if variant == "off":
            outs = [self.one(self.w, item) for item in self.items]
            # Every item's output: the last one being ready says nothing of
            # the others where the device runs calls out of order.
            jax.block_until_ready(outs)
        else:
            self.many(self.w, self.items).block_until_ready()


def _mlp(w: Any, x: Any) -> Any:
    h = jnp.tanh(x @ w)
    h = h * 0.5 + 0.1
    h = jnp.maximum(h, 0.0)
    h = h @ w.T
    h = jnp.exp(-h * h)
    return (h - h.mean()) / (h.std() + 1e-6)


class Jit(Strategy):
    name = "jit"
    title = "jax.jit"
    about = "The same function run eagerly, op by op (one dispatch and one output buffer per primitive), vs compiled as one XLA program."
    metrics = (Metric("buffers_per_step", "output buffers/step", "count", "down", short="buffers/step"),
               Metric("step_s", "step time", "s", "down", short="step", caveat=TIMING_CAVEAT))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        self.w = jax.device_put(jnp.ones((scale.width, scale.width), jnp.float32) * 0.01, device)
        self.x = jax.device_put(jnp.ones((scale.batch, scale.width), jnp.float32), device)
        self.jitted = jax.jit(_mlp)

    def prepare(self, variant: str) -> None:
        if variant == "off":
            _mlp(self.w, self.x).block_until_ready()
            # Eager mode dispatches each operation of the jaxpr on its own
            # (jnp.mean and jnp.std are jitted functions: one operation
            # each) and materialises each result as a device buffer, on
            # every backend. The runner uses the allocator's own count
            # instead where memory_stats() counts the allocations made.
            eqns = jax.make_jaxpr(_mlp)(self.w, self.x).jaxpr.eqns
            self._static["off"] = {"buffers_per_step": sum(len(e.outvars) for e in eqns)}
        else:
            self.jitted(self.w, self.x).block_until_ready()
            # One executable: its outputs are the only buffers left to the program.
            self._static["on"] = {"buffers_per_step": len(jax.tree_util.tree_leaves(jax.eval_shape(_mlp, self.w, self.x)))}

    def step(self, variant: str) -> None:
        fn = _mlp if variant == "off" else self.jitted
        fn(self.w, self.x).block_until_ready()


class Guard(Strategy):
    name = "guard"
    title = "transfer guard"
    variants = ("allow", "log", "disallow")
    about = "The loop makes one implicit host-to-device copy per step. allow: silent; log: every copy logged (and counted); disallow: the copy raises, the loop catches it and goes on."
    metrics = (Metric("h2d_per_step", "logged implicit h2d/step", "count", "up", pair=("allow", "log"),
                      short="logged h2d/step", caveat="the guard's log lines were not counted"),
               Metric("errors_per_step", "refused transfers/step", "count", "up", pair=("log", "disallow"),
                      short="refused/step", caveat="the guard let the copy through"))

    def __init__(self, scale: Scale, device: Any, on_error: Callable[[str], None] | None = None) -> None:
        super().__init__(scale, device)
        self.x = np.ones((scale.batch, scale.width), np.float32)
        self.fn = jax.jit(lambda x: x.sum())
        self.errors = 0
        self.on_error = on_error

    def prepare(self, variant: str) -> None:
        self.fn(jax.device_put(self.x, self.device)).block_until_ready()

    def step(self, variant: str) -> None:
        with jax.transfer_guard_host_to_device(variant):
            try:
                self.fn(self.x).block_until_ready()
            except Exception as exc:  # JaxRuntimeError, a RuntimeError subclass
                self.errors += 1
                if self.on_error is not None:
                    self.on_error(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


class Checkpointing(Strategy):
    name = "checkpointing"
    title = "gradient checkpointing"
    about = "Gradient of a lax.scan over layers without vs with jax.checkpoint on the body: the backward pass recomputes activations instead of storing them."
    metrics = (Metric("temp_size_in_bytes", "XLA temp bytes", "bytes", "down", short="temp",
                      caveat="XLA kept the activations"),
               Metric("step_s", "step time", "s", "", short="step"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        self.ws = jax.device_put(jnp.ones((scale.layers, scale.width, scale.width), jnp.float32) * 0.01, device)
        self.x = jax.device_put(jnp.ones((scale.batch * 4, scale.width), jnp.float32), device)

        self.fns = {v: self._make(v) for v in self.variants}

    @staticmethod
    def _make(variant: str) -> Any:
        def body(c, w):
            return jnp.tanh(c @ w), None

        b = jax.checkpoint(body) if variant == "on" else body

        def loss(ws, x):
            c, _ = lax.scan(b, x, ws)
            return jnp.sum(c)

        return jax.jit(jax.grad(loss))

    def prepare(self, variant: str) -> None:
        # Compiled by its first call, as a program's step is (the jit ledger
        # then names the step's line); the analysis finds it in jax's cache.
        self.step(variant)
        self._static[variant] = _analysis(self.fns[variant].lower(self.ws, self.x).compile())
        # Then released: a jitted function's executables live as long as it
        # does, and a variant compiled but not running would keep OFF's
        # stored activations in the jit ledger (and the advisor's
        # checkpointing advice on them) while the demo idles. A
        # measurement's first, unmeasured step compiles it again.
        self.fns[variant] = self._make(variant)

    def reset(self, variant: str) -> None:
        # Only the variant that runs is compiled: switching to ON releases
        # OFF's executable, and the advice on it leaves with it.
        for other in self.variants:
            if other != variant:
                self.fns[other] = self._make(other)

    def step(self, variant: str) -> None:
        self.fns[variant](self.ws, self.x).block_until_ready()


class Fragmentation(Strategy):
    name = "fragmentation"
    title = "fragmentation"
    about = "Interleaved allocation and release of mixed sizes (holes between live buffers) vs uniform buffers allocated and released as a batch."
    metrics = (Metric("fragmentation", "allocator fragmentation", "ratio", "down", short="allocator frag",
                      caveat="other allocations took the freed space"),
               Metric("gap_ratio", "holes among the demo's buffers", "ratio", "down", short="holes",
                      caveat="other allocations took the freed space"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        # Every allocation and release of this strategy runs on a thread of
        # its own. On CPU, malloc gives each thread its own arena: the demo's
        # buffers are then placed among themselves, not in the holes that the
        # other strategies left in the main thread's heap, and what is
        # measured is this strategy's pattern. (A GPU allocator is one pool
        # per device whatever the thread.)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxtop-demo-fragmentation")
        self.live: list[Any] = []
        # One jitted function, the size static: one executable per size. (Four
        # lambdas made on one line would be four functions that jax cannot
        # tell from a closure re-made in a loop.)
        make = jax.jit(lambda x, n: jnp.zeros((n,), jnp.float32) + x, static_argnames=("n",))
        self.make = {n: functools.partial(make, n=n) for n in (256, 4096, 65536, 262144)}
        self.uniform_n = 65536
        self.scalar = jax.device_put(jnp.zeros((), jnp.float32), device)
        self.rng = np.random.default_rng(2)
        self.holes_reason: str | None = None  # why the last reading has no holes figure
        self._readings: list[float | None] = []  # the holes after each step of the current block

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._thread.submit(fn, *args).result()

    def prepare(self, variant: str) -> None:
        self._run(lambda: [fn(self.scalar).block_until_ready() for fn in self.make.values()])

    def reset(self, variant: str) -> None:
        self._run(self._reset, variant)

    def _reset(self, variant: str) -> None:
        self._release(self.live)
        self.live = []
        self._readings = []
        self.rng = np.random.default_rng(2)  # the same sizes and frees in every measurement
        if variant == "off":
            # Compared when each variant holds a full set of buffers, in its
            # steady state: the mixed one starts full (filling it takes
            # frag_buffers / 4 steps: 64 on an accelerator, more than a
            # measurement's 31, and its holes were never read on a TPU), and
            # with each of its buffers replaced about once. Without that
            # turnover the holes grow through the measurement as the frees
            # begin (26% → 45% → 52% over three blocks at --small sizes),
            # and that drift would be taken for spread.
            while len(self.live) < self.scale.frag_buffers:
                self._allocate_mixed()
            for _ in range(self.scale.frag_buffers // 4):
                self._mixed_step()

    @staticmethod
    def _release(buffers: list[Any]) -> None:
        # Free now, not when the garbage collector or the runtime gets to it:
        # what the next allocations find must not depend on that timing.
        for a in buffers:
            try:
                a.delete()
            except Exception:
                pass

    def _allocate_mixed(self) -> None:
        sizes = list(self.make)
        for _ in range(4):
            n = sizes[int(self.rng.integers(len(sizes)))]
            self.live.append(self.make[n](self.scalar))

    def _mixed_step(self) -> None:
        self._allocate_mixed()
        while len(self.live) > self.scale.frag_buffers:  # free random old buffers: holes appear
            self._release([self.live.pop(int(self.rng.integers(len(self.live))))])

    def step(self, variant: str) -> None:
        self._run(self._step, variant)

    def _step(self, variant: str) -> None:
        if variant == "off":
            self._mixed_step()
        else:
            # The step's buffers live and die together: the last step's batch
            # goes as a whole, and the new one can take its place.
            self._release(self.live)
            self.live = [self.make[self.uniform_n](self.scalar) for _ in range(self.scale.frag_buffers)]
        # All of them: with asynchronous dispatch the last one being ready
        # says nothing of the others.
        jax.block_until_ready(self.live)
        self._readings.append(self._holes())

    def block_metrics(self, variant: str) -> dict[str, Any]:
        """The holes of the block: the mean of a reading after each of its
        steps. One reading swings widely with where the last few buffers
        landed (at --small sizes from 9% to 56% between runs of the mixed
        variant); the mean over a block is what a change must beat."""
        readings, self._readings = [r for r in self._readings if r is not None], []
        return {"gap_ratio": sum(readings) / len(readings) if readings else None}

    def _holes(self) -> float | None:
        """:func:`hole_ratio` of the demo's own live buffers (a full set
        after every step); None with :attr:`holes_reason` saying why."""
        # An address is asked of finished buffers only: one still being
        # computed has none to give yet on an accelerator.
        jax.block_until_ready(self.live)
        spans, error = [], None
        for a in self.live:
            try:
                spans.append((a.unsafe_buffer_pointer(), a.nbytes))
            except Exception as exc:
                error = error or exc
        ratio = hole_ratio(spans)
        if ratio is not None:
            self.holes_reason = None
        elif not spans:
            why = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}" if error else "no buffers"
            self.holes_reason = f"unsafe_buffer_pointer() gave no address on {self.device.platform} ({why})"
        else:
            self.holes_reason = (f"{len(spans)} addresses, fewer than two of them of buffers of "
                                 f"{MIN_HOLE_BUFFER >> 10} KiB or more")
        return ratio


class Profiling(Strategy):
    name = "profiling"
    title = "memory profiling"
    variants = ("snapshot",)
    about = "jax.profiler.device_memory_profile() on demand: a pprof file with a Python stack per live allocation; the top allocation site in this demo's code is shown."
    metrics = (Metric("profile_bytes", "bytes in the profile", "bytes", "saved", short="profile"),
               Metric("profile_s", "time to take it", "s", "", short="took"))

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        self.keep = [jax.device_put(jnp.ones((scale.width, scale.width), jnp.float32), device)]

    def step(self, variant: str) -> None:
        time.sleep(0.01)  # nothing to run: the snapshot is an action


#: Steps between two waits in the run-ahead strategy's "off" variant: a
#: loop that reads its loss every 10 steps (as the TPU recording's did).
RUN_AHEAD_SYNC = 10


class RunAhead(Strategy):
    name = "runahead"
    title = "bounded run-ahead"
    about = (f"An MLP training loop (no donation) that waits for the device only every {RUN_AHEAD_SYNC} steps vs one "
             "that waits for each step's output with block_until_ready: with asynchronous dispatch the loop runs "
             "steps ahead of the device, and each queued step holds its inputs, outputs and temporaries.")
    metrics = (Metric("held_bytes", "in use beyond live arrays (peak)", "bytes", "down", short="beyond live",
                      caveat="the device kept up with the loop"),
               Metric("queued_steps", "steps queued on the device (peak)", "count", "down", short="queued",
                      caveat="the device kept up with the loop"),
               Metric("step_s", "step time", "s", "", short="step"))
    block_reduce = {"held_bytes": max, "queued_steps": max}
    # The runner waits for the device at the end of each block: a shorter
    # block would bound the run-ahead, not the variant.
    min_block_steps = RUN_AHEAD_SYNC

    def __init__(self, scale: Scale, device: Any) -> None:
        super().__init__(scale, device)
        w = scale.width
        # The starting parameters, kept: every measurement starts from them.
        # (Drawn with NumPy: jax.random would compile a few programs at
        # start-up, half a second on a 2-core CPU.)
        rng = np.random.default_rng(3)
        self.start = [jax.device_put(rng.standard_normal((w, w), dtype=np.float32) / np.float32(np.sqrt(w)), device)
                      for _ in range(scale.runahead_layers)]
        self.x = jax.device_put(jnp.ones((scale.runahead_rows, w), jnp.float32), device)

        def loss(params, x):
            h = x
            for p in params:
                h = jnp.tanh(h @ p)
            return jnp.mean(h * h)

        def train_step(params, x):
            value, grads = jax.value_and_grad(loss)(params, x)
            return [p - 0.01 * g for p, g in zip(params, grads)], value

        # No donation: each step's new parameters are new buffers, and the
        # old ones stay allocated until the step that reads them has run.
        self.fn = jax.jit(train_step)
        self.params = self.start
        self.queued: collections.deque = collections.deque()  # losses of steps not known to be done
        self.since_wait = 0  # steps dispatched since the loop last waited for the device
        self._peaks: dict[str, Any] = {}
        self.held_reason: str | None = None

    def prepare(self, variant: str) -> None:
        jax.block_until_ready(self.fn(self.start, self.x))

    def reset(self, variant: str) -> None:
        self.drain(variant)
        self.params = self.start
        self._peaks = {}

    def step(self, variant: str) -> None:
        self.params, value = self.fn(self.params, self.x)
        self.since_wait += 1
        # Read right after the dispatch, before any wait: what the loop has
        # queued now. A loss is a scalar of the step's own executable: it is
        # ready when the step is done, and keeping it costs 4 bytes (keeping
        # the parameters would keep their buffers).
        self.queued.append(value)
        while self.queued and self.queued[0].is_ready():
            self.queued.popleft()
        self._peak("queued_steps", len(self.queued))
        held = self._held_bytes()
        if held is not None:
            self._peak("held_bytes", held)
        if variant == "on" or self.since_wait >= RUN_AHEAD_SYNC:
            self.drain(variant)

    def drain(self, variant: str) -> None:
        jax.block_until_ready(self.params)
        self.queued.clear()
        self.since_wait = 0

    def _peak(self, key: str, value: Any) -> None:
        old = self._peaks.get(key)
        self._peaks[key] = value if old is None else max(old, value)

    def _held_bytes(self) -> int | None:
        """Device bytes in use that no live array of this device accounts
        for: what queued steps hold (inputs the program dropped, outputs,
        temporaries). None with :attr:`held_reason` where the allocator does
        not tell bytes in use."""
        try:
            stats = self.device.memory_stats()
        except Exception as exc:
            stats, error = None, exc
        else:
            error = None
        in_use = (stats or {}).get("bytes_in_use")
        if in_use is None or in_use < 0:
            if stats is None:
                self.held_reason = (f"memory_stats() is None on {self.device.platform} backend"
                                    + (f" ({type(error).__name__})" if error else "")
                                    + ": no device bytes in use to set against the live arrays")
            else:
                self.held_reason = "memory_stats() has no bytes_in_use"
            return None
        live = 0
        # Without waiting: an array's size is known before its buffer is computed.
        for a in jax.live_arrays():
            try:
                devices = a.sharding.device_set
                if len(devices) == 1 and self.device in devices:
                    live += a.nbytes
            except Exception:
                continue
        self.held_reason = None
        return in_use - live

    def block_metrics(self, variant: str) -> dict[str, Any]:
        peaks, self._peaks = self._peaks, {}
        return {"queued_steps": peaks.get("queued_steps"), "held_bytes": peaks.get("held_bytes")}


#: Every strategy, in the order docs/strategies.md describes them.
STRATEGIES: tuple[type[Strategy], ...] = (
    Placement, Donation, InPlace, Batching, Jit, Guard, Profiling, Checkpointing, Fragmentation, RunAhead,
)


def build(scale: Scale, device: Any, on_error: Callable[[str], None] | None = None) -> dict[str, Strategy]:
    """One of each of :data:`STRATEGIES`, by name.

    Args:
        scale: workload sizes.
        device: where their arrays live.
        on_error: told about each transfer the guard refused.
    """
    built = [cls(scale, device, on_error=on_error) if cls is Guard else cls(scale, device) for cls in STRATEGIES]
    return {s.name: s for s in built}
