"""What the jit ledger keeps of one executable, and of one function name.

:func:`analyse` reads a loaded executable once (module name, fingerprint,
``get_compiled_memory_stats()``, ``cost_analysis()``, the call that compiled
it) into an :class:`_Exe`; a :class:`_Fn` follows one function name's
compiles, recompile reasons and live executables.

Stdlib and jax only: this runs in the user's job.
"""

from __future__ import annotations

import collections
from typing import Any

from jaxtop.probes.cache_misses import MAX_KEY, name_key
from jaxtop.probes.frames import eager_frames, user_frame
from jaxtop.probes.jit_donatable import donatable_args

#: Size fields of ``CompiledMemoryStats`` → the ledger's names.
_DEVICE_SIZES = (
    ("argument_bytes", "argument_size_in_bytes"),
    ("output_bytes", "output_size_in_bytes"),
    ("alias_bytes", "alias_size_in_bytes"),
    ("temp_bytes", "temp_size_in_bytes"),
    ("code_bytes", "generated_code_size_in_bytes"),
)
_HOST_SIZES = tuple((ours, "host_" + theirs) for ours, theirs in _DEVICE_SIZES)


class _Exe:
    """What the ledger knows of one live executable (never the executable itself:
    holding it would keep it loaded)."""

    __slots__ = ("id", "tb", "fingerprint", "key", "row", "weight", "site", "code", "all_code", "eager")

    def __init__(self, ident: int, tb: Any, fingerprint: Any, key: str, row: dict[str, Any]) -> None:
        self.id = ident
        # The traceback object outlives nothing but itself; while the ledger
        # holds it, a new executable that reuses a freed one's id() has
        # another traceback, so the cache never mistakes one for the other.
        self.tb = tb
        self.fingerprint = fingerprint
        self.key = key
        self.row = row
        sizes = [row.get(k) for k in ("argument_bytes", "output_bytes", "temp_bytes")]
        alias = row.get("alias_bytes") or 0
        self.weight = sum(s for s in sizes if s) - alias
        self.site = row.get("call_site")
        self.code = row.get("code_bytes") or 0  # device side
        self.all_code = self.code + (row.get("host", {}).get("code_bytes") or 0)
        self.eager = bool(row.get("eager"))

    def same(self, e: Any) -> bool:
        """Is ``e`` (whose id() is this entry's key) the executable analysed here?"""
        tb = getattr(e, "traceback", None)
        return self.tb is tb and (tb is not None or self.fingerprint == getattr(e, "fingerprint", None))


class _Fn:
    """One function name's history: compiles, recompile reasons, sightings.

    ``live`` (ledger id → entry), ``code`` (their device code bytes) and
    ``largest`` follow the live executables incrementally; ``row`` is the
    function's row as last built, None once anything in it changed.
    """

    __slots__ = ("key", "compiles", "compile_s", "seen_exes", "reasons", "reasons_total", "first_t", "last_t",
                 "live", "code", "largest", "call_site", "defined_at", "row", "eager_compiles", "first_reason")

    def __init__(self, key: str, max_reasons: int) -> None:
        self.key = key
        self.compiles = 0  # from jax.monitoring
        self.compile_s = 0.0
        self.seen_exes = 0  # distinct executables seen by the passes
        self.reasons: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_reasons)
        self.reasons_total = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.live: dict[int, _Exe] = {}
        self.code = 0
        self.largest: _Exe | None = None  # None with live executables: to be found again
        self.call_site: str | None = None
        self.defined_at: str | None = None
        self.row: dict[str, Any] | None = None
        self.eager_compiles = 0  # compiles by jax's eager dispatch (ops outside jit)
        # Its first recompile reason, kept past the newest max_reasons: where
        # a run of changes started (f32[10] → f32[11] → … → f32[4000]).
        self.first_reason: dict[str, Any] | None = None

    def add_reason(self, reason: dict[str, Any]) -> None:
        """One more recompile reason (the newest)."""
        if self.first_reason is None:
            self.first_reason = reason
        self.reasons.append(reason)
        self.reasons_total += 1

    def story(self) -> list[dict[str, Any]]:
        """Its recompile reasons kept, oldest first, led by its first one."""
        reasons = list(self.reasons)
        if self.first_reason is not None and (not reasons or reasons[0] is not self.first_reason):
            reasons.insert(0, self.first_reason)
        return reasons

    def touch(self, t: float) -> None:
        if self.first_t is None or t < self.first_t:
            self.first_t = t
        if self.last_t is None or t > self.last_t:
            self.last_t = t

    def add(self, entry: _Exe) -> None:
        had = bool(self.live)
        self.live[entry.id] = entry
        self.code += entry.code
        # Ties go to the newest (as in largest_entry).
        if not had or (self.largest is not None and entry.weight >= self.largest.weight):
            self.largest = entry

    def remove(self, entry: _Exe) -> None:
        if self.live.pop(entry.id, None) is None:
            return
        self.code -= entry.code
        if self.largest is entry:
            self.largest = None

    def largest_entry(self) -> _Exe | None:
        if self.largest is None and self.live:
            self.largest = max(reversed(self.live.values()), key=lambda e: e.weight)
        return self.largest


