"""Accounting of ``jax.live_arrays()`` whose cost follows what changed.

A model with its optimizer state holds tens of thousands of arrays. Reading
each one's device, size, dtype, shape and buffer address costs 3-30 µs of
Python (numpy's ``str(dtype)`` alone is ~5 µs, the address needs a lock and
two questions to jaxlib), so a full pass over 50,000 arrays took 1.4 s of the
agent thread. Arrays do not change once made: an Array's device, shape, dtype
and buffer address are fixed for its life. So each array is read once, when a
scan first sees it, and remembered by identity:

* Identity is a weak reference, never the array itself (keeping arrays alive
  would change the program's memory and its own ``jax.live_arrays()``).
  ``weakref.ref(x)`` without a callback returns the one shared reference an
  object already has, so a scan maps every live array to its reference in C
  (~50 ns each) and ``id()`` of that reference is a key no other array can
  take while the reference is held: unlike ``id(array)``, which CPython
  hands to the next array allocated at the same place, often within a step.
  The references are taken out of the cyclic collector's lists, and what
  is kept per array is ints and tuples of atoms: 50,000 arrays add nothing
  for the collector to follow (see :func:`_collector_blind`).
* A scan whose keys equal the last scan's (a tuple compared in C) did
  nothing else: no per-array Python work at all. Otherwise the new and the
  gone keys are set differences (in C) and only those arrays are read.
* Per-device totals (bytes, count, largest) are kept up to date by each
  arrival and departure; the detail (top buffers, the address map and the
  holes among its buffers) is derived from the kept rows only when asked for,
  which the agent does at a lower, budgeted cadence.

Each device buffer is counted once: two Arrays on one buffer (an output
aliased to an input, a shard the program took out of a sharded array) share
an address, and the second is remembered as an alias, counted again only if
the first goes away. A sharded array's per-device bytes come from its
sharding (``shard_shape`` × itemsize on each addressable device): reading
``addressable_shards`` (or ``_arrays``) would materialise one new
single-device Array per shard that lives as long as the parent and shows up
in the program's own ``jax.live_arrays()`` (measured: 15 arrays became 127
on an 8-device program). Such shards have no address in the map, and the map
says so. A buffer still being computed has no address yet (asking would
block): it is counted, and asked again on the next scans until it has one.

The program's own host reads do materialise those per-shard Arrays, and they
stay cached on the parent: ``np.asarray``/``jax.device_get`` of an array
sharded over 8 devices adds 16 single-device Arrays to ``jax.live_arrays()``
(8 shards and one more Array per shard, on the same 8 buffers; jax 0.10.2),
``addressable_data(i)`` adds 8, ``np.asarray`` of a replicated array 1.
Counted as ordinary arrays they would double each device's bytes. They carry
their parent's traceback, the very object (``x.traceback is
parent.traceback``), and nothing else links them: a single-device Array with
a buffer address, whose traceback is that of a live sharded array with a
shard of the same bytes, dtype and shape on that device still without an
address, is taken for that shard: the parent's shard gets the address and
the newcomer becomes its alias. Arrays made together by one jitted call
share one traceback: among same-shaped siblings the shard found may be a
sibling's, which changes no total (same device, bytes, dtype and shape).
Only if that parent then goes while the view lives on is one buffer counted
twice until one of the two goes. Where jaxlib records no traceback
(``x.traceback is None``) no view is recognised, and host reads of sharded
arrays count twice.

Objects that take no weak reference (test doubles) are read afresh on every
scan, as before this module existed.
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any, Callable, Iterable

from jaxtop.probes.base import hand_back
from jaxtop.probes.buffer_detail import DEV, DTYPE, NBYTES, NOT_READY, PTR, SHAPE, SHARDED, UNMAPPED, WHY

#: Arrays a scan takes weak references to between two hand-backs of the
#: interpreter (~0.35 µs each with :func:`_blind`: under a millisecond).
SCAN_PIECE = 2000
#: Arrays a scan reads (~7 µs each) between two hand-backs of the
#: interpreter (:func:`jaxtop.probes.base.hand_back`). Python takes it from
#: a busy thread only every 5 ms (``sys.getswitchinterval()``): while a
#: first scan read 50,000 arrays in one go, a thread of the program that
#: sleeps 200 µs in a loop beside its step loop waited up to 116-247 ms at
#: a time; handing back every 100 reads with ``sleep(0)``, up to 8-12 ms
#: (the scan's own ``jax.live_arrays()`` call holds it ~10 ms), its waits
#: over 1 ms ending with the scan (measured, 2-core VM). ``sleep(0)`` hands
#: it over only to a thread that has already waited 5 ms.
READ_PIECE = 100
#: What the address function gives for a buffer whose address only a new
#: Array would tell (jax_memory.UNASKED).
UNASKED = -2


class _Device:
    """One device's counted buffers, kept up to date arrival by arrival."""

    __slots__ = ("rows", "owners", "aliases", "bytes", "count", "unmapped", "not_ready_bytes", "_largest", "changed")

    def __init__(self) -> None:
        #: key -> the flat tuple of each counted buffer.
        self.rows: dict[int, tuple] = {}
        self.owners: dict[int, int] = {}  # ptr -> the key counted for it
        self.aliases: dict[int, dict[int, tuple]] = {}  # ptr -> other keys on that buffer
        self.bytes = 0
        self.count = 0
        self.unmapped: dict[str, int] = {}
        #: Bytes of the buffers still being computed when last asked: on an
        #: accelerator, outputs of work queued ahead of the device.
        self.not_ready_bytes = 0
        self._largest: int | None = 0  # None: to be found again
        #: True when rows changed since the detail was last derived.
        self.changed = True

    def add(self, key: int, row: tuple) -> None:
        ptr = row[PTR]
        if ptr is not None:
            if ptr in self.owners:  # another Array on the same buffer
                self.aliases.setdefault(ptr, {})[key] = row
                return
            self.owners[ptr] = key
        else:
            why = row[WHY]
            self.unmapped[why] = self.unmapped.get(why, 0) + 1
            if why == NOT_READY:
                self.not_ready_bytes += row[NBYTES]
        self._count(key, row)

    def _count(self, key: int, row: tuple) -> None:
        self.rows[key] = row
        nbytes = row[NBYTES]
        self.bytes += nbytes
        self.count += 1
        if self._largest is not None and nbytes > self._largest:
            self._largest = nbytes
        self.changed = True

    def remove(self, key: int, row: tuple) -> None:
        ptr = row[PTR]
        if ptr is not None and self.owners.get(ptr) != key:
            others = self.aliases.get(ptr)
            if others is not None:
                others.pop(key, None)
                if not others:
                    del self.aliases[ptr]
            return
        if self.rows.pop(key, None) is None:
            return
        self.bytes -= row[NBYTES]
        self.count -= 1
        self.changed = True
        if row[NBYTES] == self._largest:
            self._largest = None
        if ptr is None:
            why = row[WHY]
            if why == NOT_READY:
                self.not_ready_bytes -= row[NBYTES]
            left = self.unmapped.get(why, 0) - 1
            if left > 0:
                self.unmapped[why] = left
            else:
                self.unmapped.pop(why, None)
            return
        del self.owners[ptr]
        others = self.aliases.get(ptr)
        if others:  # the buffer lives on in another Array: it is counted for that one
            other, other_row = others.popitem()
            if not others:
                del self.aliases[ptr]
            self.owners[ptr] = other
            self._count(other, other_row)

    @property
    def largest(self) -> int:
        if self._largest is None:
            self._largest = max((row[NBYTES] for row in self.rows.values()), default=0)
        return self._largest


