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

import gzip
import inspect
import os
import threading
import time
from typing import Any

import jax

from jaxtop.demo import strategies as strategies_module
from jaxtop.demo.metrics import fmt_metric, verdict, why_not
from jaxtop.demo.strategies import Metric, Profiling, Scale, Strategy, build
from jaxtop.probes.jax_memory import fragmentation, normalize_stats

#: Measured steps per variant, in both modes (``--steps`` changes it headless).
MEASURE_STEPS = 30
#: How often the running workload's step count is sent on (seconds).
STEPS_SHOWN_S = 1.0


class DemoRunner:
    """The nine strategies of one process, and their measurements.

    Args:
        agent: the running jaxtop agent of this process (``handle.agent``).
        small: the smallest sizes (CI).
        steps: measured steps per variant.
        profile_dir: where memory profiles go; default ``$JAXTOP_PROFILE_DIR``,
            else the current directory.
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
            "num_allocs": (stats or {}).get("num_allocs"),
            "peak": (stats or {}).get("peak_bytes_in_use"),
            "fragmentation": frag,
            "fragmentation_reason": frag_reason,
            "t": time.perf_counter(),
        }

    def _guard_error(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_error_t >= 1.0:  # one event a second is plenty
            self._last_error_t = now
            self.agent.post_event("guard", text=f"caught {text}; the loop goes on")

    # -- measurement ----------------------------------------------------------------------
    def measure(self, name: str, variant: str, steps: int | None = None) -> dict[str, Any]:
        """Measure one variant; the result is also kept in :attr:`results`.

        The strategy starts from its reset state and runs one unmeasured step
        (it may still compile or fill a cache), then ``steps`` measured ones.
        The same steps measured the same way give the same counts, whether
        run headless or right after a switch in the dashboard.

        Args:
            name: the strategy.
            variant: one of its variants.
            steps: measured steps; default :attr:`measure_steps`.

        Returns:
            The metrics, per step where they are counts (see :meth:`_metrics`);
            for the profiling strategy, the profile's (see :meth:`snapshot`).
        """
        strategy = self.strategies[name]
        steps = steps or self.measure_steps
        if isinstance(strategy, Profiling):
            metrics = self.snapshot()
        else:
            strategy.reset(variant)
            strategy.step(variant)
            self.steps += 1
            before = self._counters(strategy)
            # Step time: the fastest of three equal chunks, so a burst of load
            # from elsewhere on the machine does not flip a comparison.
            chunks = [steps // 3 + (1 if i < steps % 3 else 0) for i in range(3)]
            best = None
            for n in chunks:
                started = time.perf_counter()
                for _ in range(n):
                    strategy.step(variant)
                self.steps += n
                if n:
                    per_step = (time.perf_counter() - started) / n
                    best = per_step if best is None else min(best, per_step)
            after = self._counters(strategy)
            metrics = self._metrics(strategy, variant, steps, best or 0.0, before, after)
        with self._lock:
            self.results[name][variant] = metrics
            self.version += 1
        return metrics

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
            out["fragmentation_reason"] = after["fragmentation_reason"] or "memory_stats() reports no pool on this backend"
        if hasattr(strategy, "gap_ratio"):
            out["gap_ratio"] = strategy.gap_ratio()
            if out["gap_ratio"] is None:
                out["gap_ratio_reason"] = "no buffer addresses on this backend"
        if strategy.name == "jit" and out.get("allocs_per_step") is not None:
            out["buffers_per_step"] = out["allocs_per_step"]  # the allocator's own count (GPU)
        for key, value in strategy.static(variant).items():
            out.setdefault(key, value)
        return out

    def snapshot(self) -> dict[str, Any]:
        """Take a device memory profile: the profiling strategy's measurement.

        Returns:
            ``profile_bytes``, ``profile_s``, ``profile_path``, ``top_site``
            and ``top_site_bytes``, or ``profile_error`` with the reason.
        """
        from jaxtop.probes.memory_profile import take_profile

        directory = self.profile_dir or os.environ.get("JAXTOP_PROFILE_DIR") or os.getcwd()
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
        """Each strategy's variants back to back; one row per metric."""
        rows = []
        for name, strategy in self.strategies.items():
            measured = {v: self.measure(name, v, steps) for v in strategy.variants}
            rows.extend(table_rows(name, strategy, measured, self.backend))
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


