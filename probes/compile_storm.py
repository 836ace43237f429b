"""Compile storms: one function compiled again and again, and why.

A program that meets a new shape on every step compiles on every step: an op
run eagerly over ever-new shapes (``jnp.sin(x[:n])`` in a loop), a jitted
step fed unpadded batches, a static argument that keeps changing, or jit
closures created in a loop. Each compile costs milliseconds to seconds, and
jax keeps the executables. The leak flag may say nothing (an op's
executables are left out of the count it follows, and a cache may free as
many as it adds): the compile events do.

:class:`StormDetector` counts compiles per function in one-second buckets
over a trailing window and says when one function keeps compiling: at
least ``min_compiles`` compiles in ``window_s`` seconds, spread over at least
``min_span_s`` seconds (a model's set-up compiles hundreds of ops in a burst,
each a few times: no storm). :func:`storm_cause` words what the jit ledger
already knows of that function (an op and how many shapes, the argument
whose shape changed and how, a new closure each time), and
:func:`change_summary` the recompile reasons of one function in one phrase
(the budget report uses it too).

Stdlib only: this runs in the user's job.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["StormDetector", "change_summary", "display_name", "storm_cause"]

_DTYPE = re.compile(r"^([A-Za-z]+\d*)\[(.*)\]$")


class StormDetector:
    """Compiles per function over a trailing window; the function that storms.

    Not thread-safe: the jit ledger calls it under its lock.

    Args:
        window_s: the trailing window compiles are counted over.
        min_compiles: least compiles of one function in the window that make a storm.
        min_span_s: least time between that function's first and last
            compile in the window (compiles that keep coming, not a burst).
        quiet_s: a flagged storm ends once its function has not compiled for
            this long (and it is no longer a storm by the counts).
    """

    def __init__(self, window_s: float = 60.0, min_compiles: int = 30, min_span_s: float = 5.0,
                 quiet_s: float = 20.0) -> None:
        self.window_s = float(window_s)
        self.min_compiles = int(min_compiles)
        self.min_span_s = float(min_span_s)
        self.quiet_s = float(quiet_s)
        # [second, compiles, {key: compiles}], oldest first; one per second
        # that had a compile, at most window_s + 1 of them.
        self._buckets: collections.deque[list[Any]] = collections.deque()
        self._last: dict[str, float] = {}  # key -> time of its last compile in the window

    def note(self, t: float, key: str | None, n: int = 1) -> None:
        """``n`` compiles at ``t`` (Unix time) of ``key`` (None: a compile
        that names no function, counted in the total only)."""
        sec = int(t)
        buckets = self._buckets
        if buckets and buckets[-1][0] == sec:
            bucket = buckets[-1]
        elif not buckets or buckets[-1][0] < sec:
            bucket = [sec, 0, {}]
            buckets.append(bucket)
            self._trim(t)
        else:
            # Threads report a little out of order: the second it belongs to.
            bucket = self._bucket_before(sec)
            if bucket is None:
                return  # older than the window
        bucket[1] += n
        if key is not None:
            bucket[2][key] = bucket[2].get(key, 0) + n
            if t > self._last.get(key, float("-inf")):
                self._last[key] = t

    def _bucket_before(self, sec: int) -> list[Any] | None:
        """The bucket of ``sec``, an earlier second than the newest bucket's
        (made where it is missing); None before the oldest kept."""
        buckets = self._buckets
        for i in range(len(buckets) - 1, -1, -1):
            if buckets[i][0] == sec:
                return buckets[i]
            if buckets[i][0] < sec:
                buckets.insert(i + 1, [sec, 0, {}])
                return buckets[i + 1]
        if buckets and sec >= int(buckets[-1][0] - self.window_s):
            buckets.appendleft([sec, 0, {}])
            return buckets[0]
        return None

    def _trim(self, now: float) -> None:
        oldest = int(now - self.window_s)
        buckets = self._buckets
        dropped = False
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()
            dropped = True
        if dropped or not buckets:
            live = {k for b in buckets for k in b[2]}
            for key in [k for k in self._last if k not in live]:
                del self._last[key]

    def counts(self, now: float) -> tuple[int, dict[str, tuple[int, int, int]]]:
        """Compiles in the window ending at ``now``: the total, and per
        function ``(compiles, first second, last second)``."""
        self._trim(now)
        total = 0
        per: dict[str, list[int]] = {}
        for sec, n, keys in self._buckets:
            total += n
            for key, k in keys.items():
                entry = per.get(key)
                if entry is None:
                    per[key] = [k, sec, sec]
                else:
                    entry[0] += k
                    entry[2] = sec
        return total, {k: (v[0], v[1], v[2]) for k, v in per.items()}

    def storming(self, now: float, sustained: str | None = None) -> tuple[str, int, int, int] | None:
        """The function that storms now: ``(key, compiles in the window,
        first second, last second)`` of the one with the most compiles among
        those over both thresholds that compiled within ``quiet_s``; None
        when none is.

        Args:
            sustained: a function already known to keep compiling (the leak
                flag's: its executables grew pass after pass), which needs
                ``min_compiles`` only.
        """
        _, per = self.counts(now)
        best = None
        for key, (n, first, last) in per.items():
            spread = last - first >= self.min_span_s or key == sustained
            if n >= self.min_compiles and spread and self.still_going(key, now):
                if best is None or n > best[1]:
                    best = (key, n, first, last)
        return best

    def last_compile(self, key: str) -> float | None:
        """When ``key`` last compiled within the window."""
        return self._last.get(key)

    def still_going(self, key: str, now: float) -> bool:
        """Has ``key`` compiled within ``quiet_s`` of ``now``?"""
        last = self._last.get(key)
        return last is not None and now - last <= self.quiet_s


def display_name(key: str) -> str:
    """A jit ledger key as people call the function: ``jit_step`` → ``step``,
    ``jit__lambda`` → ``<lambda>``."""
    if key.startswith("jit_") and len(key) > 4:
        rest = key[4:]
        return "<lambda>" if rest == "_lambda" else rest
    return key


def _short(site: Any) -> str | None:
    if not isinstance(site, str) or not site:
        return None
    path, sep, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if sep and line.isdigit() else os.path.basename(site)


def _what_changed(old: Any, new: Any) -> str:
    """``shape`` (f32[10] → f32[100]), ``dtype`` (f32[3] → f16[3]) or ``type``."""
    a, b = _DTYPE.match(str(old)), _DTYPE.match(str(new))
    if a and b:
        if a.group(1) == b.group(1):
            return "shape"
        if a.group(2) == b.group(2):
            return "dtype"
    return "type"


def _dominant(reasons: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The reasons of the kind most of them have (a tie: the newer kind),
    oldest first. A storm is worded by what most of its recompiles were, not
    by the newest alone: a buffer grown one row a step whose jit is made
    anew every 32 rows is a shape storm, although one reason in 32 says
    "a new function object"."""
    counts: dict[Any, int] = {}
    newest: dict[Any, int] = {}
    for i, r in enumerate(reasons):
        k = r.get("kind")
        counts[k] = counts.get(k, 0) + 1
        newest[k] = i
    kind = max(counts, key=lambda k: (counts[k], newest[k]))
    return [r for r in reasons if r.get("kind") == kind]


def _chain(reasons: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """``(arg, "f32[10] → f32[11] → … → f32[4000]")``: the argument the
    newest reason names, followed through the reasons of the same kind that
    name it (its first value, then each new one: jax's "before" value is
    only the closest key it had, not the previous call's); None when the
    newest reason names no argument."""
    latest = reasons[-1]
    kind, arg = latest.get("kind"), latest.get("arg")
    if kind not in ("types", "static") or arg is None:
        return None
    same = [r for r in reasons if r.get("arg") == arg and r.get("kind") == kind]
    chain = [str(same[0].get("old"))] + [str(r.get("new")) for r in same]
    if len(chain) > 4:
        chain = chain[:2] + ["…", chain[-1]]
    more = len(latest.get("diffs") or ()) - 1
    return str(arg), " → ".join(chain) + (f" (+{more} more argument(s))" if more > 0 else "")


def change_summary(reasons: Sequence[Mapping[str, Any]], limit: int = 120) -> str | None:
    """The recompile reasons of one function (oldest first) in one phrase.

    ``x f32[10] → f32[100] → … → f32[4000]`` (the argument the newest reason
    names, followed through the reasons that name it); ``static argument
    train: True → False``; for closures ``a new function object each time
    (jit created in a loop?)``; else the newest explanation's text. None
    without reasons.
    """
    if not reasons:
        return None
    reasons = _dominant(reasons)
    latest = reasons[-1]
    kind = latest.get("kind")
    chain = _chain(reasons)
    if chain is not None:
        text = (f"static argument {chain[0]}: " if kind == "static" else f"{chain[0]} ") + chain[1]
    elif kind == "redefined":
        text = "a new function object each time (jit created in a loop?)"
    else:
        text = " ".join(str(latest.get("text") or kind or "?").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storm_cause(key: str, compiles_total: int, eager: bool, reasons: Sequence[Mapping[str, Any]],
                explain_on: bool) -> tuple[str, str]:
    """Why ``key`` keeps compiling, from what the ledger knows of it.

    Args:
        key: the function's ledger name.
        compiles_total: its compiles since the agent started.
        eager: every compile was of jax's op run outside jit.
        reasons: its recompile reasons, oldest first (the newest few).
        explain_on: whether recompile reasons are recorded at all.

    Returns:
        ``(kind, text)``: kind ``eager``, ``types``, ``static``,
        ``redefined``, ``other`` or ``unknown``; text such as ``eager op sin
        compiled for 400 shapes: run it under jit or pad shapes`` or ``149
        recompiles of step: the shape of x changed (f32[10] → f32[100] → …)``.
    """
    name = display_name(key)
    recompiles = max(0, compiles_total - 1)
    if eager:
        return "eager", (f"eager op {name} compiled for {compiles_total} shapes: "
                         "run it under jit or pad shapes")
    reasons = _dominant(reasons) if reasons else []
    latest = reasons[-1] if reasons else None
    kind = latest.get("kind") if latest else None
    summary = change_summary(reasons)
    chain = _chain(reasons) if reasons else None
    if kind == "types" and chain is not None and latest is not None:
        what = _what_changed(latest.get("old"), latest.get("new"))
        fix = "pad or bucket shapes" if what == "shape" else "keep one dtype"
        return "types", f"{recompiles} recompiles of {name}: the {what} of {chain[0]} changed ({chain[1]}): {fix}"
    if kind == "static":
        return "static", f"{recompiles} recompiles of {name}: {summary}"
    if kind == "redefined":
        return "redefined", (f"{name} compiled {compiles_total} times: a new function object each time "
                             "(jit closures created in a loop?): create the jit once, outside the loop")
    if latest is not None:
        return "other", f"{recompiles} recompiles of {name}: {summary}"
    if not explain_on:
        return "unknown", (f"{name} compiled {compiles_total} times (recompile reasons are off: "
                           "jax_explain_cache_misses)")
    return "unknown", f"{name} compiled {compiles_total} times: no recompile reason recorded"
