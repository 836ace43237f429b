"""Device memory: ``Device.memory_stats()`` where the backend has it, live
arrays where it does not (CPU).

Pure helpers (:func:`normalize_stats`, :func:`fragmentation`; the live-array
accounting is :mod:`jaxtop.probes.live_arrays`) take plain dicts and are tested against
recorded GPU dicts; :class:`JaxMemoryProbe` calls into jax.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable

from jaxtop.probes.jaxstate import backend_ready  # noqa: F401  (the agent asks it from here)
from jaxtop.probes.jaxstate import version_tuple
from jaxtop.wire.protocol import fragmentation_na
from jaxtop.probes.buffer_detail import NOT_READY, detail_of
from jaxtop.probes.live_arrays import LiveArrays


def normalize_stats(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Pass ``memory_stats()`` through, mapping the PJRT C API's -1 to None.

    jaxlib builds the dict from the device allocator's stats
    (``PyDevice::MemoryStats``): ``num_allocs``, ``bytes_in_use``,
    ``peak_bytes_in_use``, ``largest_alloc_size``, ``bytes_reserved``,
    ``peak_bytes_reserved`` and ``largest_free_block_bytes`` are always
    there; ``bytes_limit``, ``bytes_reservable_limit``, ``pool_bytes`` and
    ``peak_pool_bytes`` only when the allocator sets them (BFC on GPU sets
    all, ``cuda_async`` no pool fields; CPU returns None altogether). Through
    the PJRT C API an unset field can come back as -1.
    """
    if raw is None:
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, (int, float)) and value == -1:
            out[key] = None
        else:
            out[key] = value
    return out


def fragmentation(stats: dict[str, Any] | None, platform: str = "") -> tuple[float | None, str | None]:
    """BFC's own fragmentation: ``1 - largest_free_block / (pool - in_use)``.

    Returns:
        (value in [0, 1], None), or (None, reason) when the allocator does not
        report what the formula needs.
    """
    if stats is None:
        return None, f"memory_stats() is None on {platform or 'this'} backend: the allocator reports no pool"
    na = fragmentation_na(platform)
    if na is not None:
        return None, na
    pool = stats.get("pool_bytes")
    free_block = stats.get("largest_free_block_bytes")
    in_use = stats.get("bytes_in_use")
    if pool is None or free_block is None or in_use is None:
        return None, "allocator reports no pool_bytes/largest_free_block_bytes (e.g. cuda_async or platform allocator)"
    free = pool - in_use
    if free <= 0:
        return 0.0, None  # nothing free in the pool: nothing to fragment
    value = 1.0 - free_block / free
    return min(1.0, max(0.0, value)), None


# -- asking an Array for its address without crashing the program ---------------
#
# jaxlib's ``Array.is_ready()`` on an array that ``Array.delete()`` has freed
# dereferences a null pointer: a segfault, not an exception (measured on
# jaxlib 0.4.30, 0.6.2 and 0.10.2, CPU, with one thread: ``a.delete();
# a.is_ready()``). ``jax.live_arrays()`` hands the agent arrays that are alive
# at that moment, and the program's own thread may delete one before the agent
# asks it anything: within seconds in a loop that frees its buffers with
# ``delete()``. (A donated array raises as it should; only ``delete()`` leaves
# the null behind.) So ``delete()`` goes through a lock, and the agent asks
# ``is_deleted()`` and then ``is_ready()`` holding it: no delete can come
# between. The program's delete waits at most one such question (microseconds).
# Without the lock in place (the class would not take it) the agent asks no
# array whether it is ready, and buffers get no address.

_delete_lock = threading.RLock()  # re-entrant: a finaliser on the agent's thread may delete
_guard: tuple[Any, Any, Any] | None = None  # (class, its own delete, ours)
_guard_lock = threading.Lock()  # the agent and an agent-less OOM census may install at once


def _renew_lock_in_child() -> None:
    # The agent's thread may have held the lock when the program forked: the
    # child's deletes must not wait for a thread it does not have.
    global _delete_lock, _guard_lock
    _delete_lock = threading.RLock()
    _guard_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)


