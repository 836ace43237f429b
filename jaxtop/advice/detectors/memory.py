"""The devices and the memory profiles: memory held by steps queued ahead of
the device (run-ahead), lines whose arrays keep growing (leaks), holes among
the live buffers (fragmentation)."""

from __future__ import annotations

import statistics

from jaxtop.advice.detectors.base import Found, Window, short
from jaxtop.advice.types import INFERRED, MEASURED, Advice, NotJudged
from jaxtop.wire.units import fmt_bytes

__all__ = ["fragmentation", "leak", "runahead"]

#: In use beyond the live arrays, as a median over the window, must be at
#: least this many calls of the largest jitted function, and this many bytes.
RUNAHEAD_CALLS = 2.0
RUNAHEAD_MIN_BYTES = 64 << 20
#: Readings of the window (one a second) that must show it.
RUNAHEAD_SHARE = 0.6
#: Holes among the live buffers (0-1), as a median over the window.
HOLES = 0.25
#: The allocator's fragmentation (0-1), as a median.
ALLOCATOR_FRAGMENTATION = 0.3
#: Readings a median needs.
MIN_READINGS = 3
#: A level (memory held, holes) is judged over the newest part of the
#: window: its last third, at least this many seconds. A level is the
#: program's state now; the start of a window may hold its set-up.
LEVEL_MIN_S = 10.0


def _level_start(w: Window) -> float:
    """Where the part of the window a level is judged over starts."""
    return max(w.start, w.end - max(LEVEL_MIN_S, w.span_s / 3))


def _over(w: Window, start: float) -> str:
    return f"over the last {w.end - start:.0f} s"


def runahead(w: Window) -> Found:
    if not w.ev.devices:
        return [NotJudged("runahead", "no device readings in the records")]
    ledger = w.ledger
    call = ledger.largest_call() if ledger is not None else None
    out: Found = []
    judged = False
    start = _level_start(w)
    for did, readings in w.ev.devices.items():
        rows = [r for r in readings if start <= r.t <= w.end]
        if not rows:
            continue
        if not rows[-1].allocator:
            continue
        beyond = [r.in_use - r.live for r in rows if r.in_use is not None and r.live is not None]
        if len(beyond) < MIN_READINGS:
            continue
        judged = True
        median = statistics.median(beyond)
        per_call = call.call_held_bytes if call is not None else None
        need = max(RUNAHEAD_MIN_BYTES, RUNAHEAD_CALLS * per_call) if per_call else RUNAHEAD_MIN_BYTES
        above = sum(b >= need for b in beyond)
        if median < need or above < RUNAHEAD_SHARE * len(beyond):
            continue
        name = call.name.removeprefix("jit_") if call is not None else None
        calls = f", {median / per_call:.1f} calls of `{name}` ({fmt_bytes(per_call)} each: outputs and temporaries)" \
            if per_call and name else ""
        file = line = None
        if call is not None and call.call_site:
            path, _, num = call.call_site.rpartition(":")
            if num.isdigit():
                file, line = path, int(num)
        out.append(Advice(
            strategy="runahead", file=file, line=line, function=None, jitted=name,
            title="bound how far the loop runs ahead of the device",
            evidence=f"device {did}: {fmt_bytes(median)} in use beyond the live arrays (median of {len(beyond)} "
                     f"readings {_over(w, start)}, up to {fmt_bytes(max(beyond))}){calls}: steps queued and not yet run",
            gain=f"up to -{fmt_bytes(median - (per_call or 0))} at peak (what the queued steps hold, less one step's)",
            fix="if step % k == 0: jax.block_until_ready(loss)  # k = 1-2 bounds the queue to a step or two",
            basis=MEASURED, window_s=w.span_s, score=min(1.0, median / (median + max(float(rows[-1].in_use or 0), 1.0)))))
    if not judged:
        platforms = sorted({r[-1].platform or "?" for r in w.ev.devices.values() if r})
        return [NotJudged("runahead", f"the {', '.join(platforms)} backend gives no allocator bytes in use "
                          f"(memory_stats() is None): memory beyond the live arrays cannot be measured")]
    return out


