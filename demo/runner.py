"""Runs the strategies inside an instrumented process and measures them with
jaxtop's own probes (transfer counter, compile probe, memory_stats, live
arrays, memory_analysis, the memory profile). Nothing shown is hard-coded.

One measurement, :meth:`DemoRunner.measure`, serves both modes: it puts the
strategy back in its starting state, runs one unmeasured step, then a fixed
number of measured steps, and reads the probes before and after.

Interactive: :meth:`DemoRunner.loop` waits for a strategy to be picked
(agent commands), measures each variant right after switching to it, then
keeps stepping it so that the dashboard's panels show it running; its state
goes out in each sample's ``demo`` field. Headless: :meth:`DemoRunner.run_all`
measures each strategy's variants back to back and returns the table.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import jax

from jaxtop.demo.metrics import NO, NOTHING, WITHIN, YES, fmt_metric, nothing_text, outcome, spread_of, why_not
from jaxtop.demo.profile_site import demo_site
from jaxtop.demo.strategies import Metric, Profiling, Scale, Strategy, build
from jaxtop.probes.jax_memory import fragmentation, normalize_stats

#: Measured steps per variant, in both modes (``--steps`` changes it headless).
MEASURE_STEPS = 30
#: How often the running workload's step count is sent on (seconds).
STEPS_SHOWN_S = 1.0


class DemoRunner:
    """The ten strategies of one process, and their measurements.

    Args:
        agent: the running jaxtop agent of this process (``handle.agent``).
        small: the smallest sizes (CI).
        steps: measured steps per variant.
        profile_dir: where memory profiles go; default ``$JAXTOP_PROFILE_DIR``,
            else jaxtop's private state directory (as the agent's own).
    """

    def __init__(self, agent: Any, small: bool = False, steps: int = MEASURE_STEPS,
                 profile_dir: str | None = None) -> None:
        self.agent = agent
        self.device = jax.local_devices()[0]
        self.backend = jax.default_backend()
        self.scale = Scale.for_backend(self.backend, small=small)
        self.measure_steps = steps
        self.profile_dir = profile_dir
        self._lock = threading.Lock()
        self._last_error_t = 0.0
        # Asked before the strategies allocate anything: the check frees
        # what it allocated and must see nothing else come or go.
        self.allocs_counted, self.allocs_reason = counts_allocations(self.device)
        self.strategies: dict[str, Strategy] = build(self.scale, self.device, on_error=self._guard_error)
        for s in self.strategies.values():
            for v in s.variants:
                s.prepare(v)  # compile every variant up front
        # Nothing runs until a strategy is picked: a row shows numbers only
        # for what the user (or run_all) asked to measure.
        self.active: str | None = None
        self.variant = {name: s.variants[0] for name, s in self.strategies.items()}
        self.measuring: tuple[str, str] | None = None
        self.results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in self.strategies}
        self._pending: list[tuple[str, str]] = []
        self.version = 0
        self.steps = 0

    # -- probes ---------------------------------------------------------------------
    def _counters(self, strategy: Strategy) -> dict[str, Any]:
        stats = normalize_stats(_memory_stats(self.device))
        frag, frag_reason = fragmentation(stats, self.device.platform)
        return {
            # Wait until the guard lines written so far are counted (a loaded
            # machine can hold the relay back for a while: up to 5 s).
            "h2d": self.agent.transfer_totals(sync_timeout_s=5.0)["h2d"],
            "compiles": self.agent.compile_count(),
            "errors": getattr(strategy, "errors", 0),
            "allocated": getattr(strategy, "allocated_bytes", None),
            # A difference of num_allocs is the allocations made only where
            # the allocator counts them (counts_allocations): on a TPU it
            # is the number of buffers alive, the same before and after.
            "num_allocs": (stats or {}).get("num_allocs") if self.allocs_counted else None,
            "fragmentation": frag,
            "fragmentation_reason": frag_reason,
        }

    def _guard_error(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_error_t >= 1.0:  # one event a second is plenty
            self._last_error_t = now
            self.agent.post_event("guard", text=f"caught {text}; the loop goes on")

    # -- measurement ----------------------------------------------------------------------
    def measure(self, name: str, variant: str, steps: int | None = None, record: bool = True) -> dict[str, Any]:
        """Measure one variant; the result is also kept in :attr:`results`.

        The strategy starts from its reset state and runs one unmeasured step
        (it may still compile or fill a cache), then ``steps`` measured ones
        in three blocks (more where the strategy needs longer blocks:
        ``min_block_steps``). The same steps measured the same way give the
        same counts, whether run headless or right after a switch in the
        dashboard.

        Args:
            name: the strategy.
            variant: one of its variants.
            steps: measured steps; default :attr:`measure_steps`.
            record: keep the result in :attr:`results`. False for a repeat
                that only measures the spread: the counts (exact, known from
                the first measurement) are not read, which saves the wait for
                the transfer counter.

        Returns:
            The metrics, per step where they are counts (see :func:`step_metrics`),
            with ``KEY_spread`` beside each figure read per block; for the
            profiling strategy, the profile's (see :meth:`snapshot`).
        """
        strategy = self.strategies[name]
        steps = steps or self.measure_steps
        if isinstance(strategy, Profiling):
            metrics = self.snapshot()
        else:
            metrics = self._measure_steps(strategy, variant, steps, counts=record)
        if record:
            with self._lock:
                self.results[name][variant] = metrics
                self.version += 1
        return metrics

    def _measure_steps(self, strategy: Strategy, variant: str, steps: int, counts: bool = True) -> dict[str, Any]:
        strategy.reset(variant)
        strategy.step(variant)
        strategy.drain(variant)
        strategy.block_metrics(variant)  # the unmeasured step's figures go
        self.steps += 1
        before = self._counters(strategy) if counts else None
        # Three equal blocks: a noisy figure is read after each, and the
        # range of its readings is its spread. Step time is the fastest
        # block's, so that a burst of load from elsewhere on the machine
        # does not flip a comparison. A strategy whose story takes a number
        # of steps (the run-ahead one's wait interval) gets at least that
        # many per block: the wait at a block's end would cut it short.
        chunks = [steps // 3 + (1 if i < steps % 3 else 0) for i in range(3)]
        chunks = [max(n, strategy.min_block_steps) for n in chunks]
        steps = sum(chunks)
        blocks: list[dict[str, Any]] = []
        for n in chunks:
            if not n:
                continue
            started = time.perf_counter()
            for _ in range(n):
                strategy.step(variant)
            strategy.drain(variant)  # the device's work is part of the step
            elapsed = time.perf_counter() - started
            self.steps += n
            block = {"step_s": elapsed / n}
            block.update(strategy.block_metrics(variant))
            # After the drain: the allocator has seen the block's work end.
            block["fragmentation"] = fragmentation(normalize_stats(_memory_stats(self.device)), self.device.platform)[0]
            blocks.append(block)
        after = self._counters(strategy) if counts else None
        return step_metrics(strategy, variant, steps, blocks, before, after, self.allocs_reason)

    def snapshot(self) -> dict[str, Any]:
        """Take a device memory profile: the profiling strategy's measurement.

        Returns:
            ``profile_bytes``, ``profile_s``, ``profile_path``, ``top_site``
            and ``top_site_bytes``, or ``profile_error`` with the reason.
        """
        from jaxtop.probes.memory_profile import take_profile

        directory = self.profile_dir
        if directory is None:
            # Where the agent's own profiles go: $JAXTOP_PROFILE_DIR, else
            # jaxtop's private state directory, never the working directory.
            from jaxtop.agent.clients import CommandError
            from jaxtop.agent.commands import profile_directory

            try:
                directory = profile_directory(None)
            except CommandError as exc:  # the directory is not acceptable: said why
                return {"profile_error": str(exc)}
        result = take_profile(directory)
        if "error" in result:
            return {"profile_error": result["error"]}
        out = {"profile_bytes": result.get("total_bytes"), "profile_s": result.get("seconds"),
               "profile_path": result.get("path")}
        site = demo_site(result.get("path"))
        if site is None:
            # No allocation in the strategies' code (a trimmed profile): the
            # probe's own pick, the innermost frame outside jax, is the next best.
            top = (result.get("top_sites") or [{}])[0]
            site = (top.get("site"), top.get("bytes"))
        out["top_site"], out["top_site_bytes"] = site
        return out

    # -- headless ----------------------------------------------------------------------------
    def run_all(self, steps: int | None = None) -> list[dict[str, Any]]:
        """Each strategy's variants back to back; one row per metric.

        A strategy with a noisy metric that is expected to move has the
        first variant of that metric measured once more after the others
        (off, on, off): how far the two readings of the same variant lie
        apart is part of the metric's spread.
        """
        rows = []
        for name, strategy in self.strategies.items():
            measured = {v: self.measure(name, v, steps) for v in strategy.variants}
            again = {v: self.measure(name, v, steps, record=False) for v in repeat_variants(strategy, measured)}
            rows.extend(table_rows(name, strategy, measured, self.backend, again))
        return rows

    # -- interactive -----------------------------------------------------------------------
    def request(self, strategy: str, variant: str | None = None) -> dict[str, Any]:
        """Agent command: switch to ``strategy`` (and ``variant``) at the next step.

        Without ``variant``: a strategy that is not running starts in its
        current variant; the running one moves to its next variant. Either
        way the variant is measured right after the switch.
        """
        if strategy not in self.strategies:
            raise ValueError(f"unknown strategy {strategy!r}; known: {list(self.strategies)}")
        variants = self.strategies[strategy].variants
        if variant is None:
            current = self.variant[strategy]
            with self._lock:
                queued_last = self._pending[-1][0] if self._pending else self.active
            if queued_last != strategy:
                variant = current
            else:
                variant = variants[(variants.index(current) + 1) % len(variants)]
        if variant not in variants:
            raise ValueError(f"{strategy} has variants {variants}, not {variant!r}")
        with self._lock:
            self._pending.append((strategy, variant))
        return {"queued": True, "strategy": strategy, "variant": variant}

    def state_if_changed(self, seen_version: int) -> dict[str, Any] | None:
        """:meth:`state` when it changed since ``seen_version``, else None."""
        with self._lock:
            if self.version == seen_version:
                return None
        return self.state()

    def state(self) -> dict[str, Any]:
        """The ``demo`` field of each sample (small, thread-safe)."""
        with self._lock:
            return {
                "active": self.active,
                "measuring": list(self.measuring) if self.measuring else None,
                "measure_steps": self.measure_steps,
                "version": self.version,
                "backend": self.backend,
                "steps": self.steps,
                "strategies": [
                    dict(describe(s), variant=self.variant[name],
                         results={v: dict(r) for v, r in self.results[name].items()})
                    for name, s in self.strategies.items()
                ],
            }

    def loop(self, stop: threading.Event, max_steps: int | None = None) -> None:
        """Apply switches, measuring each; step the running strategy between them."""
        shown_t, shown_steps = time.monotonic(), self.steps
        while not stop.is_set() and (max_steps is None or self.steps < max_steps):
            now = time.monotonic()
            if now - shown_t >= STEPS_SHOWN_S and self.steps != shown_steps:
                # The state goes out when its version moves: once a second
                # for the step count, not at every step.
                shown_t, shown_steps = now, self.steps
                with self._lock:
                    self.version += 1
            with self._lock:
                pending, self._pending = self._pending, []
            for name, variant in pending:
                if stop.is_set():
                    return
                self._switch(name, variant)
            name = self.active
            if name is None:
                stop.wait(0.05)  # nothing picked yet
                continue
            self.strategies[name].step(self.variant[name])
            self.steps += 1

    def _switch(self, name: str, variant: str) -> None:
        with self._lock:
            self.active = name
            self.variant[name] = variant
            self.measuring = (name, variant)
            self.version += 1
        strategy = self.strategies[name]
        self.agent.post_event("strategy", text=f"{name}: {variant}")
        try:
            metrics = self.measure(name, variant)
        finally:
            with self._lock:
                self.measuring = None
                self.version += 1
        if isinstance(strategy, Profiling):
            text = (f"profile saved {metrics.get('profile_path')}; top site {metrics.get('top_site')}"
                    if "profile_error" not in metrics else f"profile failed: {metrics['profile_error']}")
            self.agent.post_event("profile", text=text)


def step_metrics(strategy: Strategy, variant: str, steps: int, blocks: list[dict[str, Any]],
                 before: dict[str, Any] | None, after: dict[str, Any] | None,
                 allocs_reason: str | None = None) -> dict[str, Any]:
    """One variant's measurement, from what was read around its steps.

    Args:
        strategy: the strategy measured.
        variant: the variant measured.
        steps: how many steps were measured.
        blocks: per block of steps, the figures read after it (step time,
            allocator fragmentation, the strategy's ``block_metrics``).
        before: the counters (``DemoRunner._counters``) before the steps;
            None, with ``after``, where the counts were not read.
        after: the counters after them.
        allocs_reason: why the allocator's ``num_allocs`` was not read
            (its value in the counters is None then).

    Returns:
        Per-step counts; each block figure reduced over the blocks, with
        ``KEY_spread`` (the range of its readings) beside it; ``KEY_reason``
        for a figure that is None; ``KEY_source`` where a figure's source
        depends on the backend; and the strategy's static metrics.
    """
    out: dict[str, Any] = {"steps": steps}
    reduce = {"step_s": min, **strategy.block_reduce}
    for key in dict.fromkeys(k for b in blocks for k in b):
        values = [b[key] for b in blocks if b.get(key) is not None]
        if not values:
            out[key] = None
            continue
        out[key] = reduce[key](values) if key in reduce else values[-1]
        # How much the figure varied between blocks of this very
        # measurement: a change between variants must be larger.
        out[f"{key}_spread"] = max(values) - min(values)
    if before is not None and after is not None:
        out["h2d_per_step"] = (after["h2d"] - before["h2d"]) / steps
        out["compiles_per_step"] = (after["compiles"] - before["compiles"]) / steps
        out["errors_per_step"] = (after["errors"] - before["errors"]) / steps
        if after["allocated"] is not None and after["allocated"] != before["allocated"]:
            out["alloc_bytes_per_step"] = (after["allocated"] - before["allocated"]) / steps
        if after["num_allocs"] is not None and before["num_allocs"] is not None:
            out["allocs_per_step"] = (after["num_allocs"] - before["num_allocs"]) / steps
    if out.get("fragmentation") is None:
        out["fragmentation_reason"] = ((after or {}).get("fragmentation_reason")
                                       or "memory_stats() reports no pool on this backend")
    if "gap_ratio" in out and out["gap_ratio"] is None:
        out["gap_ratio_reason"] = getattr(strategy, "holes_reason", None) or "no buffer addresses were read"
    if "held_bytes" in out and out["held_bytes"] is None:
        out["held_bytes_reason"] = getattr(strategy, "held_reason", None) or "no bytes in use on this backend"
    if strategy.name == "jit":
        if out.get("allocs_per_step") is not None:
            out["buffers_per_step"] = out["allocs_per_step"]
            out["buffers_per_step_source"] = "the allocator's num_allocs"
        else:
            out["buffers_per_step_source"] = f"the jaxpr's operations; no allocation count: {allocs_reason}"
    for key, value in strategy.static(variant).items():
        out.setdefault(key, value)
    return out


def describe(strategy: Strategy | type[Strategy]) -> dict[str, Any]:
    """What the Strategies panel needs to know of a strategy, besides results.

    Args:
        strategy: a strategy, or its class (nothing is compiled for that).
    """
    return {
        "name": strategy.name,
        "title": strategy.title,
        "about": strategy.about,
        "variants": list(strategy.variants),
        "metrics": [{"key": m.key, "label": m.label, "short": m.short or m.label, "unit": m.unit,
                     "expect": m.expect, "caveat": m.caveat, "pair": _pair(strategy, m)} for m in strategy.metrics],
    }


def _pair(strategy: Strategy | type[Strategy], metric: Metric) -> list[str | None]:
    """The variants a metric compares: (None, v) for a one-variant strategy."""
    if metric.pair:
        return list(metric.pair)
    if len(strategy.variants) == 1:
        return [None, strategy.variants[0]]
    return list(strategy.variants[:2])


def repeat_variants(strategy: Strategy, measured: dict[str, dict[str, Any]]) -> list[str]:
    """The variants to measure again for their spread: the first of each
    pair whose metric is expected to move and was read per block (has a
    ``KEY_spread``); exact counts and sizes need no repeat."""
    out: list[str] = []
    for m in strategy.metrics:
        a, _ = _pair(strategy, m)
        if a is not None and m.expect in ("down", "up", "zero") and f"{m.key}_spread" in measured.get(a, {}):
            if a not in out:
                out.append(a)
    return out


def table_rows(name: str, strategy: Strategy, measured: dict[str, dict[str, Any]], backend: str,
               again: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per metric of a measured strategy (the headless table, the JSON).

    Args:
        name: the strategy's name.
        strategy: the strategy.
        measured: its measurement per variant.
        backend: jax's backend, for the reason of an n/a.
        again: a second measurement of some variants (:func:`repeat_variants`).
    """
    if isinstance(strategy, Profiling):
        return _profile_rows(strategy, measured.get(strategy.variants[0]) or {})
    return [_row(name, strategy, m, measured, backend, again or {}) for m in strategy.metrics]


def _profile_rows(strategy: Strategy, result: dict[str, Any]) -> list[dict[str, Any]]:
    if "profile_error" in result:
        return [{"strategy": strategy.name, "metric": "profile", "key": "profile_bytes", "off": None, "on": None,
                 "change": None, "expect": "saved", "ok": None, "na": f"n/a on this backend: {result['profile_error']}"}]
    saved = bool(result.get("profile_path")) and (result.get("profile_bytes") or 0) > 0
    size, took = strategy.metrics
    return [
        {"strategy": strategy.name, "metric": size.label, "key": size.key, "off": None, "on": result.get("profile_bytes"),
         "unit": "bytes", "change": None, "expect": "saved", "ok": saved, "na": None,
         "note": f"saved {result.get('profile_path')}; top site {result.get('top_site')}, "
                 f"{fmt_metric(result.get('top_site_bytes'), 'bytes')}",
         "top_site": result.get("top_site"), "path": result.get("profile_path")},
        {"strategy": strategy.name, "metric": took.label, "key": took.key, "off": None, "on": result.get("profile_s"),
         "unit": "s", "change": None, "expect": "", "ok": None, "na": None},
    ]


def _memory_stats(device: Any) -> dict[str, Any] | None:
    try:
        return device.memory_stats()
    except Exception:
        return None


def row_spread(metric: Metric, a: str | None, b: str, measured: dict[str, dict[str, Any]],
               again: dict[str, dict[str, Any]] | None = None) -> float | None:
    """A metric's spread between variants ``a`` and ``b``: the largest range
    of its per-block readings in either, and the distance between two
    measurements of ``a`` where there are two; None for an exact metric."""
    key = metric.key
    ra, rb = measured.get(a, {}) if a is not None else {}, measured.get(b, {})
    within = ra.get(f"{key}_spread"), rb.get(f"{key}_spread")
    if within == (None, None):
        return None  # not read per block: a count or a size, exact
    first = ra.get(key)
    second = (again or {}).get(a, {}).get(key) if a is not None else None
    repeat = abs(second - first) if first is not None and second is not None else None
    return spread_of(*within, repeat)


def _row(name: str, strategy: Strategy, metric: Metric, measured: dict[str, dict[str, Any]], backend: str,
         again: dict[str, dict[str, Any]]) -> dict[str, Any]:
    a, b = _pair(strategy, metric)
    off, on = measured.get(a, {}).get(metric.key), measured.get(b, {}).get(metric.key)
    row = {"strategy": name, "metric": metric.label, "key": metric.key, "unit": metric.unit,
           "variants": [a, b], "off": off, "on": on, "expect": metric.expect, "na": None, "spread": None}
    if off is None or on is None:
        reason = measured.get(b, {}).get(f"{metric.key}_reason") or measured.get(a, {}).get(f"{metric.key}_reason") or f"not measurable on {backend}"
        row.update(change=None, ok=None, na=f"n/a on this backend: {reason}")
        return row
    row["change"] = on - off
    row["spread"] = row_spread(metric, a, b, measured, again)
    result = outcome(metric.expect, off, on, row["spread"], can_be_zero=metric.unit != "s")
    row["ok"] = {YES: True, NO: False}.get(result)
    row["within_spread"] = result == WITHIN
    row["nothing_to_lower"] = result == NOTHING
    source = measured.get(b, {}).get(f"{metric.key}_source") or measured.get(a, {}).get(f"{metric.key}_source")
    notes = [f"source: {source}"] if source else []
    if result == NO:
        notes.insert(0, why_not(metric.expect, metric.caveat))
    elif result == NOTHING:
        notes.insert(0, nothing_text(off, row["spread"], metric.unit, precise=True))
    if notes:
        row["note"] = "; ".join(notes)
    return row


def counts_allocations(device: Any, stats: Callable[[], dict[str, Any] | None] | None = None,
                       settle_s: float = 0.25) -> tuple[bool, str | None]:
    """Whether ``memory_stats()["num_allocs"]`` counts the allocations made,
    so that its difference over some steps is what they allocated.

    The BFC allocator of a GPU counts every allocation and never counts
    down. The TPU runtime's ``num_allocs`` is the number of buffers alive:
    it went up and down with the program's buffers in a recording on a TPU
    v5e (jax 0.10.2: 665, 605, 545, 485, 665, … while a training loop ran),
    and its difference over steps that free what they allocate is 0. Told
    apart here by allocating three buffers and freeing them: a count of
    live buffers falls back.

    Args:
        device: the device the strategies run on (the buffers go there).
        stats: reads the allocator's stats; default ``device.memory_stats()``.
        settle_s: how long to wait for the count to fall (a runtime may
            free a buffer a moment after ``delete()``).

    Returns:
        (True, None), or (False, why the count cannot be used).
    """
    import jax.numpy as jnp

    read = stats or (lambda: _memory_stats(device))

    def count() -> Any:
        return (normalize_stats(read()) or {}).get("num_allocs")

    if read() is None:
        return False, f"memory_stats() is None on {device.platform} backend"
    first = count()
    if first is None:
        return False, f"memory_stats() has no num_allocs on {device.platform}"
    probe = [jnp.full((1024,), float(i), jnp.float32, device=device) for i in range(3)]
    jax.block_until_ready(probe)
    held = count()
    for a in probe:
        a.delete()
    deadline = time.monotonic() + settle_s
    while True:
        now = count()
        if now is not None and held is not None and now < held:
            return False, (f"num_allocs on {device.platform} counts live buffers, not allocations made "
                           f"(it fell from {held} to {now} as buffers were freed)")
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    if held is None or held <= first:
        return False, f"num_allocs on {device.platform} did not rise when buffers were allocated"
    return True, None