def guard_deletes() -> bool:
    """Route ``jax.Array.delete`` through the lock; True when in place."""
    global _guard
    if _guard is not None:
        return True
    with _guard_lock:
        return _install_guard()


def _install_guard() -> bool:
    global _guard
    if _guard is not None:
        return True
    try:
        from jax._src.array import ArrayImpl

        original = ArrayImpl.delete

        def delete(self):
            with _delete_lock:
                return original(self)

        delete.__qualname__ = "ArrayImpl.delete"
        from jaxtop.probes.frames import HOOK_CODES

        HOOK_CODES.add(delete.__code__)  # hidden from the program's tracebacks
        doc = getattr(original, "__doc__", None)
        delete.__doc__ = doc if isinstance(doc, str) else None
        delete.__wrapped__ = original  # type: ignore[attr-defined]
        ArrayImpl.delete = delete
        _guard = (ArrayImpl, original, delete)
        return True
    except Exception:
        return False


def unguard_deletes() -> None:
    """Put ``jax.Array.delete`` back, unless someone replaced ours since."""
    global _guard
    with _guard_lock:
        if _guard is None:
            return
        cls, original, ours = _guard
        _guard = None
        try:
            if cls.__dict__.get("delete") is ours:
                cls.delete = original
        except Exception:
            pass


#: What :func:`ready_address` gives for an array whose computation failed:
#: it has no buffer (and holds no memory). Addresses are never negative.
FAILED = -1
#: What :func:`ready_address` gives for an array that has a buffer whose
#: address cannot be asked without side effects (see :func:`executable_output`).
UNASKED = -2

# Where an executable's outputs are wrapped, as the innermost frame of their
# traceback (``co_qualname``): the first call of a jitted function and eager
# ops. The later calls go through jaxlib's C++ dispatch, which records the
# caller's frame: a frame outside jax.
_OUTPUT_FRAMES = frozenset({"ExecuteReplicated.__call__", "apply_primitive"})
_JAX_DIR = os.sep + "jax" + os.sep
_MISSING = object()

#: The first jaxlib whose executables' outputs answer ``unsafe_buffer_pointer()``
#: with themselves. Before it they answer through ``_arrays``, which makes
#: (and caches on the array) a new single-device Array, one more in the
#: program's ``jax.live_arrays()`` for each array asked (measured: jaxlib
#: 0.4.30, 0.4.36, 0.6.2, 0.7.1, 0.8.1, 0.9.1 and 0.10.0 add one per asked jit
#: or eager output; 0.10.1 and 0.10.2 none). The per-shard Arrays a host read
#: makes answer with themselves on all of them: those are still asked.
ASKS_WITHOUT_ARRAYS = (0, 10, 1)
_asks_safely: bool | None = None


def addresses_askable() -> bool:
    """Whether this jaxlib can tell an executable output's address without
    adding an Array to the program's ``jax.live_arrays()`` (read once)."""
    global _asks_safely
    if _asks_safely is None:
        try:
            import jaxlib.version

            _asks_safely = version_tuple(jaxlib.version.__version__) >= ASKS_WITHOUT_ARRAYS
        except Exception:
            _asks_safely = False  # unknown: never risk the program's view
    return _asks_safely


def executable_output(arr: Any) -> bool:
    """True when ``arr`` is known to be an executable's output, whose buffer
    address can be asked without side effects.

    jaxlib answers ``unsafe_buffer_pointer()`` (and DLPack, and
    ``__cuda_array_interface__``) from the array's ``_arrays``: an array
    that jax assembled in Python from single-device pieces
    (``jax.device_put`` of host data, ``make_array_from_callback``,
    ``make_array_from_single_device_arrays``) is not a single-device array
    inside jaxlib even on one device, and asking makes a new Array on its
    buffer, cached on it, that shows up in the program's own
    ``jax.live_arrays()`` from then on (measured, jax 0.10.2: 5 arrays became
    10 under the agent). An executable's outputs answer with themselves. No
    attribute tells the two apart; where the array was made does: the
    innermost frame of ``arr.traceback`` (the very object jaxlib keeps, read
    in ~1-2 µs) is ``batched_device_put`` or
    ``make_array_from_single_device_arrays`` for the first kind, and for the
    second the program's own line (jaxlib's C++ dispatch) or jax's
    ``ExecuteReplicated.__call__``/``apply_primitive``. Anything else inside
    jax, or no traceback, is not asked.
    """
    try:
        tb = getattr(arr, "traceback", _MISSING)
        if tb is _MISSING:
            return True  # not jaxlib's Array (a test's stand-in)
        if tb is None:
            return False
        codes, _ = tb.raw_frames()
        if not codes:
            return False
        top = codes[0]
    except Exception:
        return False
    if not addresses_askable():
        return False
    if _JAX_DIR not in top.co_filename:
        return True
    return getattr(top, "co_qualname", top.co_name) in _OUTPUT_FRAMES


