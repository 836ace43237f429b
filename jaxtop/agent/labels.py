"""Named pytrees: ``jaxtop.label("params", params)``.

The dashboard then shows what each named tree holds ("params 1.2 GiB,
opt_state 2.4 GiB, batch 64 MiB"). A label keeps nothing alive: it holds a
weak reference and the byte size of each array leaf, so dropping the tree
frees its memory and the label's bytes fall to what is still alive. (jaxlib's
ArrayImpl accepts weak references in every version checked, 0.4.30 to 0.10.2,
although ``hasattr(x, "__weakref__")`` is False or even raises there; a leaf
that refuses one is remembered by ``id()``, shape and dtype and looked up in
``jax.live_arrays()`` when the label is read.)

Without an agent reading labels (no :func:`install`, or its agent stopped)
``label`` returns at once and records nothing. Calling it again with the same
name replaces the tree.

A tree made of immutable containers (dicts, lists, tuples of arrays: a
functional training loop's ``params``) is the arrays it held when labelled:
the next step makes new ones, so label it each step with the current state.
An object that holds its arrays in mutable state and takes a weak reference
(a Flax NNX ``Module``, ``nnx.state(model)``, an ``nnx.Optimizer``: each
step swaps the arrays inside its Variables) is followed instead: its leaves
are listed again when the label is read, at most every
:data:`REFLATTEN_MIN_S`: when an array listed is gone, or else no more
often than listing costs :data:`REFLATTEN_SHARE` of the agent's thread
(measured: 2 ms for a 400-leaf NNX model; a model whose listing takes more
than :data:`QUICK_LIST_S` is listed on that cadence only, and reads low in
between). Labelling it once is enough.

Bytes are ``sum(x.nbytes for x in tree_leaves(tree))`` over the leaves that
are ``jax.Array``\\ s and still alive (not deleted, e.g. by donation):
``nbytes`` is the logical size, so an array replicated over 8 devices counts
once. Tracers (a ``label`` call inside ``jit``) and host values are skipped.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Callable, TypeVar
from jaxtop.probes.forksafe import ForkLock

__all__ = ["label", "install", "uninstall", "read", "LabelRegistry", "MAX_LABELS"]

T = TypeVar("T")

#: Names kept at most; later new names are ignored (and counted).
MAX_LABELS = 256
#: A followed object's leaves are listed again at most this often...
REFLATTEN_MIN_S = 1.0
#: ...and no more often than this share of a core pays for the listing,
REFLATTEN_SHARE = 0.002
#: except when an array listed is gone and listing took at most this long.
QUICK_LIST_S = 0.005
#: How a leaf is referred to (tests replace it to check the id() fallback).
_weak = weakref.ref


class _Tree:
    __slots__ = ("name", "refs", "sizes", "ids", "leaves", "labelled_t", "root", "next_flatten", "listed", "cost")

    def __init__(self, name: str, labelled_t: float) -> None:
        self.name = name
        self.root: Any = None  # a weak reference to a followed object (see the module)
        self.next_flatten = 0.0  # monotonic time of its next listing
        self.listed = 0.0  # ... and of the last one, which took ``cost`` seconds
        self.cost = 0.0
        self.refs: list[Any] = []  # weak references to the array leaves
        # Each leaf's nbytes, filled in by the first read: ``x.nbytes`` is a
        # Python property (~0.5 us), so the agent's thread pays it, once per
        # leaf, rather than the program's on every label() call.
        self.sizes: list[int | None] = []
        self.ids: list[tuple[int, tuple, str, int]] = []  # (id, shape, dtype, nbytes): leaves without weakref
        self.leaves = 0
        self.labelled_t = labelled_t


class LabelRegistry:
    """The named trees of one process, and how much of each is alive.

    Args:
        min_interval_s: least time between two records on the stream.
        heartbeat_s: a record at least this often even when nothing changed,
            for clients that connect later (they get the backfill).
    """

    def __init__(self, min_interval_s: float = 0.5, heartbeat_s: float = 10.0) -> None:
        self._lock = ForkLock()
        self._trees: dict[str, _Tree] = {}
        self.dropped_names = 0
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self._version = 0
        self._sent: tuple[Any, ...] | None = None
        self._sent_t = -1e18
        self._last_read_t = -1e18

    def add(self, name: str, tree: Any) -> None:
        """Records ``tree`` under ``name`` (replacing what was there)."""
        jax = sys.modules.get("jax")
        if jax is None:
            return  # no jax imported: there can be no device arrays
        entry = _Tree(str(name), time.time())
        _fill(entry, jax, tree)
        if type(tree) not in (dict, list, tuple) and type(tree) is not _array_impl():
            try:
                entry.root = _weak(tree)  # an object with mutable state: followed
                entry.next_flatten = time.monotonic() + REFLATTEN_MIN_S
            except TypeError:
                pass
        with self._lock:
            if entry.name not in self._trees and len(self._trees) >= MAX_LABELS:
                self.dropped_names += 1
                return
            self._trees[entry.name] = entry
            self._version += 1

    def _follow(self, entry: _Tree) -> None:
        """List a followed object's leaves again, when due (agent thread):
        on its cadence, or as soon as one of the arrays listed is gone (the
        step swapped it) unless listing costs more than :data:`QUICK_LIST_S`."""
        if entry.root is None:
            return
        now = time.monotonic()
        if now < entry.next_flatten:
            if entry.cost > QUICK_LIST_S or now - entry.listed < REFLATTEN_MIN_S:
                return
            if all(ref() is not None for ref in entry.refs):
                return
        root = entry.root()
        jax = sys.modules.get("jax")
        if root is None or jax is None:
            entry.root = None  # gone: its arrays are what was last listed
            return
        started = time.perf_counter()
        fresh = _Tree(entry.name, entry.labelled_t)
        try:
            _fill(fresh, jax, root)
        except Exception:
            return  # changed under us (the program's step): next time
        entry.cost = cost = time.perf_counter() - started
        entry.listed = now
        entry.refs, entry.sizes, entry.ids, entry.leaves = fresh.refs, fresh.sizes, fresh.ids, fresh.leaves
        entry.next_flatten = now + max(REFLATTEN_MIN_S, cost / REFLATTEN_SHARE)

    def remove(self, name: str) -> None:
        with self._lock:
            if self._trees.pop(str(name), None) is not None:
                self._version += 1

    def clear(self) -> None:
        """Forgets every label and what was sent (the next record starts afresh)."""
        with self._lock:
            self._trees.clear()
            self._version += 1
            self.dropped_names = 0
            self._sent = None
            self._sent_t = self._last_read_t = -1e18

    def read(self) -> list[dict[str, Any]]:
        """Each named tree now: ``{name, bytes, arrays, alive, leaves,
        labelled_t}``: ``bytes`` of the array leaves still alive, ``arrays``
        the array leaves labelled, ``leaves`` all leaves."""
        with self._lock:
            trees = list(self._trees.values())
        live_ids: dict[int, Any] | None = None
        out = []
        for entry in trees:
            self._follow(entry)
            nbytes = alive = 0
            sizes = entry.sizes
            for i, ref in enumerate(entry.refs):
                leaf = ref()
                if leaf is None:
                    continue
                try:
                    if leaf.is_deleted():
                        continue  # donated or deleted: its memory is gone
                    n = sizes[i]
                    if n is None:
                        n = sizes[i] = int(leaf.nbytes)
                except Exception:
                    continue
                nbytes += n
                alive += 1
            if entry.ids:
                if live_ids is None:
                    live_ids = _live_arrays_by_id()
                for ident, shape, dtype, n in entry.ids:
                    arr = live_ids.get(ident)
                    # id() can be reused: the array found must also look the same.
                    if arr is not None and tuple(arr.shape) == shape and str(arr.dtype) == dtype:
                        nbytes += n
                        alive += 1
            rec = {
                "name": entry.name,
                "bytes": nbytes,
                "arrays": len(entry.refs) + len(entry.ids),
                "alive": alive,
                "leaves": entry.leaves,
                "labelled_t": entry.labelled_t,
            }
            if entry.root is not None:
                rec["followed"] = True  # its leaves are listed again as it changes
            out.append(rec)
        out.sort(key=lambda r: (-r["bytes"], r["name"]))
        return out

    # -- the probe interface (jaxtop.probes.base.Probe): sample field ``labels``
    name = "labels"
    needs_jax = False
    reason: str | None = None

    def start(self) -> None:
        """Nothing to install: :func:`label` records into the registry."""

    def on_tick(self, tick: Any) -> dict[str, Any] | None:
        return self.sample()

    def stop(self) -> None:
        """Stops recording for the agent and forgets every label."""
        uninstall()

    def sample(self) -> dict[str, Any] | None:
        """The ``labels`` sample field: a record when a label's bytes changed
        (at most every ``min_interval_s``) or every ``heartbeat_s``."""
        now = time.monotonic()
        if now - self._last_read_t < self.min_interval_s:
            return None
        self._last_read_t = now
        trees = self.read()
        if not trees and self._sent is None:
            return None  # nothing labelled yet: no field at all
        # Labelling the same sizes again each step is no news: bytes and counts are.
        state = tuple((r["name"], r["bytes"], r["alive"], r["arrays"]) for r in trees)
        if state == self._sent and now - self._sent_t < self.heartbeat_s:
            return None
        self._sent, self._sent_t = state, now
        record: dict[str, Any] = {"t": time.time(), "trees": trees}
        if self.dropped_names:
            record["dropped_names"] = self.dropped_names
        return record


def _fill(entry: _Tree, jax: Any, tree: Any) -> None:
    """Weak references (or ids) to ``tree``'s array leaves, into ``entry``."""
    impl = _array_impl()
    refs = entry.refs
    for leaf in jax.tree_util.tree_leaves(tree):
        entry.leaves += 1
        if impl is not None and type(leaf) is not impl:
            continue  # tracers, numpy arrays, Python scalars: no device array
        try:
            refs.append(_weak(leaf))
        except TypeError:
            try:
                entry.ids.append((id(leaf), tuple(leaf.shape), str(leaf.dtype), int(leaf.nbytes)))
            except Exception:
                pass
    entry.sizes = [None] * len(refs)