def table_rows(name: str, strategy: Strategy, measured: dict[str, dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    """One row per metric of a measured strategy (the headless table, the JSON)."""
    if isinstance(strategy, Profiling):
        return _profile_rows(strategy, measured.get(strategy.variants[0]) or {})
    return [_row(name, strategy, m, measured, backend) for m in strategy.metrics]


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


def _row(name: str, strategy: Strategy, metric: Metric, measured: dict[str, dict[str, Any]], backend: str) -> dict[str, Any]:
    a, b = _pair(strategy, metric)
    off, on = measured.get(a, {}).get(metric.key), measured.get(b, {}).get(metric.key)
    row = {"strategy": name, "metric": metric.label, "key": metric.key, "unit": metric.unit,
           "variants": [a, b], "off": off, "on": on, "expect": metric.expect, "na": None}
    if off is None or on is None:
        reason = measured.get(b, {}).get(f"{metric.key}_reason") or measured.get(a, {}).get(f"{metric.key}_reason") or f"not measurable on {backend}"
        row.update(change=None, ok=None, na=f"n/a on this backend: {reason}")
        return row
    row["change"] = on - off
    row["ok"] = verdict(metric.expect, off, on)
    if row["ok"] is False:
        row["note"] = why_not(metric.expect, metric.caveat)
    return row


# -- the top allocation site in the demo's own code ---------------------------------------

_STRATEGIES_FILE = os.path.realpath(strategies_module.__file__)


def demo_site(path: str | None) -> tuple[str, int] | None:
    """The frame of the strategies' code that allocated the most live bytes.

    The probe's top site is the innermost frame outside jax; in the demo's
    workload that can be the bootstrap that started the process, which says
    nothing. The innermost frame in ``strategies.py`` is the one a user
    reading that file can act on.

    Args:
        path: a profile :func:`~jaxtop.probes.memory_profile.take_profile` saved.

    Returns:
        ("Class.function (strategies.py:LINE)", bytes), or None when no live
        buffer was allocated there (or the file cannot be read).
    """
    from jaxtop.probes.memory_profile import ProfileDecodeError, decode_profile

    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        profile = decode_profile(data)
    except (OSError, EOFError, ProfileDecodeError):
        return None
    bytes_i = next((i for i, (kind, unit) in enumerate(profile.sample_types) if kind == "space" or unit == "bytes"), None)
    if bytes_i is None:
        return None
    ours: dict[int, bool] = {}  # function id -> in strategies.py
    per_site: dict[tuple[str, int], int] = {}
    for sample in profile.samples:
        nbytes = sample.values[bytes_i] if bytes_i < len(sample.values) else 0
        if nbytes <= 0:
            continue
        site = None
        for loc_id in sample.location_ids:  # innermost first
            for func_id, line in profile.locations.get(loc_id, ()):
                if func_id not in ours:
                    filename = profile.functions.get(func_id, ("", ""))[1]
                    ours[func_id] = bool(filename) and os.path.realpath(filename) == _STRATEGIES_FILE
                if ours[func_id]:
                    site = (profile.functions[func_id][0], line)
                    break
            if site:
                break
        if site:
            per_site[site] = per_site.get(site, 0) + nbytes
    if not per_site:
        return None
    (function, line), nbytes = max(per_site.items(), key=lambda item: (item[1], -item[0][1]))
    owner = _class_at(line)
    return f"{owner + '.' if owner else ''}{function} (strategies.py:{line})", nbytes


def _class_at(line: int) -> str | None:
    """The strategy class whose source holds ``line`` of strategies.py."""
    for cls in vars(strategies_module).values():
        if inspect.isclass(cls) and cls.__module__ == strategies_module.__name__:
            try:
                lines, start = inspect.getsourcelines(cls)
            except (OSError, TypeError):
                continue
            if start <= line < start + len(lines):
                return cls.__name__
    return None
