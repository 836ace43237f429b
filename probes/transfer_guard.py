"""Implicit host<->device transfers, counted from JAX's transfer-guard log lines.

JAX has no Python hook for transfers. With the guard at ``log``, jaxlib writes
one ``LOG(WARNING)`` line per implicit transfer (per argument, per call) to
fd 2, with abseil's header (jaxlib 0.7 and later) or XLA/TSL's (before).
:mod:`jaxtop.probes.stderr_capture` hands those lines' messages here; this
module parses them (every known payload variant), aggregates them per sample
interval and owns the guard setting: it switches ``allow`` directions to
``log`` and remembers what the user had, so their own lines still reach them.

The parser and counter are pure (no jax import) and tested on recorded lines.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from jaxtop.probes.base import Tick
from jaxtop.wire.protocol import DIRECTIONS, GUARD_DIRECTIONS as _DIRECTION_TEXT
from jaxtop.probes.forksafe import ForkLock
from jaxtop.probes.jaxstate import version_tuple
# The log header before a message, in both forms jaxlib has written:
# abseil's "W1202 18:34:30.919532    2146 guard_lib.cc:125] " (jaxlib 0.7 and
# later) and TSL's "2026-12-03 19:09:21.852989: W external/xla/xla/python/
# transfer_guard_lib.cc:108] " (older jaxlib; a thread id may follow the
# severity). Only its shape counts, not the C++ file name, which moved between
# releases. The stderr relay (probes/_relay.py, standalone, so it cannot
# import this) has the same patterns; tests run both over the same lines.
_HEADER = (
    r"(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+[^\S\n]+\d+[^\S\n]+[^\s]+:\d+\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF](?:[^\S\n]+\d+)?[^\S\n]+[^\s]+:\d+\] )"
)
_MESSAGE = r"(host-to-device|device-to-host|device-to-device) transfer:(.*)$"
# A bare message (what the relay reports: the line without its header).
_MESSAGE_RE = re.compile(_MESSAGE, re.S)
# A whole line: the header may follow other text on the same line, since a
# log line written while the program's own line was unfinished (a progress
# bar) lands right after it.
_LINE_RE = re.compile(_HEADER + _MESSAGE, re.S)
_AVAL_RE = re.compile(r"aval=ShapedArray\((\w+)\[([^\]]*)\]")
_SHAPE_RE = re.compile(r"shape=\(([^)]*)\),\s*dtype=(\w+)")

#: Bits per element for dtype names that carry no bit count.
_SPECIAL_BITS = {"bool": 8, "pred": 8, "float0": 0, "token": 0}
_TOP_SHAPES_KEPT = 1000

#: The jax releases whose guard lines were recorded and checked (the
#: fixtures in tests/fixtures/guard_lines and CI's oldest-jax run); the
#: floor is pyproject.toml's.
TESTED_JAX = ("0.4.30", "0.10.2")


def untested_jax_reason(version: str | None) -> str | None:
    """Why counts from this jax are unverified, or None inside the tested
    range (patch releases of the newest tested minor count as tested)."""
    if not version:
        return None
    low, high = (version_tuple(v) for v in TESTED_JAX)
    v = version_tuple(version)
    if v < low or v[:2] > high[:2]:
        return f"jax {version} is outside the versions jaxtop was tested with ({TESTED_JAX[0]} to {TESTED_JAX[1]})"
    return None


@dataclass(frozen=True)
class GuardLine:
    """One parsed guard line.

    Attributes:
        direction: ``h2d``, ``d2h`` or ``d2d``.
        shape_key: e.g. ``float32[1000,1000]``; None for an empty payload
            (a cached jit call logs ``host-to-device transfer:`` and nothing more).
        nbytes: bytes of the transferred value when the line names aval or
            shape and dtype; None when unknown.
    """

    direction: str
    shape_key: str | None
    nbytes: int | None


def dtype_bits(name: str) -> int | None:
    """Bits per element from a JAX (``float32``) or XLA (``F32``) dtype name."""
    low = name.lower()
    if low in _SPECIAL_BITS:
        return _SPECIAL_BITS[low]
    match = re.match(r"^(?:bfloat|float|int|uint|complex|f|s|u|c|bf)(\d+)", low)
    if match:
        return int(match.group(1))
    return None


def _dims(text: str) -> list[int] | None:
    text = text.strip().rstrip(",")
    if not text:
        return []
    dims = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            return None  # symbolic or dynamic dimension
        dims.append(int(part))
    return dims


def _size(dims: list[int] | None, bits: int | None) -> int | None:
    if dims is None or bits is None:
        return None
    count = 1
    for d in dims:
        count *= d
    return (count * bits + 7) // 8


_DST_RE = re.compile(r"dst_sharding=(\w+)\((.*)$", re.S)
_MESH_AXIS_RE = re.compile(r"'(\w+)': (\d+)")
_SPEC_RE = re.compile(r"spec=(?:P|PartitionSpec)\((.*?)\)(?:,\s*memory_kind|\)?\s*$)", re.S)
_TILES_RE = re.compile(r"devices=\[([\d,]+)\]")


def _shard_dims(dims: list[int] | None, payload: str) -> list[int] | None:
    """The dimensions of the one shard a guard line stands for.

    JAX logs one line *per shard* of a sharded transfer, each carrying the
    whole array's aval: summing whole-array bytes over the lines counted an
    8-way split 8 times. The destination sharding in the line says how the
    array is split: a ``NamedSharding`` by its mesh and spec, a
    ``GSPMDSharding`` by its tile assignment, a single device or a
    replicated sharding not at all (each device receives the whole array).
    Any other sharding (``PmapSharding``, …) gives None: bytes unknown,
    never a guess that could exceed the truth.
    """
    if dims is None:
        return None
    dst = _DST_RE.search(payload)
    if dst is None:
        return dims  # no destination named (GPU d2h, or the source side): whole
    kind, rest = dst.group(1), dst.group(2)
    if kind == "SingleDeviceSharding":
        return dims
    if kind == "GSPMDSharding":
        if "{replicated}" in rest or "{maximal" in rest:
            return dims
        tiles = _TILES_RE.search(rest)
        if tiles is None:
            return None
        factors = [int(t) for t in tiles.group(1).split(",") if t]
        if "last_tile_dim_replicate" in rest or "last_tile_dims" in rest:
            factors = factors[: len(dims)]
        return _split(dims, factors) if len(factors) == len(dims) else None
    if kind == "NamedSharding":
        axes = {name: int(size) for name, size in _MESH_AXIS_RE.findall(rest.split("spec=", 1)[0])}
        spec = _SPEC_RE.search(rest)
        if not axes or spec is None:
            return None
        factors = []
        for entry in _spec_entries(spec.group(1)):
            factor = 1
            for name in entry:
                if name not in axes:
                    return None
                factor *= axes[name]
            factors.append(factor)
        if len(factors) > len(dims):
            return None
        return _split(dims, factors + [1] * (len(dims) - len(factors)))
    return None


def _spec_entries(text: str) -> list[tuple[str, ...]]:
    """``'batch', None, ('x', 'y')`` -> ``[("batch",), (), ("x", "y")]``."""
    entries: list[tuple[str, ...]] = []
    depth, current = 0, ""
    for ch in text + ",":
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            item = current.strip()
            if item:
                entries.append(tuple(re.findall(r"'(\w+)'", item)))
            current = ""
        else:
            current += ch
    return entries


def _split(dims: list[int], factors: list[int]) -> list[int]:
    # An uneven split gives shards of floor(d / f) and ceil(d / f): the
    # floor keeps every line's bytes at or below its shard's, so the total
    # stays a lower bound (equal to the truth for the even splits XLA makes
    # almost always).
    return [d // f if f > 0 else d for d, f in zip(dims, factors)]


def _match(line: str) -> re.Match[str] | None:
    return _MESSAGE_RE.match(line) or _LINE_RE.search(line)


def guard_message(line: str) -> str | None:
    """The message of a guard line (from its direction on, without the
    header and the newline), or None when ``line`` is not one.

    ``line`` is a bare message or a stderr line with a log header of either
    form, anywhere in it; guard text without a header after other text is
    the program's own output, not a guard line.
    """
    match = _match(line)
    if match is None:
        return None
    message = line[match.start(1) :]
    return message[:-1] if message.endswith("\n") else message


def parse_line(line: str) -> GuardLine | None:
    """Parse one stderr line; None when it is not a transfer-guard line.

    Takes a bare message or a line with a log header of either form (see
    :func:`guard_message`). Handles h2d ``aval=…, dst_sharding=…``, the
    empty payload of cached jit calls, d2d with or without ``sharding=``,
    and the GPU d2h form ``shape=(d0,d1), dtype=F32, device=cuda:0``.
    """
    match = _match(line)
    if match is None:
        return None
    direction = _DIRECTION_TEXT[match.group(1)]
    payload = match.group(2)
    aval = _AVAL_RE.search(payload)
    if aval:
        dtype, dims_text = aval.group(1), aval.group(2)
        dims = _shard_dims(_dims(dims_text), payload)
        return GuardLine(direction, f"{dtype}[{dims_text}]", _size(dims, dtype_bits(dtype)))
    shape = _SHAPE_RE.search(payload)
    if shape:
        dims_text, dtype = shape.group(1), shape.group(2)
        dims = _dims(dims_text)
        key = f"{dtype.lower()}[{dims_text.strip().rstrip(',').replace(' ', '')}]"
        return GuardLine(direction, key, _size(dims, dtype_bits(dtype)))
    return GuardLine(direction, None, None)


class CachedParser:
    """``parse_line`` with a memo, for a guard line's message (the line
    without its log header, as the stderr capture passes it).

    A training loop logs the same few messages over and over; skipping the
    regexes for a seen message takes the cost per message to a dict lookup.
    A whole line (with a header of either form) is taken too, and memoized
    by its message: the header's time stamp differs on every line.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self._memo: dict[str, GuardLine | None] = {}
        self._capacity = capacity

    def __call__(self, text: str) -> GuardLine | None:
        try:
            return self._memo[text]
        except KeyError:
            pass
        message = guard_message(text)
        if message is None:
            return None  # not a guard line: nothing worth remembering
        if message != text:
            try:
                return self._memo[message]
            except KeyError:
                pass
        parsed = parse_line(message)
        if len(self._memo) >= self._capacity:
            self._memo.clear()  # shapes that vary without end: start over
        self._memo[message] = parsed
        return parsed