def leak(w: Window) -> Found:
    profiles = list(w.ev.profiles)
    if not profiles:
        return [NotJudged("leak", w.ev.holders_error or "no memory profile in the records: growth by line is unknown")]
    out: Found = []
    for site in profiles[-1].sites or ():
        if not site.suspect or site.file is None or site.line is None:
            continue
        g = site.growth
        rate = f"+{fmt_bytes(g.bytes_per_min)}/min" if g is not None and g.bytes_per_min else "growing"
        for_s = f" for {g.for_s:.0f} s" if g is not None and g.for_s else ""
        rises = f", {g.rises:.0f} rises in a row" if g is not None and g.rises else ""
        who = w.ev.who.get((site.file, int(site.line)))
        names = [path for path, n in sorted((who.paths or {}).items(), key=lambda kv: -(kv[1] or 0))
                 if n] if who is not None else []
        if names:
            held = (f"; kept by {', '.join(f'`{p}`' for p in names[:3])} ({who.arrays or 0:.0f} of its arrays "
                    f"searched for: {sum((who.paths or {}).values()) or 0:.0f} found under those names)")
            fix = (f"stop {names[0]} from keeping each step's arrays: keep Python numbers instead (float(x) every N "
                   f"steps), or bound it (a deque(maxlen=...)), or clear it")
        else:
            searched = (" (a search found no name of the program's that reaches them: a library, a closure or a "
                        "class attribute keeps them)" if who is not None else "")
            held = f"; jaxtop names where they were made, not who keeps them{searched}"
            fix = ("look for a list, dict or attribute that keeps each step's outputs (history.append(loss)); keep "
                   "Python numbers (float(loss) every N steps) or drop the references" +
                   ("" if who is not None else "; `k` on the Holders screen (H) names what keeps them, by the "
                    "program's own names (it walks the program's objects: a few ms to a second)"))
        out.append(Advice(
            strategy="leak", file=site.file, line=int(site.line), function=site.function, jitted=None,
            title="find what keeps this line's arrays alive" if not names else f"{names[0]} keeps this line's arrays",
            evidence=f"{short(site.file, int(site.line))} holds {fmt_bytes(site.bytes)} in {site.count or 0:.0f} "
                     f"arrays, {rate}{for_s}{rises} (memory profiles){held}",
            gain=f"the growth itself: {rate} until the device is full",
            fix=fix,
            basis=MEASURED, window_s=w.span_s,
            score=min(1.0, 0.4 + ((g.bytes_per_min or 0) / ((g.bytes_per_min or 0) + (256 << 20)) if g else 0.0))))
    return out


def fragmentation(w: Window) -> Found:
    if not w.ev.devices:
        return [NotJudged("fragmentation", "no device readings in the records")]
    out: Found = []
    judged = False
    start = _level_start(w)
    for did, readings in w.ev.devices.items():
        rows = [r for r in readings if start <= r.t <= w.end]
        frag = [r.fragmentation for r in rows if r.fragmentation is not None]
        holes = [r.holes for r in rows if r.holes is not None]
        if len(frag) >= MIN_READINGS:
            judged = True
            median = statistics.median(frag)
            if median >= ALLOCATOR_FRAGMENTATION:
                out.append(_frag_advice(w, did, f"the allocator's fragmentation {100 * median:.0f} % (median of "
                                        f"{len(frag)} readings {_over(w, start)})", median, MEASURED))
                continue
        if len(holes) >= MIN_READINGS and rows and rows[-1].platform != "cpu":
            judged = True
            median = statistics.median(holes)
            if median >= HOLES:
                out.append(_frag_advice(w, did, f"holes are {100 * median:.0f} % of the span of the live buffers "
                                        f"(median of {len(holes)} buffer maps {_over(w, start)})", median, INFERRED))
    if not judged and any(r and r[-1].platform == "cpu" for r in w.ev.devices.values()):
        # Holes among a CPU's buffers are malloc's, among the program's
        # other objects: no device pool to fragment. (Flax's miniGPT read
        # 61-86 % there, above the demo's mixed sizes at 21-49 %.)
        return [NotJudged("fragmentation", "the cpu backend has no device memory pool (memory_stats() is None): "
                          "holes among its buffers are the host heap's, not a device allocator's fragmentation")]
    if not judged:
        return [NotJudged("fragmentation", "neither the allocator's fragmentation nor a buffer map's holes were "
                          "measured in the window (the agent maps buffers when its share allows)")]
    return out


def _frag_advice(w: Window, did: object, what: str, share: float, basis: str) -> Advice:
    return Advice(
        strategy="fragmentation", file=None, line=None, function=None, jitted=None,
        title="allocate and free buffers of one size together",
        evidence=f"device {did}: {what}: buffers of mixed sizes allocated and freed one by one",
        gain=f"up to {100 * share:.0f} % of the pool back as one free block",
        fix="allocate a step's buffers as one batch of equal sizes (or one stacked array) and free them together; "
            "preallocate long-lived buffers first",
        basis=basis, window_s=w.span_s, score=0.1 + 0.3 * share)
