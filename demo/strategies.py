"""The nine memory strategies, each a pair (or triple) of variants compiled
up front, so flipping one changes only what it is about.

A strategy exposes:
    ``variants``      names, the first is the baseline ("off")
    ``prepare(v)``    compile variant ``v`` (before the loop; no compile in steps)
    ``step(v)``       one step of variant ``v`` (returns nothing; blocks until done)
    ``reset(v)``      put the workload back in its starting state, so that a
                      measurement starts from the same place whenever it runs
    ``static(v)``     metrics known from the compiled program (memory_analysis),
                      or from the jaxpr, measured not assumed
    ``metrics``       which measured metrics tell its story, with the direction
                      expected when going from the first to the second variant

Sizes come from a :class:`Scale` so the same code runs small on a 2-core CPU
and large on a GPU.
"""

from __future__ import annotations

import abc
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jaxtop.probes.live_arrays import hole_ratio


@dataclass(frozen=True)
class Scale:
    """Workload sizes. ``for_backend`` picks them from the device."""

    width: int = 256  # matrix side
    batch: int = 64
    items: int = 16  # items per step in the batching strategy
    state_elems: int = 1 << 20  # donation state (4 MiB of float32)
    grow_rows: int = 64  # in-place buffer rows
    layers: int = 16  # checkpointing scan length
    frag_buffers: int = 64

    @staticmethod
    def for_backend(backend: str, small: bool = False) -> "Scale":
        if small:
            return Scale(width=128, batch=32, items=8, state_elems=1 << 18, grow_rows=32, layers=8, frag_buffers=32)
        if backend in ("gpu", "cuda", "rocm", "tpu"):
            return Scale(width=2048, batch=512, items=32, state_elems=1 << 26, grow_rows=256, layers=32, frag_buffers=256)
        return Scale()


@dataclass(frozen=True)
class Metric:
    """A number the strategy is judged by.

    Attributes:
        key: name in the measurement dict.
        label: shown in tables.
        unit: bytes, count, s, ratio.
        expect: direction from the first to the second variant: "down", "up",
            "zero" (second is 0, first > 0), or "" (informational).
        pair: the variants compared; default: the first two.
        short: the label in the Strategies panel's one-line rows.
        caveat: a likely cause when it moves the wrong way, shown beside a ✗.
    """

    key: str
    label: str
    unit: str
    expect: str
    pair: tuple[str, str] | None = None
    short: str = ""
    caveat: str = ""


#: Step times are wall-clock times on a shared machine.
TIMING_CAVEAT = "other load on the machine"


def _analysis(compiled: Any) -> dict[str, int | None]:
    try:
        m = compiled.memory_analysis()
    except Exception:
        return {}
    if m is None:
        return {}
    out = {}
    for name in ("temp_size_in_bytes", "alias_size_in_bytes", "output_size_in_bytes", "argument_size_in_bytes"):
        out[name] = getattr(m, name, None)
    return out


class Strategy(abc.ABC):
    name = ""
    title = ""
    variants: tuple[str, ...] = ("off", "on")
    about = ""
    metrics: tuple[Metric, ...] = ()

    def __init__(self, scale: Scale, device: Any) -> None:
        self.scale = scale
        self.device = device
        self._static: dict[str, dict[str, Any]] = {}

    def prepare(self, variant: str) -> None:
        """Compile the variant (called once per variant, before the loop)."""

    def reset(self, variant: str) -> None:
        """Back to the starting state before ``variant`` is measured.

        Only strategies whose steps build up state (buffers kept between
        steps) need it; a measurement must not depend on what ran before.
        """

    @abc.abstractmethod
    def step(self, variant: str) -> None:
        """One iteration of the workload in ``variant``."""

    def static(self, variant: str) -> dict[str, Any]:
        return dict(self._static.get(variant, {}))


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
            outs[-1].block_until_ready()
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
            # Eager mode materialises every primitive's result as a device buffer.
            eqns = jax.make_jaxpr(_mlp)(self.w, self.x).jaxpr.eqns
            self._static["off"] = {"buffers_per_step": len(eqns)}
        else:
            self.jitted(self.w, self.x).block_until_ready()
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

        def make(ckpt: bool):
            def body(c, w):
                return jnp.tanh(c @ w), None

            b = jax.checkpoint(body) if ckpt else body

            def loss(ws, x):
                c, _ = lax.scan(b, x, ws)
                return jnp.sum(c)

            return jax.jit(jax.grad(loss))

        self.fns = {"off": make(False), "on": make(True)}

    def prepare(self, variant: str) -> None:
        self._static[variant] = _analysis(self.fns[variant].lower(self.ws, self.x).compile())
        self.fns[variant](self.ws, self.x).block_until_ready()

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
        self.reset("off")

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._thread.submit(fn, *args).result()

    def prepare(self, variant: str) -> None:
        self._run(lambda: [fn(self.scalar).block_until_ready() for fn in self.make.values()])

    def reset(self, variant: str) -> None:
        self._run(self._release, self.live)
        self.live = []
        self.rng = np.random.default_rng(2)  # the same sizes and frees in every measurement
        self._full_holes: float | None = None

    @staticmethod
    def _release(buffers: list[Any]) -> None:
        # Free now, not when the garbage collector or the runtime gets to it:
        # what the next allocations find must not depend on that timing.
        for a in buffers:
            try:
                a.delete()
            except Exception:
                pass

    def step(self, variant: str) -> None:
        self._run(self._step, variant)

    def _step(self, variant: str) -> None:
        cap = self.scale.frag_buffers
        if variant == "off":
            sizes = list(self.make)
            for _ in range(4):
                n = sizes[int(self.rng.integers(len(sizes)))]
                self.live.append(self.make[n](self.scalar))
            while len(self.live) > cap:  # free random old buffers: holes appear
                self._release([self.live.pop(int(self.rng.integers(len(self.live))))])
        else:
            # The step's buffers live and die together: the last step's batch
            # goes as a whole, and the new one can take its place.
            self._release(self.live)
            self.live = [self.make[self.uniform_n](self.scalar) for _ in range(cap)]
        self.live[-1].block_until_ready()
        if len(self.live) >= cap:
            # Compared when each variant holds a full set of buffers (the
            # mixed one fills up over its first steps).
            self._full_holes = self._holes()

    def _holes(self) -> float | None:
        spans = []
        for a in self.live:
            try:
                spans.append((a.unsafe_buffer_pointer(), a.nbytes))
            except Exception:
                continue
        return hole_ratio(spans)

    def gap_ratio(self) -> float | None:
        """:func:`hole_ratio` of the demo's own live buffers, the last time
        they were a full set; None before that."""
        return self._full_holes


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


#: Every strategy, in the order docs/strategies.md describes them.
STRATEGIES: tuple[type[Strategy], ...] = (
    Placement, Donation, InPlace, Batching, Jit, Guard, Profiling, Checkpointing, Fragmentation,
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