class TransferCounter:
    """Per-direction counts: this interval and since start. Thread-safe.

    ``add`` is called from the line reader; ``take`` once per sample.
    """

    def __init__(self) -> None:
        self._lock = ForkLock()
        self._interval = {d: [0, 0, 0] for d in DIRECTIONS}  # count, bytes, unknown
        self._total = {d: [0, 0, 0] for d in DIRECTIONS}
        self._shapes: Counter[tuple[str, str]] = Counter()
        self.errors = 0  # implicit transfers refused by a user's disallow
        # take() of an interval with no transfer repeats the last record
        # with its interval counts at 0 (a copy: the agent's encoder then
        # reuses its bytes). Made when first needed, not each busy tick.
        self._quiet: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None  # the last record taken, with its top
        self._added = True  # add() since the last take()

    # -- the probe interface (jaxtop.probes.base.Probe): sample field ``transfers``
    name = "transfers"
    needs_jax = False
    reason: str | None = None  # the capture's state is the field transfer_capture

    def start(self) -> None:
        """Nothing to install: the stderr capture feeds :meth:`add`."""

    def on_tick(self, tick: Tick) -> dict[str, Any]:
        return self.take()

    def stop(self) -> None:
        """Nothing installed."""

    def detail(self) -> dict[str, Any]:
        """Totals since start per direction, and every shape kept (resets nothing)."""
        with self._lock:
            out: dict[str, Any] = {
                d: {"count": t[0], "bytes_known": t[1], "count_bytes_unknown": t[2]}
                for d, t in self._total.items()
            }
            out["shapes"] = [{"direction": d, "shape": s, "count": n} for (d, s), n in self._shapes.most_common()]
        return out

    def add(self, parsed: GuardLine, n: int = 1) -> None:
        """Count ``n`` transfers of this kind."""
        with self._lock:
            self._added = True
            for bucket in (self._interval[parsed.direction], self._total[parsed.direction]):
                bucket[0] += n
                if parsed.nbytes is None:
                    bucket[2] += n
                else:
                    bucket[1] += parsed.nbytes * n
            key = (parsed.direction, parsed.shape_key or "(cached call, shape not logged)")
            if key in self._shapes or len(self._shapes) < _TOP_SHAPES_KEPT:
                self._shapes[key] += n

    def totals(self) -> dict[str, int]:
        """Counts since start per direction (does not reset anything)."""
        with self._lock:
            return {d: self._total[d][0] for d in DIRECTIONS}

    def take(self, top: int = 5) -> dict[str, Any]:
        """The wire ``transfers`` object; resets the interval counts."""
        with self._lock:
            if not self._added and self._last is not None and top == self._last["_top"]:
                quiet = self._quiet
                if quiet is None:
                    last = self._last
                    quiet = self._quiet = {**last, **{d: {**last[d], "count": 0, "bytes_known": 0,
                                                          "count_bytes_unknown": 0} for d in DIRECTIONS}}
                return {k: v for k, v in quiet.items() if k != "_top"}
            self._added = False
            self._quiet = None
            out: dict[str, Any] = {}
            for d in DIRECTIONS:
                i, t = self._interval[d], self._total[d]
                out[d] = {
                    "count": i[0],
                    "bytes_known": i[1],
                    "count_bytes_unknown": i[2],
                    "count_total": t[0],
                    "bytes_known_total": t[1],
                    "count_bytes_unknown_total": t[2],
                }
                self._interval[d] = [0, 0, 0]
            out["top_shapes"] = [
                {"direction": d, "shape": s, "count": n}
                for (d, s), n in self._shapes.most_common(top)
            ]
            # Until the next add(), every interval is as quiet as the next one.
            self._last = {**out, "_top": top}
        return out