def ready_address(arr: Any, shard: bool = False) -> int | None:
    """The buffer's device address; None: still being computed, deleted, or
    no safe way to ask (see above); :data:`FAILED`: its computation failed;
    :data:`UNASKED`: ready, but asking would add an Array to the program's
    ``jax.live_arrays()`` (:func:`executable_output`; before jaxlib 0.10.1
    every array but the per-shard ones, :func:`addresses_askable`).

    ``shard``: the caller knows ``arr`` for one of the single-device Arrays
    jaxlib made on another array's buffer (they answer with themselves).

    ``unsafe_buffer_pointer()`` on a buffer that an in-flight step is still
    producing waits for it while holding the GIL: one forced host-device sync
    per scan, stalling the user's threads for up to a step (measured 50-150
    ms). A pending buffer simply has no place in this scan's memory map.

    A computation that failed asynchronously (an output that could not be
    allocated: ``RESOURCE_EXHAUSTED`` on CPU under ``ulimit -v``) leaves an
    array that says ``is_ready()`` and holds an error instead of a buffer;
    ``unsafe_buffer_pointer()`` on it aborts the process in jaxlib
    (``Check failed: buffer_.IsConcrete()``, jaxlib 0.10.2, SIGABRT): a
    program that never reads that array would exit 0 on its own and 134
    under jaxtop. ``block_until_ready()`` on a ready array returns at once,
    or raises the stored error: asked first, it tells the two apart.
    """
    if _guard is None:
        return None
    try:
        with _delete_lock:
            if arr.is_deleted() or not arr.is_ready():
                return None
            wait = getattr(arr, "block_until_ready", None)
            if wait is not None:
                try:
                    wait()  # ready: returns at once, or raises the error it holds
                except Exception:
                    return FAILED
            if not shard and not executable_output(arr):
                return UNASKED
            return arr.unsafe_buffer_pointer()
    except Exception:
        return None


def _addressable(sharding: Any, devices: Any) -> Iterable[Any]:
    """The devices of this process that hold a shard (``addressable_devices``
    where the sharding has it, else ``device_set`` filtered by process)."""
    found = getattr(sharding, "addressable_devices", None)
    if found is not None:
        return found
    import jax

    here = jax.process_index()
    return [d for d in devices if getattr(d, "process_index", 0) == here]


