"""The Perfetto (Chrome trace-event JSON) writer of ``jaxtop export``
(:func:`jaxtop.export.formats.write_perfetto` drives it): counter tracks per
device and for the process, instants for compiles, failed donations and the
agent's events. docs/protocol.md ("Exports") lists its events."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from itertools import repeat
from operator import is_not, itemgetter
from typing import IO, Any

from jaxtop.export import typed
from jaxtop.export.shapes import ShapeFormats
from jaxtop.export.typed import UNSET
from jaxtop.wire.protocol import D2D, D2H, H2D

_MEMORY_KEYS = ("bytes_in_use", "pool_bytes", "peak_bytes_in_use", "bytes_limit")
_NONES = repeat(None)
_finite = typed.finite
_is_int = typed.is_int


def _ts(t: Any) -> int | None:
    """Trace timestamp (µs) of a record time, or None when it has none."""
    if not _finite(t):
        return None
    us = t * 1e6
    return round(us) if math.isfinite(us) else None




class PerfettoWriter:
    """Counter tracks ("ph": "C") per device for memory and fragmentation, per
    process for transfers per second and RSS; instant events ("ph": "i") for
    compiles, failed donations and the agent's events."""

    SAMPLE = typed.TraceSample

    def __init__(self, out: IO[str], part: bool = False) -> None:
        """``part``: write only events, each after a comma (a piece of a file
        written in parallel)."""
        self.out = out
        self.part = part
        if not part:
            out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        self.first = not part  # no event written yet: the next goes without a comma
        self.pid = 0
        self.last_t: float | None = None
        self.last_compiles: int | None = None
        self.last_failed: int | None = None
        # The counters' format per sample shape (which devices, which of
        # their values are numbers), and its values' getter.
        self._shapes = ShapeFormats(self._shape_format)

    def state(self) -> list[Any]:
        """What the events of the next sample depend on besides the sample."""
        return [self.pid, self.last_t, self.last_compiles, self.last_failed]

    def set_state(self, state: list[Any]) -> None:
        self.pid, self.last_t, self.last_compiles, self.last_failed = state

    def _write(self, text: str) -> None:
        """Write events formatted as ',\\n{...}' (the first without its comma)."""
        if text:
            if self.first:
                text = text[1:]
                self.first = False
            self.out.write(text)

    def _instant(self, name: str, ts: int, args: dict[str, Any] | None = None) -> str:
        event: dict[str, Any] = {"ph": "i", "name": name, "s": "p", "ts": ts, "pid": self.pid, "tid": 0}
        if args is not None:
            event["args"] = args
        return ",\n" + json.dumps(event, separators=(",", ":"))

    def _counter(self, name: str, ts: int, args: list[tuple[str, Any]]) -> str:
        body = ",".join([f'"{k}":{v!r}' for k, v in args if _finite(v)])
        if not body:
            return ""
        return f',\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{self.pid},"tid":0,"args":{{{body}}}}}'

    def _user_counter(self, name: str, ts: int, args: list[tuple[str, Any]]) -> str:
        """A counter whose series are named by the program (tree names, call
        sites): escaped, as any text may be in them."""
        body = ",".join([f"{json.dumps(k)}:{v!r}" for k, v in args if _finite(v)])
        if not body:
            return ""
        return f',\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{self.pid},"tid":0,"args":{{{body}}}}}'

    def _instants(self, ts: int, compiles: Any, failed: Any, message: Any) -> str:
        text = ""
        if _is_int(compiles):
            if self.last_compiles is not None and compiles > self.last_compiles:
                text += self._instant(f"compile ×{compiles - self.last_compiles}", ts, {"compiles_total": compiles})
            self.last_compiles = compiles
        if _is_int(failed):
            if self.last_failed is not None and failed > self.last_failed:
                text += self._instant("donation failed", ts, {"message": message})
            self.last_failed = failed
        return text

    def other(self, rec: typed.Other) -> None:
        ts = _ts(rec.t)
        if ts is None:
            return
        if rec.type == "hello":
            self.pid = rec.pid if _is_int(rec.pid) else 0
            name = " ".join(str(a) for a in rec.argv) if rec.argv is not None else ""
            event = {"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                     "args": {"name": f"{name or f'pid {self.pid}'} (pid {self.pid})"}}
            self._write(",\n" + json.dumps(event, separators=(",", ":")))
        elif rec.type == "exit":
            self._write(self._instant("process exited", ts))

    def sample(self, s: typed.TraceSample) -> None:
        """A sample's counters and instants.

        Its counters' text is the same from one sample to the next but for
        the numbers, as long as the same values are numbers: that text is
        made once per such shape (:meth:`_shape_format`) and filled in.
        (Every counter value is a finite number or None: typed.TraceSample.)"""
        t = s.t
        ts = _ts(t)
        if ts is None:
            return
        ids = []  # the devices with a track: an integer id
        values: list[Any] = [str(ts)]  # the timestamp, then each counter's values, None where the sample has none
        for dev in s.devices or ():
            did = dev.id
            if did.__class__ is int:  # an int, not a bool
                ids.append(did)
                values += (dev.bytes_in_use, dev.pool_bytes, dev.peak_bytes_in_use, dev.bytes_limit, dev.fragmentation)
        rates = None  # the directions whose rate is a number; None: no rate this sample
        last = self.last_t
        if last is not None and t > last:
            dt = t - last
            rates = []
            tr = s.transfers
            if tr is not None:
                for d, x in ((H2D, tr.h2d), (D2H, tr.d2h), (D2D, tr.d2d)):
                    if x is not None and x.count is not None:
                        rate = (0 if x.count is UNSET else x.count) / dt
                        if rate - rate == 0.0:  # finite
                            rates.append(d)
                            values.append(rate)
            rates = tuple(rates)
        self.last_t = t
        values.append(None if s.process is None else s.process.rss_bytes)
        key = (self.pid, tuple(ids), rates, tuple(map(is_not, values, _NONES)))
        fmt, pick = self._shapes.get(key)
        text = fmt % pick(values)
        don, comp = s.donation, s.compile
        compiles = None if comp is None else comp.count_total
        failed = None if don is None else don.failed_total
        if compiles != self.last_compiles or failed != self.last_failed:  # equal: _instants would do nothing
            text += self._instants(ts, compiles, failed, None if don is None else don.last_message)
        if s.events or s.holders is not None or s.labels is not None or s.host_syncs is not None:
            text += self._events(s.events, ts) + self._sparse(s, ts)
        self._write(text)

    @staticmethod
    def _shape_format(key: tuple[Any, ...]) -> tuple[str, Callable[[list[Any]], tuple[Any, ...]]]:
        """The counters of :meth:`sample` for one shape, as :meth:`_counter`
        writes them: a %-format (``%r`` of an int or a float is what
        _counter writes) and what picks its values from the sample's list
        (each counter's timestamp, as text, then its numbers)."""
        pid, ids, rates, present = key
        # The format opens with "%.0s", which takes the timestamp and writes
        # nothing: a sample with no counter still has a getter (of one item,
        # which returns it bare; % takes a bare value as well).
        picks = [0]

        def counter(name: str, keys: tuple[str, ...], at: int) -> str:
            have = [(k, at + i) for i, k in enumerate(keys) if present[at + i]]
            if not have:
                return ""
            picks.extend([0, *(i for _, i in have)])
            body = ",".join(f'"{k}":%r' for k, _ in have)
            # Names are the program's numbers and fixed words: a "%" in one is escaped.
            return (f',\n{{"ph":"C","name":"{name.replace("%", "%%")}","ts":%s,"pid":{pid},"tid":0,'
                    f'"args":{{{body}}}}}')

        text = ""
        at = 1
        for did in ids:
            text += counter(f"device {did} memory (bytes)", _MEMORY_KEYS, at)
            text += counter(f"device {did} fragmentation", ("fragmentation",), at + 4)
            at += 5
        if rates is not None:
            text += counter("implicit transfers/s", rates, at)
            at += len(rates)
        text += counter("host RSS (bytes)", ("rss",), at)
        return "%.0s" + text, itemgetter(*picks)

    def _events(self, events: list[dict[str, Any]] | None, ts: int) -> str:
        """The agent's events of a sample, as instants at their own time (the
        sample's when they have none): the profiler's trace merged beside
        them (``--with-jax-profile``) lines up to the microsecond. An event
        is an object of its kind's own fields (jaxtop.wire.records.core):
        its ``kind`` names the instant, the rest are its args."""
        text = ""
        for ev in events or ():
            own = _ts(ev.get("t"))
            text += self._instant(str(ev.get("kind", "event")), ts if own is None else own,
                                  {k: v for k, v in ev.items() if k not in ("kind", "t")})
        return text

    #: Sites of a holders profile drawn as counters: the largest by bytes.
    HOLDER_SITES = 10

    def _sparse(self, s: typed.TraceSample, ts: int) -> str:
        """Counters for the sparse fields: bytes per labelled tree, the
        largest allocation sites' bytes, host reads so far."""
        text = ""
        if s.labels is not None and s.labels.trees is not None:
            args = [(str(tree.name), tree.bytes) for tree in s.labels.trees]
            if args:
                text += self._user_counter("labelled trees (bytes)", ts, args)
        if s.holders is not None and s.holders.sites is not None:
            top = sorted((site for site in s.holders.sites if _finite(site.bytes)),
                         key=lambda site: -site.bytes)[: self.HOLDER_SITES]
            if top:
                text += self._user_counter("memory by allocation site (bytes)", ts,
                                           [(str(site.site) + (f" {site.function}" if site.function else ""),
                                             site.bytes) for site in top])
        if s.host_syncs is not None and _finite(s.host_syncs.count):
            text += self._counter("host reads of device arrays", ts, [("total", s.host_syncs.count)])
        return text

    def close(self) -> None:
        if not self.part:
            self.out.write("\n]}\n")