# -- the guard setting --------------------------------------------------------

_OPTION = {
    "h2d": "jax_transfer_guard_host_to_device",
    "d2h": "jax_transfer_guard_device_to_host",
    "d2d": "jax_transfer_guard_device_to_device",
}
_GLOBAL_OPTION = "jax_transfer_guard"
_USER_SEES = ("log", "log_explicit")


def _level_of_cpp_threshold() -> int:
    """Abseil's minimum log level as the user configured it (0 INFO … 3 FATAL)."""
    import os

    try:
        env = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        env = 0
    level = env
    try:
        import jax

        name = jax.config.jax_logging_level
        table = {"CRITICAL": 3, "FATAL": 3, "ERROR": 2, "WARN": 1, "WARNING": 1, "INFO": 0, "DEBUG": 0}
        if name in table:
            level = table[name]
    except Exception:
        pass
    return level


class GuardController:
    """Switches the implicit-transfer guard to ``log`` where the user had ``allow``.

    Works per direction. Where the user chose ``log`` (or ``log_explicit``)
    their lines keep reaching their terminal; where they chose ``disallow``
    jaxtop changes nothing. ``refresh`` notices later ``jax.config.update``
    calls by the user. ``restore`` puts every option back.

    Args:
        on_visibility: called with (directions whose lines the user sees,
            abseil severities the user had silenced) whenever that changes.
    """

    def __init__(self, on_visibility: Callable[[set[str], str], None]) -> None:
        self._on_visibility = on_visibility
        self._user: dict[str, str | None] = {}
        self._ours: dict[str, str] = {}
        self._last: dict[str, Any] = {}
        self._raw: dict[str, Any] = {}
        self._user_global: Any = None
        self._silenced = ""
        self._cpp_level_changed = False
        self.active = False
        self.reason: str | None = None

    def _read(self) -> dict[str, Any]:
        import jax

        values = {d: getattr(jax.config, opt) for d, opt in _OPTION.items()}
        values["global"] = getattr(jax.config, _GLOBAL_OPTION)
        return values

    def start(self) -> None:
        """Read the user's settings and switch ``allow`` directions to ``log``."""
        import jax

        values = self._read()
        self._raw = dict(values)
        self._user_global = values["global"]
        for d in DIRECTIONS:
            self._user[d] = values[d] if values[d] is not None else self._user_global
        level = _level_of_cpp_threshold()
        if level >= 2:
            # The user silenced abseil warnings (TF_CPP_MIN_LOG_LEVEL or
            # jax_logging_level): guard lines need WARNING, so lower the bar
            # and have the relay drop the other warnings they did not want.
            try:
                from jax._src.lib import utils

                utils.absl_set_min_log_level(1)
                self._cpp_level_changed = True
                self._silenced = "IW"
            except Exception:  # jaxlib before 0.7 logs through TSL, which has no such hook
                self.reason = ("TF_CPP_MIN_LOG_LEVEL (or jax_logging_level) silences warnings, and this jaxlib "
                               "cannot take it back at run time, so JAX logs no transfer-guard line; "
                               "set TF_CPP_MIN_LOG_LEVEL=1 or lower to count transfers")
        self._apply(jax)
        self.active = True

    def _apply(self, jax: Any) -> None:
        visible = set()
        current = self._read()
        for d in DIRECTIONS:
            level = self._user.get(d)
            if level in (None, "allow"):
                # Compare with the live value, not with what we set last: a
                # user's later "allow" overwrote our "log" and must be undone,
                # or transfers silently stop being counted.
                if current[d] != "log":
                    jax.config.update(_OPTION[d], "log")
                self._ours[d] = "log"
            else:
                self._ours.pop(d, None)
                if level in _USER_SEES:
                    visible.add(d)
        self._last = self._read()
        self._on_visibility(visible, self._silenced)

    def refresh(self) -> None:
        """Pick up guard changes the user made with ``jax.config.update``."""
        if not self.active:
            return
        import jax

        now = self._read()
        if now == self._last:
            return
        if now["global"] != self._last.get("global"):
            for d in DIRECTIONS:
                self._user[d] = now["global"]
        for d in DIRECTIONS:
            if now[d] != self._last.get(d) and now[d] != now["global"]:
                self._user[d] = now[d]
            if now[d] != self._last.get(d):
                self._raw[d] = now[d]  # the user's newest choice: restore() puts it back
        self._apply(jax)

    def user_levels(self) -> dict[str, str]:
        return {d: (self._user.get(d) or "allow") for d in DIRECTIONS}

    def restore(self) -> None:
        """Put back every option jaxtop changed."""
        if not self.active:
            return
        self.active = False
        try:
            import jax

            for d in list(self._ours):
                jax.config.update(_OPTION[d], self._raw.get(d))
            self._ours.clear()
            if self._cpp_level_changed:
                from jax._src.lib import utils

                utils.absl_set_min_log_level(_level_of_cpp_threshold())
        except Exception:
            pass