class JaxMemoryProbe:
    """Samples every local device. Call only after
    :func:`jaxtop.probes.jaxstate.backend_ready`.

    Three cadences, each set by the agent: :meth:`sample` every tick (the
    allocator's ``memory_stats()``, cheap); :meth:`scan_live_arrays` (the
    live-array totals, whose cost follows how many arrays came and went);
    :meth:`refresh_detail` (top buffers, the address map and its holes,
    derived from what the scans keep, only for devices whose arrays changed).
    """

    def __init__(self) -> None:
        import jax

        self._jax = jax
        guard_deletes()  # before the first address is asked for; undone by close()
        self.devices = list(jax.local_devices())
        self.backend = jax.default_backend()
        self._prev_peak: dict[int, int] = {}
        # Looked up through self._jax on each scan, so that a test can stand
        # in for jax.live_arrays().
        self.arrays = LiveArrays(lambda: self._jax.live_arrays(), ready_address, _addressable)
        self._live_t: float | None = None  # when the totals were last scanned
        # Per device: the allocator's bytes_in_use read right after the last
        # scan, so that "in use - live arrays" compares two figures of one
        # moment (a sample's own in-use figure can be seconds newer).
        self._in_use_at_scan: dict[int, int] = {}
        self._detail: dict[int, dict[str, Any]] = {}  # per device: top, map, map_complete, holes, unmapped
        self._detail_t: float | None = None  # when the detail was derived
        self._detail_new: set[int] = set()  # devices whose detail no sample carried yet
        self._scans = 0
        #: Why no scheduled live-array scan runs (jaxtop.agent.scan_pause), sent with each device's live_arrays.
        self.scan_held: str | None = None
        self.scan_held_pause_s: float | None = None  # the pause the next scan would put on the program
        # Per device: (scan number, allocator stats, record) of the last
        # sample, reused while neither changed (most ticks, on CPU always
        # between scans): the agent's encoder then reuses its bytes too.
        self._last_rec: dict[int, tuple[int, Any, dict[str, Any]]] = {}

    def device_labels(self) -> dict[int, str]:
        """Device id -> ``platform:id``: how jaxlib's memory profile labels a
        device (jax 0.10; ``TFRT_CPU_0`` before it)."""
        labels = {}
        for d in self.devices:
            try:
                labels[d.id] = f"{d.platform}:{d.id}"
            except Exception:
                continue
        return labels

    def close(self) -> None:
        """Give ``jax.Array.delete`` back as it was and drop the references
        kept to live arrays; addresses are no longer asked for (the OOM census
        too then gives them up)."""
        unguard_deletes()
        self.arrays.clear()

    def describe(self) -> list[dict[str, Any]]:
        """Static facts about each device, for ``hello``."""
        out = []
        for d in self.devices:
            out.append({
                "id": d.id,
                "platform": d.platform,
                "kind": getattr(d, "device_kind", d.platform),
                "process_index": getattr(d, "process_index", 0),
            })
        return out

    @property
    def scans(self) -> int:
        """Live-array scans taken so far."""
        return self._scans

    def scan_live_arrays(self, now: float, detail: bool = True) -> bool:
        """Scan ``jax.live_arrays()`` (all devices): the totals are exact as
        of ``now`` afterwards. Nothing the program can see is created or kept
        alive (see :mod:`jaxtop.probes.live_arrays`).

        Args:
            now: Unix time of the scan (``scanned_t`` in samples).
            detail: also derive the detail (:meth:`refresh_detail`) when the
                arrays changed; the agent passes False and derives it on its
                own, slower cadence.

        Returns:
            True when any array came or went since the last scan.
        """
        changed = self.arrays.scan()
        self._live_t = now
        self._scans += 1
        self._in_use_at_scan = self._in_use_now()
        if detail:
            self.refresh_detail(now)
        return changed

    def _in_use_now(self) -> dict[int, int]:
        """Each device's ``bytes_in_use`` as the allocator reports it now
        (none on CPU, whose ``memory_stats()`` is None)."""
        out = {}
        for d in self.devices:
            try:
                stats = normalize_stats(d.memory_stats())
            except Exception:
                continue
            in_use = (stats or {}).get("bytes_in_use")
            if isinstance(in_use, int):
                out[d.id] = in_use
        return out

    def detail_stale(self) -> bool:
        """True when some device's arrays changed since the detail was derived."""
        return any(dev.changed for dev in self.arrays.devices.values()) or (
            self._detail_t is None and self._live_t is not None)

    def refresh_detail(self, now: float) -> int:
        """Derive top buffers, map and holes for the devices whose arrays
        changed since the last time; the next :meth:`sample` with
        ``include_map`` carries them for those devices (``map_t`` says when).

        Returns:
            Buffers in the maps derived (what the next sample will weigh).
        """
        entries = 0
        for dev_id, dev in self.arrays.devices.items():
            if dev.changed or dev_id not in self._detail:
                detail = detail_of(list(dev.rows.values()))
                if dev.unmapped:
                    detail["unmapped"] = dict(dev.unmapped)
                # The time of the scan whose buffers it shows (it is derived
                # later, on its own cadence): what a reader's "Ns ago" means.
                detail["map_t"] = self._live_t if self._live_t is not None else now
                self._detail[dev_id] = detail
                self._detail_new.add(dev_id)
                entries += len(detail["map"]) + len(detail["top"])
                dev.changed = False
        for dev_id in list(self._detail):
            if dev_id not in self.arrays.devices:
                del self._detail[dev_id]
                self._detail_new.add(dev_id)  # its arrays are all gone: an empty map says so
        self._detail_t = now
        return entries

    @property
    def _live(self) -> dict[int, dict[str, Any]]:
        """Per device: the totals and the newest detail, as one dict."""
        out = {}
        for dev_id, dev in self.arrays.devices.items():
            out[dev_id] = {"bytes": dev.bytes, "count": dev.count, "largest_bytes": dev.largest,
                           **self._detail.get(dev_id, {})}
        return out

    def sample(self, include_map: bool) -> list[dict[str, Any]]:
        """One record per device for a sample.

        Args:
            include_map: carry each device's detail (``top``, ``map``,
                ``map_complete``, ``unmapped``, ``map_t``) when it was
                derived since the last sample that carried it. A reader
                keeps the last map it saw for a device.
        """
        carry = self._detail_new if include_map else set()
        if carry:
            self._detail_new = set()
        out = []
        for d in self.devices:
            try:
                raw = d.memory_stats()
            except Exception:
                raw = None
            last = self._last_rec.get(d.id)
            if (last is not None and d.id not in carry and last[0] == self._scans and last[1] == raw
                    and (last[2]["source"] == "live_arrays" or last[2].get("peak_rise_bytes") == 0)):
                out.append(last[2])  # nothing moved (a rise of the peak would have)
                continue
            stats = normalize_stats(raw)
            dev = self.arrays.device(d.id)
            detail = self._detail.get(d.id, {})
            rec: dict[str, Any] = {"id": d.id, "platform": d.platform}
            live_bytes = dev.bytes if dev is not None else 0
            live_summary = {
                "bytes": live_bytes,
                "count": dev.count if dev is not None else 0,
                "largest_bytes": dev.largest if dev is not None else 0,
                "scanned_t": self._live_t,
            }
            if detail.get("holes") is not None:
                live_summary["holes"] = detail["holes"]
            if self.scan_held is not None:
                live_summary["held"] = self.scan_held
                live_summary["held_pause_s"] = self.scan_held_pause_s
            if d.id in self._in_use_at_scan:
                live_summary["in_use_bytes"] = self._in_use_at_scan[d.id]
            if dev is not None and dev.unmapped.get(NOT_READY):
                live_summary["not_ready_count"] = dev.unmapped[NOT_READY]
                live_summary["not_ready_bytes"] = dev.not_ready_bytes
            if d.id in carry or (include_map and self._detail_t is None):
                live_summary["top"] = detail.get("top", [])
                live_summary["map"] = detail.get("map", [])
                live_summary["map_complete"] = detail.get("map_complete", True)
                live_summary["map_t"] = detail.get("map_t", self._detail_t)
                if detail.get("unmapped"):
                    live_summary["unmapped"] = detail["unmapped"]
            if stats is not None:
                rec["source"] = "memory_stats"
                rec.update(stats)
                peak = stats.get("peak_bytes_in_use")
                prev = self._prev_peak.get(d.id)
                rec["peak_rise_bytes"] = (peak - prev) if (peak is not None and prev is not None) else None
                if peak is not None:
                    self._prev_peak[d.id] = peak
            else:
                rec["source"] = "live_arrays"
                rec["bytes_in_use"] = live_bytes
                rec["peak_rise_bytes"] = None
            frag, reason = fragmentation(stats, d.platform)
            rec["fragmentation"] = frag
            if reason:
                rec["fragmentation_reason"] = reason
            rec["live_arrays"] = live_summary
            if d.id not in carry:  # a record with a map is sent once
                self._last_rec[d.id] = (self._scans, raw, rec)
            else:
                self._last_rec.pop(d.id, None)
            out.append(rec)
        return out