def _array_impl() -> Any:
    try:
        from jax._src.array import ArrayImpl

        return ArrayImpl
    except Exception:
        return None


def _live_arrays_by_id() -> dict[int, Any]:
    try:
        import jax

        return {id(a): a for a in jax.live_arrays()}
    except Exception:
        return {}


# The registry an agent reads, and that agent (weakly: labels never keep it alive).
_registry = LabelRegistry()
_agent_ref: Callable[[], Any] | None = None


def label(name: str, tree: T) -> T:
    """Names a pytree of device arrays for the dashboard; returns ``tree``.

    Records, without keeping anything alive, the bytes of the tree's array
    leaves under ``name``; calling it again with the same name replaces the
    tree. Does nothing (and costs a function call) when no agent reads labels.

    Args:
        name: what the dashboard calls the tree ("params", "opt_state").
        tree: any pytree; its ``jax.Array`` leaves are counted.

    Returns:
        ``tree`` itself, so that ``params = jaxtop.label("params", init())`` reads well.
    """
    ref = _agent_ref
    if ref is None:
        return tree
    agent = ref()
    if agent is None or not getattr(agent, "running", False):
        return tree
    try:
        _registry.add(name, tree)
    except Exception:
        pass  # a label must never break the program
    return tree


def attach(agent: Any) -> LabelRegistry:
    """Lets ``label`` record for ``agent``, which reads the registry as one
    of its probes (sample field ``labels``; the registry's ``stop`` undoes this).

    Args:
        agent: an object with a ``running`` attribute (jaxtop's Agent).

    Returns:
        The process's registry.
    """
    global _agent_ref
    _agent_ref = weakref.ref(agent)
    return _registry


def install(agent: Any) -> LabelRegistry:
    """:func:`attach`, and list the registry among the agent's probes."""
    registry = attach(agent)
    agent.add_probe(registry)
    return registry


def uninstall() -> None:
    """Stops recording and forgets every label."""
    global _agent_ref
    _agent_ref = None
    _registry.clear()


def read() -> list[dict[str, Any]]:
    """The named trees now (see :meth:`LabelRegistry.read`)."""
    return _registry.read()