def analyse(e: Any, ident: int, now: float) -> _Exe:
    """Everything the ledger keeps of one executable: called once per executable.

    Args:
        e: a loaded executable (``client.live_executables()``).
        ident: the ledger's id for it.
        now: when it was first seen (Unix time).
    """
    row: dict[str, Any] = {"id": ident}
    try:
        name = e.hlo_modules()[0].name
    except Exception:
        name = "?"
    row["name"] = name if len(name) <= MAX_KEY else name[:MAX_KEY - 1] + "…"
    fingerprint = getattr(e, "fingerprint", None)
    if isinstance(fingerprint, bytes):
        # CPU gives printable text; a TPU gives the raw digest (32 bytes,
        # control characters among them, recorded on a v5e): hex, as text.
        text = fingerprint.decode("ascii", "replace")
        row["fingerprint"] = text if text.isprintable() else fingerprint.hex()
    elif fingerprint is not None:
        row["fingerprint"] = str(fingerprint)
    else:
        row["fingerprint"] = None
    try:
        stats = e.get_compiled_memory_stats()
    except Exception as exc:
        stats = None
        row["stats_reason"] = f"get_compiled_memory_stats() failed: {type(exc).__name__}: {exc}"
    for ours, theirs in _DEVICE_SIZES:
        value = getattr(stats, theirs, None) if stats is not None else None
        row[ours] = int(value) if isinstance(value, int) and value >= 0 else None
    host = {}
    for ours, theirs in _HOST_SIZES:
        value = getattr(stats, theirs, None) if stats is not None else None
        if isinstance(value, int) and value > 0:
            host[ours] = int(value)
    if host:
        row["host"] = host
    peak = getattr(stats, "peak_memory_in_bytes", None) if stats is not None else None
    row["peak_bytes"] = int(peak) if isinstance(peak, int) and peak >= 0 else None
    try:
        cost = e.cost_analysis()
        if isinstance(cost, (list, tuple)):  # older jaxlibs: one dict per module
            cost = cost[0] if cost else {}
        if not isinstance(cost, dict):
            raise TypeError(f"cost_analysis() returned {type(cost).__name__}")
        # XLA lists only the properties that are not zero.
        row["flops"] = float(cost.get("flops", 0.0))
        row["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
    except Exception as exc:
        row["flops"] = row["bytes_accessed"] = None
        row["cost_reason"] = f"cost_analysis() failed: {type(exc).__name__}: {exc}"
    tb = getattr(e, "traceback", None)
    row["call_site"] = row["call_fn"] = None
    if tb is None:
        row["call_site_reason"] = "no traceback recorded for this executable"
    else:
        try:
            # The call site is the program's own line that called the jitted
            # function: the innermost frame of the user's code.
            frames = [(f.function_name, f.file_name, f.line_num) for f in tb.frames]  # innermost first
            if eager_frames(frames):
                # Compiled by jax's eager dispatch: an op run outside jit.
                row["eager"] = True
            site = user_frame(frames)
            if site is not None:
                row["call_site"] = f"{site[0]}:{site[1]}"
                row["call_fn"] = site[2]
            else:
                row["call_site_reason"] = ("compiled from library code only (jax, jaxtop, installed packages "
                                           "or the standard library)")
        except Exception as exc:
            row["call_site_reason"] = f"traceback unreadable: {type(exc).__name__}: {exc}"
    if not row.get("eager") and row.get("alias_bytes") == 0 and row.get("output_bytes"):
        # Which arguments its outputs could be written into: a donation
        # fix's donate_argnames (where none is aliased yet).
        try:
            found = donatable_args(e)
        except Exception:
            found = None
        if found is not None and found[0]:
            row["donatable"], row["donatable_nnx"] = found
    row["first_t"] = round(now, 3)
    return _Exe(ident, tb, fingerprint, name_key(name), row)