class LiveArrays:
    """``jax.live_arrays()`` per device, read incrementally (see the module).

    Args:
        live_arrays: returns the live arrays (``jax.live_arrays``).
        address: returns a ready buffer's address or None (never blocks).
        addressable: ``(sharding, device_set)`` -> the devices of this process
            holding a shard.
    """

    def __init__(self, live_arrays: Callable[[], list[Any]], address: Callable[[Any], int | None],
                 addressable: Callable[[Any, Any], Iterable[Any]]) -> None:
        self._live_arrays = live_arrays
        self._address = address
        self._addressable = addressable
        # key -> weak reference (it keeps the key unique: see the module's
        # docstring), and key -> the array's buffer (one flat tuple) or, for
        # a sharded array, a tuple of them (one per device).
        self._refs: dict[int, Any] = {}
        self._entries: dict[int, tuple] = {}
        self._keys: tuple[int, ...] = ()
        self._retry: set[int] = set()  # keys with a buffer that had no address yet, or unread
        self.devices: dict[int, _Device] = {}
        self._kinds: dict[tuple, tuple[int, str, str]] = {}
        # Shards of sharded arrays without an address yet, by (id of the
        # parent's traceback, device, nbytes, dtype, shape): the parents'
        # keys, for the per-shard Arrays a host read makes (see the module).
        # The parent holds its traceback, so the id is unique meanwhile.
        # A slot holds one key (an int), or a list where several arrays of
        # one call share it: one list per array would be 50,000 objects the
        # collector follows, and promoting them set off a full collection
        # of the program's heap (60-180 ms at 50,000 arrays, holding the
        # interpreter).
        self._open: dict[tuple, int | list[int]] = {}
        self._parent_tb: dict[int, int] = {}  # sharded key -> id of its traceback
        self._parent_tbs: dict[int, int] = {}  # id of such a traceback -> arrays holding it
        #: Arrays read (new to a scan, or asked again) in the last scan, and
        #: the CPU seconds reading them took (listing and comparing not counted).
        self.read_last = 0
        self.read_cpu_s = 0.0
        #: How long the last ``jax.live_arrays()`` call took (seconds, wall:
        #: the program's threads waited that long), over how many arrays.
        self.call_s: float | None = None
        self.call_count = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def refs(self) -> dict[int, Any]:
        """key -> weak reference to the array counted under it (read only)."""
        return self._refs

    def device(self, dev_id: int) -> _Device | None:
        return self.devices.get(dev_id)

    def scan(self) -> bool:
        """One pass over ``jax.live_arrays()``; True when anything changed."""
        called = time.perf_counter()
        live = self._live_arrays()
        # The call holds the interpreter throughout (one call into jaxlib):
        # its wall time is the pause it put on the program's threads.
        self.call_s, self.call_count = time.perf_counter() - called, len(live)
        self.read_last = 0
        self.read_cpu_s = 0.0
        # Each C call over every array holds the interpreter throughout: at
        # 50,000 arrays the references alone took 3-5 ms at once. In pieces
        # of SCAN_PIECE, the program's threads get it back between them.
        # (jax.live_arrays() itself is one call into jaxlib: ~0.1 us an
        # array, which no caller can cut.)
        try:
            refs: list[Any] = []
            for start in range(0, len(live), SCAN_PIECE):
                piece = list(map(weakref.ref, live[start:start + SCAN_PIECE]))
                if _blind is not None:
                    any(map(_blind, piece))
                refs.extend(piece)
                if len(live) > SCAN_PIECE:
                    hand_back()
        except TypeError:
            return self._rescan_all(live)
        keys = tuple(map(id, refs))
        # Buffers that had no address at the last scan first: a newcomer
        # read just below was asked a moment ago.
        started = time.thread_time()
        changed = self._ask_again() if self._retry else False
        self.read_cpu_s += time.thread_time() - started
        if keys != self._keys:
            changed = True
            # Sets of ints: nothing the cyclic collector follows. (Pairs of
            # reference and array made for every array were promoted by the
            # collections they set off, and every few scans the collector
            # then walked the whole program's heap: 80 ms, holding the GIL.)
            now = set(keys)
            for key in self._refs.keys() - now:
                self._forget(key)
            new = now - self._refs.keys()
            started = time.thread_time()
            # jax.live_arrays() lists the newest first: the newcomers are
            # found at the head, without indexing every array. They are read
            # oldest first, so that a sharded array is known before the
            # per-shard Arrays a later host read made of it.
            found = []
            for i, key in enumerate(keys):
                if not new:
                    break
                if key in new:
                    new.discard(key)
                    found.append(i)
            for n, i in enumerate(reversed(found), 1):
                self._read(keys[i], refs[i], live[i])
                if n % READ_PIECE == 0:
                    hand_back()
            self.read_cpu_s += time.thread_time() - started
            self._keys = keys
        return changed

    def _rescan_all(self, live: list[Any]) -> bool:
        """Objects without weak references: read them all, every scan."""
        for key in list(self._refs):
            self._forget(key)
        holders = []  # the objects themselves, for this scan only: ids stay unique meanwhile
        for arr in live:
            holders.append(arr)
            self._read(id(arr), None, arr)
        self._keys = ()
        self._retry.clear()
        return True

    def _ask_again(self) -> bool:
        changed = False
        for key in list(self._retry):
            ref = self._refs.get(key)
            arr = ref() if ref is not None else None
            if arr is None:
                self._retry.discard(key)
                continue
            self._forget(key)
            self._read(key, ref, arr)
            changed = True
        return changed

    def _forget(self, key: int) -> None:
        self._refs.pop(key, None)
        entry = self._entries.pop(key, None)
        self._retry.discard(key)
        if not entry:
            return
        rows = (entry,) if entry[0].__class__ is int else entry
        tb = self._parent_tb.pop(key, None)
        if tb is not None:
            left = self._parent_tbs.pop(tb) - 1
            if left:
                self._parent_tbs[tb] = left
            for row in rows:
                if row[PTR] is None:
                    self._close_slot((tb, row[DEV], row[NBYTES], row[DTYPE], row[SHAPE]), key)
        for row in rows:
            dev = self.devices.get(row[DEV])
            if dev is not None:
                dev.remove(key, row)

    def _kind(self, shape: tuple, dtype: Any) -> tuple[int, str, str]:
        """``(nbytes, dtype name, shape text)`` of an array of this shape and
        dtype, worked out once per kind: numpy's ``str(dtype)`` is ~5 µs and
        ``Array.nbytes`` ~1.5 µs, and a model's arrays come in few kinds."""
        try:
            return self._kinds[(shape, dtype)]
        except KeyError:
            kind = self._kinds[(shape, dtype)] = (math.prod(shape) * _itemsize(dtype), str(dtype), str(list(shape)))
            if len(self._kinds) > 100_000:  # shapes that vary without end: start over
                self._kinds.clear()
            return kind
        except TypeError:  # an unhashable stand-in
            return (math.prod(shape) * _itemsize(dtype), str(dtype), str(list(shape)))

    def _read(self, key: int, ref: Any, arr: Any) -> None:
        self.read_last += 1
        try:
            dtype = arr.dtype
            shape = tuple(arr.shape)
            sharding = arr.sharding
            devs = sharding.device_set
            if len(devs) == 1:
                (dev,) = devs
                nbytes, dtype_name, shape_text = self._kind(shape, dtype)
                ptr = self._address(arr)
                if ptr == UNASKED and self._parent_tbs and id(getattr(arr, "traceback", None)) in self._parent_tbs:
                    # The traceback of an array counted without addresses:
                    # one of the single-device Arrays a host read made on
                    # that array's buffers (never another array jax
                    # assembled: each has its own traceback), which answers
                    # with itself.
                    ptr = self._address(arr, True)
                if ptr is not None and ptr < 0:
                    if ptr != UNASKED:
                        # Its computation failed (jax_memory.FAILED): no buffer, no
                        # memory held. Counted as nothing, and never asked again.
                        self._refs[key] = ref
                        self._entries[key] = ()
                        return
                    # A buffer whose address only a new Array would tell:
                    # counted without one, like a sharded array's shard, and
                    # the Arrays the program's host reads make on it are
                    # recognised the same way (see the module).
                    entry: tuple = (dev.id, nbytes, None, dtype_name, shape_text, UNMAPPED)
                    self._open_slots(key, arr, (entry,))
                    self._place(key, ref, entry, (entry,))
                    return
                entry = (dev.id, nbytes, ptr, dtype_name, shape_text, None if ptr is not None else NOT_READY)
                if ptr is None:
                    self._retry.add(key)
                elif self._open:
                    self._take_shard(arr, entry)
                rows: tuple = (entry,)
            else:
                nbytes, dtype_name, shape_text = self._kind(tuple(sharding.shard_shape(shape)), dtype)
                entry = rows = tuple((dev.id, nbytes, None, dtype_name, shape_text, SHARDED)
                                     for dev in self._addressable(sharding, devs))
                self._open_slots(key, arr, rows)
        except Exception:
            # Deleted or donated while we looked: it leaves live_arrays() by
            # the next scan. Until then it counts for nothing, and is asked
            # again in case it was a passing failure.
            self._refs[key] = ref
            self._entries[key] = ()
            if ref is not None:
                self._retry.add(key)
            return
        self._place(key, ref, entry, rows)
        if rows and rows[0][PTR] is not None:
            self._note_child(arr, rows[0])

    def _open_slots(self, key: int, arr: Any, rows: tuple) -> None:
        """Make ``arr``'s buffers without an address findable by the Arrays
        that the program's host reads make on them (same traceback)."""
        tb = getattr(arr, "traceback", None)
        if tb is not None and rows:
            tb_id = self._parent_tb[key] = id(tb)
            self._parent_tbs[tb_id] = self._parent_tbs.get(tb_id, 0) + 1
            for row in rows:
                slot = (tb_id, row[DEV], row[NBYTES], row[DTYPE], row[SHAPE])
                held = self._open.get(slot)
                if held is None:
                    self._open[slot] = key
                elif held.__class__ is int:
                    self._open[slot] = [held, key]
                else:
                    held.append(key)

    def _close_slot(self, slot: tuple, key: int) -> None:
        held = self._open.get(slot)
        if held is None:
            return
        if held.__class__ is int:
            if held == key:
                del self._open[slot]
            return
        try:
            held.remove(key)
        except ValueError:
            pass
        if len(held) == 1:
            self._open[slot] = held[0]

    def _slot_of(self, arr: Any, kind: tuple) -> tuple | None:
        """The open slot (see ``_open``) ``arr`` fits: same traceback object,
        device, bytes, dtype and shape; None if none."""
        try:
            tb = arr.traceback
        except Exception:
            return None
        if tb is None:
            return None
        slot = (id(tb),) + kind
        return slot if slot in self._open else None

    def _take_shard(self, arr: Any, row: tuple) -> None:
        """``arr`` (single-device, with an address) may be a per-shard Array
        of a sharded array seen before: then that array's shard on this
        device gets the address, and ``arr`` becomes its alias when placed."""
        dev = self.devices.get(row[DEV])
        if dev is None or row[PTR] in dev.owners:
            return  # a buffer already counted: arr will be its alias anyway
        slot = self._slot_of(arr, (row[DEV], row[NBYTES], row[DTYPE], row[SHAPE]))
        if slot is None:
            return
        held = self._open[slot]
        if held.__class__ is int:
            parent = held
            del self._open[slot]
        else:
            parent = held.pop()
            if len(held) == 1:
                self._open[slot] = held[0]
        entry = self._entries.get(parent)
        if not entry:
            return
        single = entry[0].__class__ is int
        rows = [entry] if single else list(entry)
        for i, old in enumerate(rows):
            if old[DEV] == row[DEV] and old[PTR] is None:
                shard = (old[DEV], old[NBYTES], row[PTR], old[DTYPE], old[SHAPE], None)
                dev.remove(parent, old)
                dev.add(parent, shard)
                rows[i] = shard
                self._entries[parent] = shard if single else tuple(rows)
                return

    def _place(self, key: int, ref: Any, entry: tuple, rows: tuple) -> None:
        self._refs[key] = ref
        self._entries[key] = entry
        for row in rows:
            dev = self.devices.get(row[DEV])
            if dev is None:
                dev = self.devices[row[DEV]] = _Device()
            dev.add(key, row)

    def _note_child(self, arr: Any, row: tuple) -> None:
        """Asking jaxlib for a buffer's address makes an Array it had not
        made yet for some arrays: those from ``jax.device_put`` on jax
        0.10.2 (a jit output is its own single-device array), every array on
        jax 0.4.30 (measured, CPU). That second Array,
        on the same buffer, is cached on the first and appears in
        ``jax.live_arrays()`` from then on, as after the program's own
        ``np.asarray(x)``. It is taken in now, as the alias it is, so that
        the next scan need not read it."""
        try:
            kids = arr._arrays
            if not kids or len(kids) != 1 or kids[0] is arr:
                return
            ref = weakref.ref(kids[0])
            if _blind is not None:
                _blind(ref)
        except Exception:
            return
        key = id(ref)
        if key not in self._refs:
            self._place(key, ref, row, (row,))

    def clear(self) -> None:
        """Forget every array (the references go, nothing of the program's is touched)."""
        self._refs.clear()
        self._entries.clear()
        self._keys = ()
        self._retry.clear()
        self.devices.clear()
        self._open.clear()
        self._parent_tb.clear()
        self._parent_tbs.clear()


