"""Host syncs: which lines of the user's code read device arrays on the host.

``float(x)``, ``x.item()``, ``np.asarray(x)``, ``print(x)``, ``bool(x)``,
``int(x)``, ``x.tolist()``… each wait for the computation that produces
``x`` and copy it to the host: the program stalls there. This probe counts
them per call site (the innermost frame of the user's code) and per kind.

Where the reads go, checked on jax 0.4.30 and 0.10.2 (CPU, numpy 2):

* ``ArrayImpl._value`` (a Python property; it copies device->host when
  ``_npy_value`` is None and caches the copy where it had to make one) is
  reached by ``__float__``, ``__int__``, ``__bool__``, ``__complex__``,
  ``__index__``, ``tolist``, ``tobytes``, ``__str__`` (so ``print``),
  ``__repr__``, ``__format__`` and, where numpy calls it, ``__array__``.
* ``np.asarray(x)`` / ``np.array(x)`` of a single-device **CPU** array never
  reach Python: jaxlib's ArrayImpl exports the buffer protocol, which numpy
  tries before ``__array__``, so neither ``__array__`` nor ``_value`` runs.
  ``x.item()`` goes through ``np.asarray`` (jax's ``_item`` calls
  ``np.asarray(self)``), so it takes the same path. On GPU, and for arrays
  over several devices, the buffer export is refused and numpy falls back
  to ``__array__`` -> ``_value``.

So the hooks are: the ``_value`` property of ``ArrayImpl`` (replaced by a
wrapper property, and put back, the same object, on :meth:`HostSyncProbe.stop`)
and, only when asked for, numpy's ``asarray``, ``array`` and ``asanyarray``
module functions (wrapped; the wrappers pass any argument that is not a jax
Array straight through). Those wrappers are not on by default because they
cost every numpy call of the program, on any data: a Python function runs
first, about 120 ns (``np.asarray`` of an ndarray: 170 ns instead of 48;
``np.array`` of 100 floats: 0.94 of its speed; ``benchmarks/numpy_wrappers.py``).
No cheaper way sees those reads: numpy takes a CPU Array's buffer in C, and no
Python code runs between the call and the copy (a replacement of ArrayImpl's
buffer slot through ctypes would see them at no cost to other data, but a
ctypes callback cannot hand jaxlib's refusal on: ``memoryview`` of a deleted,
bfloat16 or sharded array would raise SystemError instead of BufferError).

So by default a CPU program's ``np.asarray(x)`` and ``np.array(x)`` go
uncounted, and the record says so (``uncounted``), on the screen too;
``x.item()`` is counted all the same, by a wrapper on jax's own
``ArrayImpl.item`` (Python, so it costs no other code anything). ``JAXTOP_NUMPY_HOOKS=1`` wraps numpy (while the program has a CPU
device; on GPU and TPU every read reaches ``_value`` anyway), and a budget
that names ``host_syncs`` turns the wrappers on for the program it measures
(:meth:`HostSyncProbe.count_numpy_reads`): there an uncounted read would pass
a limit it breaks. ``JAXTOP_NUMPY_HOOKS=0`` keeps numpy untouched even then.

A thread-local flag makes a read count once when it passes through two
hooks (``np.asarray`` -> ``__array__`` -> ``_value`` on GPU; ``x.item()`` ->
``np.asarray`` -> ``_value``).

A read counts only when it really reads the device: ``_npy_value`` is None
(on GPU a second ``float(x)`` of the same array is served from jax's cached
copy and is not counted; on CPU jax never caches, so every read counts). The
hooks never change a result or an exception: they call the original and
count after it returned; the count itself is guarded. Only an actual read
walks the stack, once.

Not seen on CPU, even with the wrappers: NumPy functions other than the
three wrapped ones that take a CPU jax Array through the buffer protocol
(``np.exp(x)``, ``np.concatenate([x, y])``, ``np.asarray([x, y])``) and
names bound before the wrappers went in (``from numpy import asarray``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from jaxtop.probes.frames import HOOK_CODES, LIBRARY, NO_STACK, LibraryFilter, SiteKey, site_text, walk
from jaxtop.probes.jaxstate import backend_ready

__all__ = ["HostSyncProbe", "KINDS", "array_class_state"]

#: The kind of a read, by the name of the library function it went through.
#: The outermost such frame wins: ``jax.device_get`` -> ``__array__`` is a
#: ``device_get``, ``x.item()`` -> ``np.asarray`` an ``item``.
KINDS = {
    "__float__": "float",
    "__int__": "int",
    "__bool__": "bool",
    "__complex__": "complex",
    "__index__": "index",
    "__hex__": "index",
    "__oct__": "index",
    "tolist": "tolist",
    "tobytes": "tobytes",
    "_item": "item",
    "item": "item",
    "__array__": "asarray",
    "__str__": "str",
    "__repr__": "repr",
    "__format__": "format",
    "__iter__": "iter",
    "device_get": "device_get",
    "_device_get": "device_get",
}
#: Numpy's module functions wrapped when asked for (a CPU program's reads
#: through them reach no jax hook).
NUMPY_FUNCTIONS = {"asarray": "asarray", "array": "array", "asanyarray": "asarray"}
#: Frames walked at most, looking for the user's.
MAX_DEPTH = 64  # as jaxtop.probes.frames.MAX_DEPTH
#: Call sites kept at most; later new ones are counted under one "other" site.
MAX_SITES = 2000
#: Sites listed per record (most reads first).
RECORD_SITES = 50

OTHER_SITE: SiteKey = ("", 0, "<other sites>")
NO_USER_FRAME: SiteKey = ("", 0, "<no user frame>")
_MISSING: Any = object()  # a numpy wrapper called without any positional argument

_install_lock = threading.Lock()
_active: "HostSyncProbe | None" = None  # the probe whose hooks are installed
# Every probe made in this process, for the fork handler below.
_probes: "weakref.WeakSet[HostSyncProbe]" = weakref.WeakSet()


def _renew_locks_in_child() -> None:
    """A child made by ``os.fork()`` gets a copy of each lock as it was at
    the fork, held or not, but none of the parent's other threads. A lock
    that one of them held (a reader counting a read, the agent thread taking
    a snapshot) would never be released: the child's first host read would
    wait on it forever. The hooks stay in and keep counting in the child."""
    global _install_lock
    _install_lock = threading.Lock()
    for probe in list(_probes):
        probe._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)


def _numpy_hooks_from_env() -> tuple[bool | str, bool]:
    """What ``numpy_hooks="auto"`` means here: ``(mode, refused)``.

    ``$JAXTOP_NUMPY_HOOKS`` ``1``/``on``: ``"cpu"`` (wrapped while the
    program has a CPU device); ``0``/``off``: never, not even for a budget
    (``refused``); unset: off until a budget asks for them."""
    value = os.environ.get("JAXTOP_NUMPY_HOOKS", "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return False, True
    if value in ("1", "on", "true", "yes"):
        return "cpu", False
    return False, False


def _array_impl() -> Any:
    from jax._src.array import ArrayImpl

    return ArrayImpl


def array_class_state() -> dict[str, Any]:
    """What :meth:`HostSyncProbe.stop` promises to leave as it found: the
    attributes of ``ArrayImpl`` and ``jax.Array`` and numpy's wrapped
    functions, by identity (tests compare two of these with ``is``)."""
    import jax
    import numpy as np

    impl = _array_impl()
    return {
        "ArrayImpl": dict(vars(impl)),
        "Array": dict(vars(jax.Array)),
        "numpy": {name: getattr(np, name) for name in NUMPY_FUNCTIONS},
    }


class HostSyncProbe:
    """Counts host reads of device arrays per call site and kind.

    Args:
        numpy_hooks: wrap numpy's ``asarray``/``array``/``asanyarray``:
            ``"cpu"`` wraps them at :meth:`start` and unwraps them at the
            first :meth:`sample` that finds a backend without any CPU device
            (there every such read reaches ``_value``); True keeps them;
            False does not wrap them until :meth:`count_numpy_reads` asks.
            ``"auto"`` (default) is ``$JAXTOP_NUMPY_HOOKS``: ``1``/``on`` is
            ``"cpu"``, ``0``/``off`` never wraps (not even when asked),
            unset is False.
        filt: what counts as library code.
        min_interval_s: least time between two records on the stream.
        heartbeat_s: a record at least this often even without new reads,
            so that a client connecting later finds the counts in its
            backfill.
    """

    def __init__(self, numpy_hooks: bool | str = "auto", filt: LibraryFilter = LIBRARY,
                 min_interval_s: float = 0.5, heartbeat_s: float = 10.0) -> None:
        self.numpy_refused = False  # $JAXTOP_NUMPY_HOOKS=0: numpy stays untouched
        if numpy_hooks == "auto":
            numpy_hooks, self.numpy_refused = _numpy_hooks_from_env()
        self.numpy_hooks: bool | str = numpy_hooks
        self.cpu_device: bool | None = None  # the backend has a CPU device (None: no backend yet)
        self._filt = filt
        self._lock = threading.Lock()
        self._tls = threading.local()
        # site -> kind -> count; last_t per site
        self._counts: dict[SiteKey, dict[str, int]] = {}
        self._last_t: dict[SiteKey, float] = {}
        self._kinds: dict[str, int] = {}
        self.total = 0
        self._version = 0
        self._sent_version = -1
        self._sent_t = -1e18
        self.min_interval_s = float(min_interval_s)
        self.heartbeat_s = float(heartbeat_s)
        self._impl: Any = None
        self._orig_value: Any = None
        self._our_value: Any = None
        self._orig_item: Any = None
        self._our_item: Any = None
        self._np: Any = None
        self._orig_np: dict[str, Any] = {}
        self._our_np: dict[str, Any] = {}
        self._backend_checked = False
        self.reason: str | None = None  # why the probe is not counting
        self.started = False
        #: Told of each counted read, on the reading thread, after it:
        #: ``(site, kind, time)`` (the transfer-sites probe).
        self.on_read: Callable[[SiteKey, str, float], None] | None = None
        _probes.add(self)

    # -- the probe interface (jaxtop.probes.base): sample field ``host_syncs`` --
    name = "host_syncs"
    needs_jax = True

    def on_tick(self, tick: Any) -> dict[str, Any] | None:
        if tick.final:
            # The last sample carries every count, whenever the last record
            # went out: reads just before exit are not lost to the rate limit.
            try:
                self._check_backend()
            except Exception:
                pass
            return self.snapshot()
        return self.sample()

    def install(self, agent: Any) -> "HostSyncProbe":
        """Make this the agent's host-read probe, in place of the one it has
        (the agent starts it once jax is imported, stops it when it stops)."""
        agent.add_probe(self)
        return self

    def start(self) -> None:
        """Installs the hooks. Needs jax imported; never creates a backend.

        Only one probe of a process has its hooks in at a time: starting a
        second one leaves it off, with a ``reason``.
        """
        global _active
        with _install_lock:
            if self.started:
                return
            if _active is not None:
                self.reason = "another HostSyncProbe is counting in this process"
                return
            try:
                impl = _array_impl()
                original = vars(impl)["_value"]
                fget = original.fget
            except Exception as exc:
                self.reason = f"jax.Array._value not found: {type(exc).__name__}: {exc}"
                return
            self._impl, self._orig_value = impl, original
            self._our_value = property(self._value_hook(fget), doc=getattr(original, "__doc__", None))
            setattr(impl, "_value", self._our_value)
            # ``x.item()`` is jax's Python (``np.asarray(self)`` inside): a
            # wrapper here counts it on CPU too, at no cost to other code.
            item = vars(impl).get("item")
            if callable(item):
                self._orig_item, self._our_item = item, self._item_hook(item)
                setattr(impl, "item", self._our_item)
            if self.numpy_hooks:
                self._wrap_numpy()
            self.started = True
            self.reason = None
            _active = self

    def stop(self) -> None:
        """Takes the hooks out: ``ArrayImpl._value`` and numpy's functions
        are again the very objects they were before :meth:`start`.

        Where someone else replaced one of them after us, theirs is left in
        place (ours underneath turns into a plain pass-through).
        """
        global _active
        with _install_lock:
            if not self.started:
                return
            self.started = False
            impl = self._impl
            if vars(impl).get("_value") is self._our_value:
                setattr(impl, "_value", self._orig_value)
            if self._our_item is not None and vars(impl).get("item") is self._our_item:
                setattr(impl, "item", self._orig_item)
            self._orig_item = self._our_item = None
            self._unwrap_numpy()
            if _active is self:
                _active = None

    def _wrap_numpy(self) -> None:
        try:
            import numpy as np
        except Exception:
            return
        self._np = np
        for name, kind in NUMPY_FUNCTIONS.items():
            original = getattr(np, name, None)
            if original is None:
                continue
            wrapper = self._numpy_hook(original, kind)
            self._orig_np[name], self._our_np[name] = original, wrapper
            setattr(np, name, wrapper)

    def _unwrap_numpy(self) -> None:
        np = self._np
        for name, original in list(self._orig_np.items()):
            if np is not None and getattr(np, name, None) is self._our_np.get(name):
                setattr(np, name, original)
        self._orig_np.clear()
        self._our_np.clear()

    @property
    def numpy_wrapped(self) -> bool:
        return bool(self._our_np)

    def count_numpy_reads(self) -> bool:
        """Wrap numpy's functions now (or at :meth:`start`) so that a CPU
        program's ``np.asarray(x)``/``np.array(x)`` count: a budget on host
        syncs asks for it. False when ``$JAXTOP_NUMPY_HOOKS=0`` refuses."""
        if self.numpy_refused:
            return False
        with _install_lock:
            if self.numpy_hooks is False:
                self.numpy_hooks = "cpu"
            if self.started and not self._our_np and self.cpu_device is not False:
                self._wrap_numpy()
        return True

    def uncounted(self) -> str | None:
        """Which reads this probe cannot see now, or None when it sees them all."""
        if not self.started or self.numpy_wrapped or self.cpu_device is not True:
            return None
        why = ("JAXTOP_NUMPY_HOOKS=0" if self.numpy_refused else
               "JAXTOP_NUMPY_HOOKS=1 counts them, at ~120 ns on every numpy call")
        return f"np.asarray/np.array of CPU arrays not counted: numpy reads them in C ({why})"

    # -- the hooks (user threads) ---------------------------------------------------
    def _value_hook(self, fget: Callable[[Any], Any]) -> Callable[[Any], Any]:
        tls = self._tls
        read = self._counted_read

        def _value(arr: Any) -> Any:
            # Decided before the read: the read itself fills the cache.
            fresh = getattr(arr, "_npy_value", None) is None
            if not fresh or getattr(tls, "busy", False):
                return fget(arr)
            return read(sys._getframe(1), None, fget, arr)

        HOOK_CODES.add(_value.__code__)  # hidden from the program's tracebacks (frames.without_hooks)
        return _value

    def _item_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tls = self._tls
        read = self._counted_read

        @functools.wraps(original)
        def item(arr: Any, *args: Any, **kwargs: Any) -> Any:
            fresh = getattr(arr, "_npy_value", None) is None
            if not fresh or getattr(tls, "busy", False):
                return original(arr, *args, **kwargs)
            return read(sys._getframe(1), "item", original, arr, *args, **kwargs)

        HOOK_CODES.add(item.__code__)
        return item

    def _numpy_hook(self, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        tls = self._tls
        read = self._counted_read
        impl = self._impl
        missing = _MISSING

        # Every numpy call of the program goes through this wrapper, nearly
        # all on plain data: that path is one type check and the call as it
        # came. The first argument is positional-only here, so that every
        # keyword (``object=``, ``a=``) reaches numpy's own parser, and a
        # call without keywords or more arguments is passed on without
        # unpacking any: np.asarray of an ndarray takes 170 ns against 215
        # with *args and **kwargs throughout (48 unwrapped; Python 3.11).
        @functools.wraps(original)
        def wrapper(arr: Any = missing, /, *args: Any, **kwargs: Any) -> Any:
            if type(arr) is not impl:
                if kwargs:
                    return original(**kwargs) if arr is missing else original(arr, *args, **kwargs)
                if args:
                    return original(arr, *args)
                return original() if arr is missing else original(arr)
            # Only an Array passed first, positionally, is a read to count.
            if getattr(tls, "busy", False) or getattr(arr, "_npy_value", None) is not None:
                return original(arr, *args, **kwargs)
            return read(sys._getframe(1), kind, original, arr, *args, **kwargs)

        return wrapper

    def _counted_read(self, frame: Any, kind: str | None, read: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``read(*args, **kwargs)``, counted once at ``frame`` when it returns:
        the hooks it passes through meanwhile (``np.asarray`` -> ``__array__``
        -> ``_value``) count nothing."""
        tls = self._tls
        tls.busy = True
        try:
            value = read(*args, **kwargs)
        finally:
            tls.busy = False
        self._record(frame, kind)
        return value

    def _record(self, frame: Any, kind: str | None) -> None:
        """One read: find the user's frame (one walk), count it. Never raises."""
        try:
            filt = self._filt
            # The outermost library function that names the read says what the user did.
            site, library, kind = walk(frame, filt, MAX_DEPTH, KINDS, kind)
            if site is NO_STACK or (library and filt.is_core(site[0])):
                site = NO_USER_FRAME  # jax and numpy only: no line to name
            kind = kind or "other"
            now = time.time()
            with self._lock:
                counts = self._counts.get(site)
                if counts is None:
                    if len(self._counts) >= MAX_SITES:
                        site = OTHER_SITE
                        counts = self._counts.setdefault(site, {})
                    else:
                        counts = self._counts[site] = {}
                counts[kind] = counts.get(kind, 0) + 1
                self._last_t[site] = now
                self._kinds[kind] = self._kinds.get(kind, 0) + 1
                self.total += 1
                self._version += 1
            listener = self.on_read
            if listener is not None:
                # After the read: its device-to-host guard line is written.
                listener(site, kind, now)
        except Exception:
            pass  # counting must never disturb the read

    # -- reading (agent thread, tests) ------------------------------------------------
    def counts(self) -> dict[SiteKey, dict[str, int]]:
        """``{(file, line, function): {kind: count}}`` so far (a copy)."""
        with self._lock:
            return {k: dict(v) for k, v in self._counts.items()}

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._last_t.clear()
            self._kinds.clear()
            self.total = 0
            self._version += 1

    def _check_backend(self) -> None:
        """Once the backend exists: does it have a CPU device (whose buffers
        numpy reads past every jax hook)? ``"cpu"`` keeps numpy's wrappers
        only then."""
        if self._backend_checked or not self.started:
            return
        if not backend_ready():
            return
        self._backend_checked = True
        import jax

        self.cpu_device = any(getattr(d, "platform", "") == "cpu" for d in jax.local_devices())
        if not self.cpu_device and self.numpy_hooks == "cpu":
            with _install_lock:
                self._unwrap_numpy()

    def snapshot(self, now: float | None = None, limit: int = RECORD_SITES) -> dict[str, Any]:
        """The ``host_syncs`` record now (whether or not anything changed)."""
        with self._lock:
            items = [(k, dict(v), self._last_t.get(k)) for k, v in self._counts.items()]
            kinds = dict(self._kinds)
            total = self.total
        items.sort(key=lambda kv: (-sum(kv[1].values()), site_text(kv[0]), kv[0][2]))
        sites = []
        for key, kinds_of, last_t in items[:max(0, limit)]:
            filename, line, name = key
            sites.append({
                "site": site_text(key), "function": name, "file": filename, "line": line,
                "count": sum(kinds_of.values()), "kinds": dict(sorted(kinds_of.items())), "last_t": last_t,
            })
        record: dict[str, Any] = {
            "t": time.time() if now is None else now,
            "available": self.started,
            "count": total,
            "by_kind": dict(sorted(kinds.items())),
            "sites_total": len(items),
            "sites": sites,
            "numpy_hooks": self.numpy_wrapped,
        }
        uncounted = self.uncounted()
        if uncounted:
            record["uncounted"] = uncounted
        if not self.started:
            record["reason"] = self.reason or "not started"
        return record

    def sample(self) -> dict[str, Any] | None:
        """The sample field: a record when the counts changed (at most every
        ``min_interval_s``) or every ``heartbeat_s``; else None."""
        try:
            self._check_backend()
        except Exception:
            pass
        now = time.monotonic()
        changed = self._version != self._sent_version
        if not ((changed and now - self._sent_t >= self.min_interval_s) or now - self._sent_t >= self.heartbeat_s):
            return None
        self._sent_version, self._sent_t = self._version, now
        return self.snapshot()


# A read's exception passes through this frame too: hidden from the program's tracebacks.
HOOK_CODES.add(HostSyncProbe._counted_read.__code__)
