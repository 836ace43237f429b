"""Folding the readings of one window into measured values
(:class:`WindowState`): totals differenced over the window, process-wide
maxima isolated where the window set them, and when each limit was first
exceeded.

Pure: the in-process window feeds it readings from the agent's stream,
tests feed it readings of records made with
:func:`jaxtop.wire.records.from_dict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import msgspec

from jaxtop.budgets.sites import SiteName, parse_site_name, site_count, site_detail, unattributed, worst_sites
from jaxtop.budgets.reading import WIRE_FIELDS, Reading, wire_part, wire_value
from jaxtop.budgets.report import NOT_MEASURED, Measured
from jaxtop.budgets.spec import Budget
from jaxtop.probes.compile_storm import change_summary
from jaxtop.wire.protocol import DIRECTIONS
from jaxtop.wire.records import TopBuffer
from jaxtop.wire.units import fmt_bytes


@dataclass
class CompileSite:
    """Compiles of one function at one call site within a window.

    Attributes:
        name: the function (``jit(step)``), as jax names it.
        site: ``file:line (function)`` of the program's call that compiled it.
        count: compiles in the window.
        recompiled_t: when it was compiled the second time (epoch seconds).
        eager: compiled by jax's eager dispatch (an op run outside jit, such
            as ``jnp.ones(n)`` at top level or a model's initialisers): one
            compile per primitive, shape and dtype, never a recompile.
        reasons: the jit ledger's recompile reasons of these compiles (what
            changed: ``{"kind": "types", "arg": "x", "old": "f32[10]",
            "new": "f32[100]"}``), the first few and the newest.
    """

    name: str
    site: str
    count: int = 0
    recompiled_t: float | None = None
    eager: bool = False
    reasons: list[dict[str, Any]] = field(default_factory=list)


class WindowState:
    """Folds readings taken during a window into measured values.

    Pure: the in-process :class:`Window` feeds it readings from the agent's
    stream, tests feed it readings of records made with ``from_dict``.

    Args:
        limits: the budget (for the time each limit was first exceeded).
        start: the reading at the window's start; None when the window
            starts with the agent (every total is then counted from zero
            and a process-wide maximum is the window's own).
        start_t: when the window started (epoch seconds).
    """

    def __init__(self, limits: Budget, start: Reading | None, start_t: float) -> None:
        self.budget = limits
        self.start = start
        self.start_t = start_t
        self.first: dict[str, float] = {}
        self.readings = 0
        # Per device: the largest value seen and the reading's details then.
        self.peak: dict[Any, tuple[int, float, list[TopBuffer] | None]] = {}
        self.peak_rss: int | None = None
        self.wire_max: dict[str, float] = {}
        self.last_top: dict[Any, list[TopBuffer]] = {}

    # -- values at one reading --------------------------------------------------------
    def _total(self, reading: Reading, name: str) -> float | None:
        s = self.start
        if name in DIRECTIONS or name == "transfers":
            if reading.counts is None:
                return None
            dirs = DIRECTIONS if name == "transfers" else (name,)
            base = s.counts if s is not None and s.counts is not None else {}
            return float(sum(reading.counts[d] - base.get(d, 0) for d in dirs))
        if name.endswith("_bytes") and name[:-6] in DIRECTIONS:
            d = name[:-6]
            if reading.counts is None:
                return None
            return float(reading.bytes_known.get(d, 0) - (s.bytes_known.get(d, 0) if s is not None else 0))
        if name == "compiles":
            if reading.compiles is None:
                return None
            return float(reading.compiles - ((s.compiles or 0) if s is not None else 0))
        if name in WIRE_FIELDS and WIRE_FIELDS[name][2] == "total":
            now = wire_value(reading, name)
            if now is None:
                return None
            if s is None:
                return now
            before = wire_value(s, name)
            return None if before is None else now - before
        site = parse_site_name(name)
        if isinstance(site, SiteName):
            now = site_count(reading.fields.transfer_sites, site)
            if now is None:
                return None
            return float(now - ((site_count(s.fields.transfer_sites, site) or 0) if s is not None else 0))
        return None

    def _sites(self, end: Reading | None) -> dict[str, Measured]:
        """Every per-line limit of the budget (``h2d@train.py:27``)."""
        out: dict[str, Measured] = {}
        for limit in self.budget.limits:
            site = parse_site_name(limit.name)
            if not isinstance(site, SiteName):
                continue
            value = self._total(end, limit.name) if end is not None else None
            if value is None:
                out[limit.name] = Measured(na="transfers were not attributed to lines (no transfer_sites field: "
                                           "the agent's stderr capture or jax's post hook is off)")
                continue
            unknown = ((unattributed(end.fields.transfer_sites) or 0)
                       - ((unattributed(self.start.fields.transfer_sites) or 0) if self.start else 0))
            m = Measured(value=value, first_exceeded_s=self.first.get(limit.name))
            m.detail = site_detail(end.fields.transfer_sites, site)
            if unknown > 0 and value <= limit.value:
                # The line may have made some of them: no pass on a lower bound.
                m = Measured(na=f"{unknown} implicit transfer(s) in the window could not be tied to a line; "
                             f"{int(value)} were made at {site.path}:{site.line}")
            out[limit.name] = m
        return out

    def _isolated(self, now: int | None, before: int | None) -> int | None:
        """A process-wide maximum as the window's: known only when the window
        starts with the process, or when the maximum rose during it."""
        if now is None:
            return None
        if self.start is None or before is None or now > before:
            return now
        return None

    def _device_peak(self, reading: Reading) -> tuple[int, Any] | None:
        best: tuple[int, Any] | None = None
        for dev in reading.devices.values():
            value: int | None
            if dev.source == "memory_stats":
                before = self.start.devices.get(dev.id) if self.start is not None else None
                value = self._isolated(dev.peak, before.peak if before is not None else None)
            elif dev.scanned_t is not None and dev.scanned_t >= self.start_t:
                value = dev.in_use  # live arrays scanned within the window
            else:
                value = None
            if value is not None and (best is None or value > best[0]):
                best = (value, dev.id)
        return best

    def observe(self, reading: Reading) -> None:
        """Take one reading made during the window."""
        self.readings += 1
        for dev in reading.devices.values():
            if dev.top is not None:
                self.last_top[dev.id] = dev.top
        peak = self._device_peak(reading)
        if peak is not None:
            value, dev_id = peak
            old = self.peak.get(dev_id)
            if old is None or value > old[0]:
                self.peak[dev_id] = (value, reading.t, self.last_top.get(dev_id))
        rss = self._isolated(reading.peak_rss, self.start.peak_rss if self.start is not None else None)
        if rss is not None:
            self.peak_rss = max(self.peak_rss or 0, rss)
        for name, (_f, _k, kind) in WIRE_FIELDS.items():
            if kind == "max":
                v = wire_value(reading, name)
                if v is not None and (self.start is None or v > (wire_value(self.start, name) or -1)):
                    self.wire_max[name] = max(self.wire_max.get(name, 0.0), v)
        for limit in self.budget.limits:
            if limit.name in self.first:
                continue
            value = self._value_now(reading, limit.name)
            if value is not None and value > limit.value:
                self.first[limit.name] = max(0.0, reading.t - self.start_t)

    def _value_now(self, reading: Reading, name: str) -> float | None:
        if name == "peak":
            return float(max((v for v, _t, _top in self.peak.values()), default=0)) if self.peak else None
        if name == "peak_rss":
            return None if self.peak_rss is None else float(self.peak_rss)
        if name in WIRE_FIELDS and WIRE_FIELDS[name][2] == "max":
            return self.wire_max.get(name)
        return self._total(reading, name)

    # -- the end ----------------------------------------------------------------------
    def finish(
        self,
        end: Reading | None,
        end_t: float,
        exact: Mapping[str, int] | None = None,
        transfer_na: Mapping[str, str] | None = None,
        compile_sites: Iterable[CompileSite] | None = None,
        compile_na: str | None = None,
        stream_na: str | None = None,
        shapes: Mapping[tuple[str, str], int] | None = None,
        shapes_complete: bool | None = None,
        end_scanned: bool = True,
    ) -> dict[str, Measured]:
        """Measured values for every name, the window ending at ``end``.

        Args:
            end: the reading taken after the window's end (None: the stream
                could not be read; ``stream_na`` says why).
            end_t: when the window ended.
            exact: exact totals over the window from the agent itself
                (``h2d``, ``d2h``, ``d2d``, ``compiles``); they win over the
                stream's, which may lag a sample.
            transfer_na: directions whose transfers were not counted, and why.
            compile_sites: the window's compiles per function and call site
                (None: not known; ``compile_na`` says why).
            shapes: exact transfer counts per (direction, shape) over the
                window, when the agent provides them; else the stream's 5
                most frequent shapes are differenced.
            shapes_complete: whether ``shapes`` lists every shape.
            end_scanned: whether the end reading's live-array bytes were
                scanned after the window ended (CPU ``in_use``).
        """
        if end is not None:
            self.observe(end)
        out: dict[str, Measured] = {}
        seconds = max(0.0, end_t - self.start_t)
        # The reading after the end is taken a little later: what it shows
        # for the first time happened by the end.
        self.first = {k: min(v, seconds) for k, v in self.first.items()}
        self._seconds = seconds
        exact = dict(exact or {})
        transfer_na = dict(transfer_na or {})
        no_stream = stream_na or "the agent's stream could not be read"

        def first(name: str) -> float | None:
            return self.first.get(name)

        # transfers
        for d in DIRECTIONS:
            if d in transfer_na:
                out[d] = Measured(na=transfer_na[d])
                continue
            value = exact.get(d)
            if value is None and end is not None:
                value = self._total(end, d)
            if value is None:
                out[d] = Measured(na=no_stream)
                continue
            m = Measured(value=float(value), first_exceeded_s=first(d))
            if end is not None and value:
                # The lines that made them first, then their shapes.
                worst = worst_sites(self.start.fields.transfer_sites if self.start else None,
                                    end.fields.transfer_sites, d)
                m.detail = [f"{count} at {text}" for count, text in worst]
                m.data["sites"] = [{"count": count, "site": text} for count, text in worst]
            self._shape_detail(m, d, end, shapes, shapes_complete)
            out[d] = m
        if any(d in transfer_na for d in DIRECTIONS):
            out["transfers"] = Measured(na="; ".join(sorted(set(transfer_na.values()))))
        elif all(out[d].value is not None for d in DIRECTIONS):
            out["transfers"] = Measured(value=sum(out[d].value or 0 for d in DIRECTIONS),
                                        first_exceeded_s=first("transfers"))
            out["transfers"].detail = [line for d in DIRECTIONS for line in out[d].detail]
        else:
            out["transfers"] = Measured(na=no_stream)
        for d in (*DIRECTIONS, "transfers"):
            m = out[d]
            if m.value is None:
                out[f"{d}_per_s"] = Measured(na=m.na)
            elif seconds <= 0:
                out[f"{d}_per_s"] = Measured(na="the window took no measurable time")
            else:
                out[f"{d}_per_s"] = Measured(value=m.value / seconds, note=f"{int(m.value)} in {seconds:.2f} s")
        for d in DIRECTIONS:
            name = f"{d}_bytes"
            if d in transfer_na:
                out[name] = Measured(na=transfer_na[d])
            elif end is None:
                out[name] = Measured(na=no_stream)
            else:
                value = self._total(end, name)
                m = Measured(value=value, first_exceeded_s=first(name))
                unknown = end.bytes_unknown.get(d, 0) - (self.start.bytes_unknown.get(d, 0) if self.start else 0)
                if unknown > 0:
                    m.note = (f"a lower bound: {unknown} transfer(s) logged no shape "
                              "(a cached jit call logs none)")
                self._shape_detail(m, d, end, shapes, shapes_complete)
                out[name] = m
        # compiles
        if "compiles" in exact:
            out["compiles"] = Measured(value=float(exact["compiles"]), first_exceeded_s=first("compiles"))
        elif end is not None and self._total(end, "compiles") is not None:
            out["compiles"] = Measured(value=self._total(end, "compiles"), first_exceeded_s=first("compiles"))
        else:
            out["compiles"] = Measured(na=compile_na or no_stream)
        if compile_sites is None:
            out["recompiles"] = Measured(na=compile_na or NOT_MEASURED)
        else:
            out["recompiles"] = self._recompiles(list(compile_sites))
        if "compiles" in out and out["compiles"].value and compile_sites is not None:
            sites = sorted(compile_sites, key=lambda c: -c.count)
            out["compiles"].detail = [f"{c.name} at {c.site}: compiled {c.count} time(s)" for c in sites[:8]]
        # memory
        out["peak"] = self._peak_measured(end)
        out["in_use"] = self._in_use(end, end_scanned, no_stream)
        out["peak_rss"] = self._peak_rss(end, no_stream)
        # figures of other probes (the sparse parts kept)
        for name, (fname, key, kind) in WIRE_FIELDS.items():
            if end is None or wire_part(end, name) is None:
                out[name] = Measured(na=NOT_MEASURED)
                continue
            if kind == "total":
                value = self._total(end, name)
                out[name] = (Measured(value=value, first_exceeded_s=first(name)) if value is not None
                             else Measured(na=NOT_MEASURED if wire_value(end, name) is None
                                           else f"{fname}.{key} was not sent at the window's start"))
            else:
                now = wire_value(end, name)
                if now is None:
                    out[name] = Measured(na=NOT_MEASURED)
                elif name in self.wire_max:
                    out[name] = Measured(value=self.wire_max[name], first_exceeded_s=first(name))
                else:
                    out[name] = Measured(at_most=now, na=f"{fname}.{key} is a process-wide maximum set before "
                                         f"this window ({int(now)}); the window's own cannot be isolated")
        if "host_syncs" in exact:  # the probe's own count at both edges: exact, up to the window's end
            out["host_syncs"] = Measured(value=float(exact["host_syncs"]), first_exceeded_s=first("host_syncs"))
        out.update(self._sites(end))
        return out

    def _shape_detail(self, m: Measured, d: str, end: Reading | None,
                      shapes: Mapping[tuple[str, str], int] | None, complete: bool | None) -> None:
        if shapes is not None:
            per = {s: n for (dd, s), n in shapes.items() if dd == d and n > 0}
            partial = not complete
        elif end is not None:
            per = {}
            partial = not end.shapes_complete
            start = self.start
            for (dd, s), n in end.shapes.items():
                if dd != d:
                    continue
                before = 0
                if start is not None:
                    if (dd, s) in start.shapes:
                        before = start.shapes[(dd, s)]
                    elif not start.shapes_complete:
                        partial = True  # not listed then: its count then is unknown
                        continue
                if n - before > 0:
                    per[s] = n - before
        else:
            return
        if not per:
            return
        ranked = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ", ".join(f"{s} x{n}" for s, n in ranked[:8])
        scope = " (among the most frequent shapes of the process)" if partial else ""
        m.detail.append(f"shapes{scope}: {text}")
        m.data["shapes"] = [{"shape": s, "count": n} for s, n in ranked]
        m.data["shapes_complete"] = not partial

    def _recompiles(self, sites: list[CompileSite]) -> Measured:
        again = [c for c in sites if c.count > 1 and not c.eager]
        value = float(sum(c.count - 1 for c in again))
        m = Measured(value=value)
        times = [c.recompiled_t for c in again if c.recompiled_t is not None]
        if times:
            m.first_exceeded_s = max(0.0, min(times) - self.start_t)
        again.sort(key=lambda c: (-c.count, c.site))
        m.detail = [f"{c.name} at {c.site}: compiled {c.count} times ({c.count - 1} recompile(s))"
                    + (f": {change_summary(c.reasons)}" if c.reasons else "") for c in again[:8]]
        if len(again) > 8:
            m.detail.append(f"... and {len(again) - 8} more function(s)")
        eager = sum(c.count for c in sites if c.eager)
        m.data["eager_compiles"] = eager
        if eager:
            m.detail.append(f"not counted: {eager} compile(s) of ops run outside jit (jax's eager dispatch, "
                            "one per primitive and shape)")
        m.data["functions"] = [{"name": c.name, "site": c.site, "compiles": c.count,
                                "changed": change_summary(c.reasons)} for c in again]
        return m

    def _peak_measured(self, end: Reading | None) -> Measured:
        if self.peak:
            dev_id, (value, t, top) = max(self.peak.items(), key=lambda kv: kv[1][0])
            source = end.devices[dev_id].source if end is not None and dev_id in end.devices else ""
            m = Measured(value=float(value), first_exceeded_s=self.first.get("peak"))
            t_s = min(max(0.0, t - self.start_t), getattr(self, "_seconds", math.inf))
            when = f"{t_s:.2f} s in"
            m.detail.append(f"device {dev_id}: {fmt_bytes(value)} ({when})")
            if source == "live_arrays":
                m.note = "live-array bytes, sampled: arrays that lived between two scans are missed"
            if top:
                m.detail.append("largest live buffers then: " + _buffers(top))
            # The report's JSON holds each buffer as the agent sent it.
            m.data = {"device": dev_id, "t_s": round(t_s, 6), "source": source,
                      "top": msgspec.to_builtins(list(top or [])[:10])}
            return m
        if end is None or not end.devices:
            return Measured(na="no device memory seen (the program created no JAX backend, "
                               "or the stream could not be read)")
        if any(d.source == "memory_stats" for d in end.devices.values()):
            bound = max((d.peak or 0) for d in end.devices.values())
            return Measured(at_most=float(bound),
                            na=f"peak_bytes_in_use is a process-lifetime maximum, set before this window "
                               f"({fmt_bytes(bound)}): the window's own peak cannot be isolated")
        return Measured(na="no live-array scan during the window (CPU peaks are sampled)")

    def _in_use(self, end: Reading | None, scanned: bool, no_stream: str) -> Measured:
        if end is None:
            return Measured(na=no_stream)
        best: tuple[int, Any] | None = None
        for dev in end.devices.values():
            if dev.source != "memory_stats" and not scanned:
                return Measured(na="no live-array scan after the window ended")
            if dev.in_use is not None and (best is None or dev.in_use > best[0]):
                best = (dev.in_use, dev.id)
        if best is None:
            return Measured(na="no device memory seen (the program created no JAX backend)")
        m = Measured(value=float(best[0]))
        m.detail.append(f"device {best[1]}: {fmt_bytes(best[0])} at the end")
        top = self.last_top.get(best[1])
        if top:
            m.detail.append("largest live buffers: " + _buffers(top))
        return m

    def _peak_rss(self, end: Reading | None, no_stream: str) -> Measured:
        if self.peak_rss is not None:
            return Measured(value=float(self.peak_rss), first_exceeded_s=self.first.get("peak_rss"))
        if end is None or end.peak_rss is None:
            return Measured(na=no_stream if end is None else "the agent reports no peak RSS here")
        return Measured(at_most=float(end.peak_rss),
                        na=f"peak RSS is a process-lifetime maximum, set before this window "
                           f"({fmt_bytes(end.peak_rss)}): the window's own cannot be isolated")


def _buffers(top: list[TopBuffer]) -> str:
    """The five largest of a scan's buffers: ``float32[32, 32] 4.00 KiB, ...``."""
    return ", ".join(f"{b.dtype}{b.shape} {fmt_bytes(b.nbytes)}" for b in top[:5])