def _collector_blind() -> Callable[[Any], None] | None:
    """CPython's ``PyObject_GC_UnTrack``, through a function object of our
    own (``ctypes.pythonapi``'s are shared with the program); None where
    there is none (another interpreter, no ctypes).

    The cyclic collector runs a full pass over the program's whole heap
    once the objects that survived into its oldest generation since the
    last one reach a quarter of those it holds. A weak reference per live
    array is one such object per array: at 50,000 arrays (a heap of ~300,000
    objects) the first scan's references set off a full collection of
    ~60-90 ms, on whichever thread allocated next, holding the interpreter.
    A weak reference without a callback holds nothing the collector could
    follow (it does not own its referent; clearing it when the referent dies
    goes by the referent's own list, tracked or not), so taking it out of
    the collector's lists changes no collection's outcome, only its cost.
    CPython allows untracking an untracked object again (its deallocator
    does)."""
    try:
        import ctypes

        untrack = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("PyObject_GC_UnTrack", ctypes.pythonapi))
    except Exception:
        return None
    return untrack


#: Takes a callback-less weak reference out of the collector's lists (see
#: :func:`_collector_blind`); ~0.25 µs a call.
_blind = _collector_blind()


def _itemsize(dtype: Any) -> int:
    itemsize = getattr(dtype, "itemsize", None)
    if itemsize is None:
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
    return int(itemsize)
