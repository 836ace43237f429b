"""Runs the strategies inside an instrumented process and measures them with
jaxtop's own probes (transfer counter, compile probe, memory_stats, live
arrays, memory_analysis, the memory profile). Nothing shown is hard-coded.

Interactive: :meth:`DemoRunner.loop` steps the active strategy, applies
toggles (agent commands) at step boundaries and publishes its state in each
sample's ``demo`` field. Headless: :meth:`DemoRunner.run_all` runs each
strategy's variants back to back and returns the comparison table.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax

from jaxtop.demo.metrics import verdict
from jaxtop.demo.strategies import Metric, Scale, Strategy, build
from jaxtop.probes.jax_memory import fragmentation, normalize_stats

MEASURE_WINDOW_S = 1.0  # interactive: a measurement every second per running variant


class DemoRunner:
    """Args:
        agent: the running jaxtop agent of this process (``handle.agent``).
        small: the smallest sizes (CI).
    """

    def __init__(self, agent: Any, small: bool = False) -> None:
        self.agent = agent
        self.device = jax.local_devices()[0]
        self.backend = jax.default_backend()
        self.scale = Scale.for_backend(self.backend, small=small)
        self._lock = threading.Lock()
        self._last_error_t = 0.0
        self.strategies: dict[str, Strategy] = build(self.scale, self.device, on_error=self._guard_error)
        for s in self.strategies.values():
            for v in s.variants:
                s.prepare(v)  # compile every variant up front
        self.active = "placement"
        self.variant = {name: s.variants[0] for name, s in self.strategies.items()}
        self.results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in self.strategies}
        self._pending: list[tuple[str, str]] = []
        self.version = 0
        self.steps = 0

    # -- probes ---------------------------------------------------------------------
    def _counters(self, strategy: Strategy) -> dict[str, Any]:
        stats = normalize_stats(_memory_stats(self.device))
        frag, _ = fragmentation(stats, self.device.platform)
        return {
            # Wait until the guard lines written so far are counted (a loaded
            # machine can hold the relay back for a while: up to 5 s).
            "h2d": self.agent.transfer_totals(sync_timeout_s=5.0)["h2d"],
            "compiles": self.agent.compile_count(),
            "errors": getattr(strategy, "errors", 0),
            "allocated": getattr(strategy, "allocated_bytes", None),
            "num_allocs": (stats or {}).get("num_allocs"),
            "peak": (stats or {}).get("peak_bytes_in_use"),
            "fragmentation": frag,
            "t": time.perf_counter(),
        }

    def _guard_error(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_error_t >= 1.0:  # one event a second is plenty
            self._last_error_t = now
            self.agent.post_event("guard", text=f"caught {text}; the loop goes on")

    # -- measurement ----------------------------------------------------------------------
    def measure(self, name: str, variant: str, steps: int) -> dict[str, Any]:
        """Run ``steps`` steps of one variant; metrics per step from the probes."""
        strategy = self.strategies[name]
        before = self._counters(strategy)
        # Step time: the fastest of three equal chunks, so a burst of load from
        # elsewhere on the machine does not flip a comparison.
        chunks = [steps // 3 + (1 if i < steps % 3 else 0) for i in range(3)]
        best = None
        for n in chunks:
            started = time.perf_counter()
            for _ in range(n):
                strategy.step(variant)
            if n:
                per_step = (time.perf_counter() - started) / n
                best = per_step if best is None else min(best, per_step)
        after = self._counters(strategy)
        return self._metrics(strategy, variant, steps, best or 0.0, before, after)

    def _metrics(self, strategy: Strategy, variant: str, steps: int, step_s: float,
                 before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": steps, "step_s": step_s}
        out["h2d_per_step"] = (after["h2d"] - before["h2d"]) / steps
        out["compiles_per_step"] = (after["compiles"] - before["compiles"]) / steps
        out["errors_per_step"] = (after["errors"] - before["errors"]) / steps
        if after["allocated"] is not None and after["allocated"] != before["allocated"]:
            out["alloc_bytes_per_step"] = (after["allocated"] - before["allocated"]) / steps
        if after["num_allocs"] is not None and before["num_allocs"] is not None:
            out["allocs_per_step"] = (after["num_allocs"] - before["num_allocs"]) / steps
        out["fragmentation"] = after["fragmentation"]
        if after["fragmentation"] is None:
            out["fragmentation_reason"] = "memory_stats() reports no pool on this backend"
        if hasattr(strategy, "gap_ratio"):
            out["gap_ratio"] = strategy.gap_ratio()
        if strategy.name == "jit" and out.get("allocs_per_step") is not None:
            out["buffers_per_step"] = out["allocs_per_step"]  # the allocator's own count (GPU)
        static = strategy.static(variant)
        for key, value in static.items():
            out.setdefault(key, value)
        return out

    def take_profile(self, directory: str | None = None) -> dict[str, Any]:
        import os

        from jaxtop.probes.memory_profile import take_profile

        result = take_profile(directory or os.environ.get("JAXTOP_PROFILE_DIR") or os.getcwd())
        if "error" not in result:
            metrics = {"profile_bytes": result.get("total_bytes"), "profile_s": result.get("seconds"),
                       "profile_path": result.get("path"), "top_site": (result.get("top_sites") or [{}])[0].get("site")}
            with self._lock:
                self.results["profiling"]["snapshot"] = metrics
                self.version += 1
        return result

    # -- headless ----------------------------------------------------------------------------
    def run_all(self, steps: int = 30, profile_dir: str | None = None) -> list[dict[str, Any]]:
        """Each strategy's variants back to back; one row per metric."""
        rows = []
        for name, strategy in self.strategies.items():
            if name == "profiling":
                result = self.take_profile(profile_dir)
                rows.extend(self._profile_rows(result))
                continue
            measured = {}
            for variant in strategy.variants:
                strategy.step(variant)  # warm: a first call may still compile
                measured[variant] = self.measure(name, variant, steps)
            self.results[name] = measured
            for metric in strategy.metrics:
                rows.append(_row(name, strategy, metric, measured, self.backend))
        return rows

    def _profile_rows(self, result: dict[str, Any]) -> list[dict[str, Any]]:
        if "error" in result:
            return [{"strategy": "profiling", "metric": "profile", "off": None, "on": None, "change": None,
                     "expect": "saved", "ok": None, "na": f"n/a on this backend: {result['error']}"}]
        saved = bool(result.get("path")) and (result.get("total_bytes") or 0) > 0
        top = (result.get("top_sites") or [{}])[0]
        return [
            {"strategy": "profiling", "metric": "bytes in the profile", "off": None, "on": result.get("total_bytes"),
             "unit": "bytes", "change": None, "expect": "saved", "ok": saved, "na": None,
             "note": f"saved {result.get('path')}; top site {top.get('site')} ({top.get('bytes')} B)"},
            {"strategy": "profiling", "metric": "time to take it", "off": None, "on": result.get("seconds"),
             "unit": "s", "change": None, "expect": "", "ok": None, "na": None},
        ]

    # -- interactive -----------------------------------------------------------------------
    def request(self, strategy: str, variant: str | None = None) -> dict[str, Any]:
        """Agent command: make ``strategy`` active (and set its variant) at the next step.

        Without ``variant``: a strategy that is not running starts in its
        current variant; the running one moves to its next variant.
        """
        if strategy not in self.strategies:
            raise ValueError(f"unknown strategy {strategy!r}; known: {list(self.strategies)}")
        variants = self.strategies[strategy].variants
        if variant is None:
            # The first press runs the strategy as it is (its "before" gets
            # measured); presses while it runs switch to the next variant.
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
                "version": self.version,
                "backend": self.backend,
                "steps": self.steps,
                "strategies": [
                    {
                        "name": name,
                        "title": s.title,
                        "about": s.about,
                        "variants": list(s.variants),
                        "variant": self.variant[name],
                        "metrics": [{"key": m.key, "label": m.label, "unit": m.unit, "expect": m.expect,
                                     "pair": list(m.pair or s.variants[:2])} for m in s.metrics],
                        "results": {v: dict(r) for v, r in self.results[name].items()},
                    }
                    for name, s in self.strategies.items()
                ],
            }

    def loop(self, stop: threading.Event, max_steps: int | None = None) -> None:
        """Step the active strategy until ``stop``; measure each window."""
        window_start = None
        window_steps = 0
        before = None
        while not stop.is_set() and (max_steps is None or self.steps < max_steps):
            with self._lock:
                pending, self._pending = self._pending, []
            for strategy, variant in pending:
                if window_steps and before is not None:
                    self._close_window(before, window_steps)
                with self._lock:
                    self.active = strategy
                    self.variant[strategy] = variant
                    self.version += 1
                self.agent.post_event("strategy", text=f"{strategy}: {variant}")
                window_start, window_steps, before = None, 0, None
                if strategy == "profiling" and variant == "snapshot":
                    result = self.take_profile()
                    text = f"profile saved {result.get('path')}" if "error" not in result else f"profile failed: {result['error']}"
                    self.agent.post_event("profile", text=text)
            name = self.active
            strategy = self.strategies[name]
            if before is None:
                before = self._counters(strategy)
                window_start = time.monotonic()
            strategy.step(self.variant[name])
            self.steps += 1
            window_steps += 1
            if time.monotonic() - window_start >= MEASURE_WINDOW_S:
                self._close_window(before, window_steps)
                before, window_steps = None, 0

    def _close_window(self, before: dict[str, Any], steps: int) -> None:
        name = self.active
        strategy = self.strategies[name]
        variant = self.variant[name]
        elapsed = time.perf_counter() - before["t"]
        after = self._counters(strategy)
        metrics = self._metrics(strategy, variant, steps, elapsed / max(1, steps), before, after)
        with self._lock:
            self.results[name][variant] = metrics
            self.version += 1


def _memory_stats(device: Any) -> dict[str, Any] | None:
    try:
        return device.memory_stats()
    except Exception:
        return None


def _row(name: str, strategy: Strategy, metric: Metric, measured: dict[str, dict[str, Any]], backend: str) -> dict[str, Any]:
    a, b = metric.pair or strategy.variants[:2]
    off, on = measured.get(a, {}).get(metric.key), measured.get(b, {}).get(metric.key)
    row = {"strategy": name, "metric": metric.label, "key": metric.key, "unit": metric.unit,
           "variants": [a, b], "off": off, "on": on, "expect": metric.expect, "na": None}
    if off is None or on is None:
        reason = measured.get(b, {}).get(f"{metric.key}_reason") or measured.get(a, {}).get(f"{metric.key}_reason") or f"not measurable on {backend}"
        row.update(change=None, ok=None, na=f"n/a on this backend: {reason}")
        return row
    row["change"] = on - off
    row["ok"] = verdict(metric.expect, off, on)
    return row
