"""Which frame of a stack is the user's: one rule for every probe.

A stack reaches the user's code through library code: jax's dispatch
frames, numpy, an installed package, the standard library. Every probe that
names a line of the program (allocation sites, host reads, compile call
sites, the OOM census) picks it here, so that they all name the same line
for the same stack:

* :class:`LibraryFilter` says whether a file is library code (jax, jaxlib,
  numpy, jaxtop and ml_dtypes wherever installed, the standard library,
  anything under ``site-packages`` / ``dist-packages``, frozen modules) and
  whether it is one of the **core** libraries (the first group only).
* :func:`pick_site` picks from a sequence of ``(function, file, line)``
  frames, innermost first (a pprof profile's stacks, a jaxlib traceback):
  the innermost frame of the user's code, else the innermost outside the
  core libraries, else the innermost; :func:`pick_index` says where it is.
* :func:`walk` does the same on a live Python frame without building the
  sequence (it stops at the user's frame);
  :func:`python_frames` turns a live frame or a traceback into the sequence.
* :func:`user_frame` (a sequence, read lazily) and :func:`user_frame_of` (a
  live frame or a traceback) return the user's frame only, or None.

Sites are ``(file, line, function)`` (:data:`SiteKey`); a comprehension of
the user's is named after the function it is written in
(``make_batch.<listcomp>``, Python < 3.12).

Stdlib only: this runs inside the user's job.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
from typing import Any, Iterable, Mapping, Sequence
from jaxtop.probes.forksafe import ForkLock

__all__ = [
    "COMPREHENSIONS",
    "Frame",
    "LIBRARY",
    "LibraryFilter",
    "MAX_DEPTH",
    "NO_STACK",
    "SiteKey",
    "pick_index",
    "pick_site",
    "python_frames",
    "site_text",
    "user_frame",
    "user_frame_of",
    "walk",
    "without_hooks",
    "HOOK_CODES",
]

#: (file, line, function): an allocation site or a call site.
SiteKey = tuple[str, int, str]
#: (function, file, line): one frame of a stack, as a profile lists it.
Frame = tuple[str, str, int]

NO_STACK: SiteKey = ("", 0, "<no stack>")
#: Code objects of comprehensions (Python < 3.12): named after their enclosing function.
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})
#: Frames a walk over live Python frames looks at, innermost first.
MAX_DEPTH = 64
#: File names whose answers are cached (then all forgotten at once).
MAX_FILES_CACHED = 20_000


class LibraryFilter:
    """Tells the user's code from library code by a frame's file name.

    Library code is jax, jaxlib, numpy and jaxtop (wherever installed), the
    standard library, and anything under ``site-packages`` / ``dist-packages``
    or frozen. Answers are cached per file name: a profile or a stack walk
    asks about the same few dozen files again and again.
    """

    _CORE = ("jax", "jaxlib", "numpy", "jaxtop", "ml_dtypes")

    def __init__(self) -> None:
        self._cache: dict[str, bool] = {}
        self._core_cache: dict[str, bool] = {}
        self._core_kept: tuple[int, tuple[str, ...]] | None = None  # (core modules imported, their prefixes)
        self._stdlib_kept: tuple[str, ...] | None = None
        self._lock = ForkLock()

    def _core_prefixes(self) -> tuple[str, ...]:
        # Worked out again only when another core library was imported since
        # (jax may be imported after the first question); generated code
        # asks about a new file name at every call. This module lives in
        # jaxtop.probes, which a development tree keeps outside the jaxtop
        # package directory.
        modules = sys.modules
        present = sum(1 for name in self._CORE if name in modules)
        kept = self._core_kept
        if kept is not None and kept[0] == present:
            return kept[1]
        prefixes = {os.path.dirname(os.path.abspath(__file__)) + os.sep}
        for name in self._CORE:
            module = modules.get(name)
            path = getattr(module, "__file__", None) if module is not None else None
            if path:
                prefixes.add(os.path.dirname(os.path.abspath(path)) + os.sep)
        self._core_kept = (present, tuple(prefixes))
        return self._core_kept[1]

    def _stdlib_prefixes(self) -> tuple[str, ...]:
        if self._stdlib_kept is None:
            self._stdlib_kept = self._find_stdlib_prefixes()
        return self._stdlib_kept

    @staticmethod
    def _find_stdlib_prefixes() -> tuple[str, ...]:
        out = set()
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib"):
            p = paths.get(key)
            if p:
                out.add(os.path.join(p, ""))
                out.add(os.path.join(os.path.realpath(p), ""))
        return tuple(out)

    def is_core(self, filename: str) -> bool:
        """True for jax, jaxlib, numpy, ml_dtypes and jaxtop's own files."""
        hit = self._core_cache.get(filename)
        if hit is None:
            hit = filename.startswith(self._core_prefixes()) or self._installed_core(filename)
            with self._lock:
                if len(self._core_cache) >= MAX_FILES_CACHED:
                    self._core_cache.clear()  # bounded, as the library cache below
                self._core_cache[filename] = hit
        return hit

    def _installed_core(self, filename: str) -> bool:
        """A file of a core library in some installation (a profile may name
        paths of an environment other than this one's)."""
        parts = filename.replace("\\", "/").split("/")
        for marker in ("site-packages", "dist-packages"):
            if marker in parts:
                i = parts.index(marker)
                return i + 1 < len(parts) and parts[i + 1] in self._CORE
        return False

    def is_library(self, filename: str) -> bool:
        """True unless ``filename`` is the user's own code."""
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._classify(filename)
            with self._lock:
                if len(self._cache) >= MAX_FILES_CACHED:
                    self._cache.clear()  # bounded: exec'd code can make endless names
                self._cache[filename] = hit
        return hit

    def is_installed(self, filename: str) -> bool:
        """Library code other than the core libraries and the standard
        library: an installed package (flax, optax) that made a buffer on
        the user's behalf."""
        return (self.is_library(filename) and not self.is_core(filename) and not filename.startswith("<")
                and not filename.startswith(self._stdlib_prefixes()))

    def _classify(self, filename: str) -> bool:
        if not filename:
            return True
        if filename.startswith("<"):
            return not made_at_run_time(filename)
        if filename.startswith(_demo_dirs()):
            # jaxtop's demo plays the user's program. Installed, it sits in
            # site-packages under jaxtop (core code): its lines would go to
            # no user frame (the advice named `<string>:1`).
            return False
        parts = filename.replace("\\", "/").split("/")
        if "site-packages" in parts or "dist-packages" in parts:
            return True  # before the stdlib test: a system Python keeps them below it
        if self.is_core(filename):
            return True
        return filename.startswith(self._stdlib_prefixes())


@functools.lru_cache(maxsize=1)
def _demo_dirs() -> tuple[str, ...]:
    """Where jaxtop's demo package is (without importing it: it brings Textual)."""
    try:
        spec = importlib.util.find_spec("jaxtop.demo")
    except (ImportError, ValueError):
        return ()
    dirs = spec.submodule_search_locations if spec is not None else None
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs or ())


def made_at_run_time(filename: str) -> bool:
    """A code file name of code made while the program ran: ``<string>``,
    ``<stdin>``, a notebook's ``<ipython-input-…>``, code ``exec``'d under a
    name of its own. The user's, unlike Python's own ``<frozen …>`` and
    ``<built-in>``."""
    return filename.startswith("<") and not filename.startswith(("<frozen", "<built-in"))


#: The filter every probe of this process shares (its cache is the point).
LIBRARY = LibraryFilter()


def pick_index(frames: Sequence[Frame], filt: LibraryFilter = LIBRARY) -> tuple[int, bool]:
    """Where the site of one stack is.

    Args:
        frames: ``(function, file, line)``, innermost first.
        filt: what counts as library code.

    Returns:
        ``(index, library)``: the innermost frame of the user's code and
        False; else (everything is library code: jax's own constants, a
        library's buffers) the innermost frame outside the core libraries
        and True, else 0 and True; ``(-1, True)`` for an empty stack.
    """
    for i, frame in enumerate(frames):
        if not filt.is_library(frame[1]):
            return i, False
    for i, frame in enumerate(frames):
        if not filt.is_core(frame[1]):
            return i, True
    return (0 if frames else -1), True


def pick_site(frames: Iterable[Frame], filt: LibraryFilter = LIBRARY) -> tuple[SiteKey, bool]:
    """The site of one stack (:func:`pick_index`) as ``(file, line, function)``.

    Args:
        frames: ``(function, filename, line)``, innermost first.
        filt: what counts as library code.

    Returns:
        ``(site, library)``: library is False when the site is the user's
        code. A comprehension of the user's is named after the function it
        is written in (``make_batch.<listcomp>``); :data:`NO_STACK` for an
        empty stack.
    """
    # pick_index's rule, written out rather than called: a profile's fold
    # runs this once per distinct stack, thousands of times per profile.
    frames = list(frames)
    for i, (name, filename, line) in enumerate(frames):
        if not filt.is_library(filename):
            if name in COMPREHENSIONS and i + 1 < len(frames) and frames[i + 1][1] == filename:
                name = f"{frames[i + 1][0]}.{name}"  # "make_tables.<listcomp>" says more than "<listcomp>"
            return (filename, line, name), False
    for name, filename, line in frames:
        if not filt.is_core(filename):
            return (filename, line, name), True
    if frames:
        name, filename, line = frames[0]
        return (filename, line, name), True
    return NO_STACK, True


def user_frame(frames: Iterable[Frame], filt: LibraryFilter = LIBRARY) -> SiteKey | None:
    """The innermost frame of the user's code, as ``(file, line, function)``
    (named as :func:`pick_site` names it); None when every frame is library
    code. Stops at that frame: ``frames`` may be a generator.
    """
    it = iter(frames)
    for name, filename, line in it:
        if not filt.is_library(filename):
            if name in COMPREHENSIONS:
                outer = next(it, None)
                if outer is not None and outer[1] == filename:
                    name = f"{outer[0]}.{name}"
            return filename, line, name
    return None


def python_frames(obj: Any, limit: int = MAX_DEPTH) -> list[Frame]:
    """The frames of a live Python frame (it and its callers) or of a
    traceback, innermost first, at most ``limit`` of them (the innermost).

    Args:
        obj: a frame object (``sys._getframe()``, ``tb.tb_frame``) or a
            traceback object (``exc.__traceback__``), or None.
        limit: frames kept.
    """
    out: list[Frame] = []
    if obj is None:
        return out
    if hasattr(obj, "tb_frame"):
        # A traceback runs from the frame that caught the exception inwards
        # to the one that raised it: the innermost are its last entries.
        tb = obj
        while tb is not None:
            code = tb.tb_frame.f_code
            out.append((code.co_name, code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        out.reverse()
        return out[:max(0, limit)]
    frame = obj
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_name, code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return out


def user_frame_of(obj: Any, filt: LibraryFilter = LIBRARY, limit: int = MAX_DEPTH) -> SiteKey | None:
    """The innermost frame of the user's code in a live frame's stack or a
    traceback (:func:`python_frames`), as ``(file, line, function)``, or None."""
    if obj is not None and not hasattr(obj, "tb_frame"):
        site, library, _ = walk(obj, filt, limit)
        return None if library else site
    return user_frame(python_frames(obj, limit), filt)


def walk(frame: Any, filt: LibraryFilter = LIBRARY, limit: int = MAX_DEPTH,
         names: Mapping[str, Any] | None = None, label: Any = None) -> tuple[SiteKey, bool, Any]:
    """:func:`pick_site` of a live frame and its callers, without building
    the stack: the walk stops at the user's frame.

    Args:
        frame: the innermost frame (``sys._getframe(1)``).
        filt: what counts as library code.
        limit: frames looked at, innermost first.
        names: function names to look for in the library frames below the
            site (e.g. which jax entry point a read went through).
        label: the answer when no such name is found.

    Returns:
        ``(site, library, label)``: the site and library flag as
        :func:`pick_site` gives them for the same ``limit`` frames; ``label``
        is ``names[function]`` of the outermost library frame walked whose
        function is in ``names``, else the ``label`` given.
    """
    innermost = frame
    fallback: SiteKey | None = None
    depth = 0
    while frame is not None and depth < limit:
        code = frame.f_code
        filename = code.co_filename
        if not filt.is_library(filename):
            name = code.co_name
            outer = frame.f_back
            if (name in COMPREHENSIONS and outer is not None and depth + 1 < limit
                    and outer.f_code.co_filename == filename):
                name = f"{outer.f_code.co_name}.{name}"
            return (filename, frame.f_lineno, name), False, label
        if names is not None:
            label = names.get(code.co_name, label)
        if fallback is None and not filt.is_core(filename):
            fallback = (filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
        depth += 1
    if fallback is not None:
        return fallback, True, label
    if innermost is not None and limit > 0:
        code = innermost.f_code
        return (code.co_filename, innermost.f_lineno, code.co_name), True, label
    return NO_STACK, True, label


def site_text(key: SiteKey) -> str:
    """``train.py:120`` for a site (the function is given separately)."""
    filename, line, name = key
    if not filename:
        return name
    return f"{os.path.basename(filename)}:{line}"


#: Code objects of the hooks jaxtop puts between the program and jax on the
#: program's own thread (the host-read counter inside ``jax.Array._value``,
#: the guard around ``delete``): an error jax raises through one of them
#: passes its frame. :func:`without_hooks` takes those frames out of a
#: traceback before it is printed, so it reads as it would without jaxtop.
HOOK_CODES: set[Any] = set()


def without_hooks(tb: Any) -> Any:
    """``tb`` without the entries of jaxtop's hook frames (:data:`HOOK_CODES`):
    a new chain where there were any, else ``tb`` itself."""
    import types

    entries = []
    node = tb
    while node is not None:
        entries.append(node)
        node = node.tb_next
    if not any(e.tb_frame.f_code in HOOK_CODES for e in entries):
        return tb
    rebuilt = None
    for e in reversed(entries):
        if e.tb_frame.f_code not in HOOK_CODES:
            rebuilt = types.TracebackType(rebuilt, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return rebuilt


_JAX_SRC = os.sep + "jax" + os.sep + "_src" + os.sep


def _jax_file(filename: str) -> bool:
    """A file of jax itself: under ``jax/_src`` (recorded paths of any
    installation) or this process's jax package directory."""
    if _JAX_SRC in filename:
        return True
    module = sys.modules.get("jax")
    path = getattr(module, "__file__", None) if module is not None else None
    return bool(path) and filename.startswith(os.path.dirname(os.path.abspath(path)) + os.sep)


def _jitted_source(frame: Any) -> str | None:
    """The file that defines the function jax's ``cache_miss`` (``frame``)
    traces and compiles, or None where it cannot be read.

    ``cache_miss`` holds the jit's ``jit_info`` as a closure variable in every
    jax since 0.4.30, and its ``fun_sourceinfo`` (``"sin at /…/ufuncs.py:584"``)
    is jax's own account of the function, through ``functools.partial`` and
    ``__wrapped__`` (so ``jax.jit(jax.grad(loss))`` names ``loss``'s file).
    Where that is missing, the function itself (``fun``, a closure variable
    from jax 0.4.31, ``jit_info.fun`` in 0.4.30) is unwrapped the same way.
    """
    try:
        local = frame.f_locals  # a compile costs milliseconds; this, microseconds
    except Exception:
        return None
    info = local.get("jit_info")
    source = getattr(info, "fun_sourceinfo", None)
    if isinstance(source, str):
        # "name at file:line"; the name has no spaces (jax's contract).
        _, sep, where = source.partition(" at ")
        if sep:
            return where.rpartition(":")[0] or where
    fun = local.get("fun", getattr(info, "fun", None))
    for _ in range(32):
        inner = fun.func if isinstance(fun, functools.partial) else getattr(fun, "__wrapped__", None)
        if inner is None:
            break
        fun = inner
    code = getattr(fun, "__code__", None)
    return getattr(code, "co_filename", None)


def _eager(frames: Iterable[tuple[str, str, Any]]) -> bool:
    # ``frames``: (function, file, live frame or None), innermost first.
    # Recorded tracebacks name functions by qualified name (``_cpp_pjit.<locals>.cache_miss``).
    it = ((name.rpartition(".")[2], filename, live) for name, filename, live in frames)
    for name, filename, live in it:
        if name == "apply_primitive" and filename.endswith("dispatch.py"):
            return True  # a primitive run outside jit
        if name == "cache_miss" and filename.endswith("pjit.py"):
            # A jitted function's first call for these arguments. Which
            # function? One of jax's own (jnp.sin, jnp.linalg.norm and
            # jax.nn.relu are jax.jit-wrapped, and a program calls them
            # directly): an op run outside jit, like any other.
            if live is not None:
                source = _jitted_source(live)
                if source is not None and _jax_file(source):
                    return True
            # Else who called it? jax's own code (jnp.multiply for x * 2,
            # jax.random's helpers) or the program (or a library's wrapper,
            # such as flax's nnx.jit).
            for name, filename, _ in it:
                if not filename.endswith("traceback_util.py"):
                    return _JAX_SRC in filename
            return False
    return False


def eager_dispatch(frame: Any, limit: int = 80) -> bool:
    """True when a compile seen from ``frame`` is of one of jax's own
    functions run outside any of the program's jits:

    * a primitive (``apply_primitive`` in ``jax/_src/dispatch.py`` on the
      stack, jax < 0.4.36 or so);
    * a jitted function defined in jax, whoever called it: ``jnp.sin``,
      ``jnp.linalg.norm``, ``jax.nn.relu`` are ``jax.jit``-wrapped (some
      ``inline=True``) and called by the program itself, and jax 0.10's
      primitives are jitted ``prim_fun`` s of ``dispatch.py``;
    * any jitted function called by jax itself (``jnp.multiply`` for
      ``x * 2``, ``jnp.mean``'s ``_mean``, ``jax.random``'s samplers): the
      caller of the jitted function (the frame outside jax's ``pjit.py``
      ``cache_miss``) lies in ``jax/_src``.

    Such ops compile once per primitive, shape and dtype (a model's eager
    set-up: dozens in its first seconds); none is a recompile of the
    program's functions. A program's ``jax.jit(jnp.sin)`` reads as the op it
    wraps (it compiles exactly as the op does). At most ``limit`` frames are
    read.
    """
    def frames():
        f, n = frame, 0
        while f is not None and n < limit:
            yield f.f_code.co_name, f.f_code.co_filename, f
            f = f.f_back
            n += 1
    return _eager(frames())


def jitted_name(frame: Any, limit: int = 80) -> str | None:
    """The name of the function jax's innermost ``cache_miss`` on the stack
    of ``frame`` compiles (``sin`` for ``jnp.sin``), from jax's own account
    of it (``jit_info.fun_sourceinfo``); None when there is none. jax before
    0.6.2 names no function in its compile events: this does, for jax's ops."""
    f, n = frame, 0
    while f is not None and n < limit:
        code = f.f_code
        if code.co_name == "cache_miss" and code.co_filename.endswith("pjit.py"):
            try:
                source = getattr(f.f_locals.get("jit_info"), "fun_sourceinfo", None)
            except Exception:
                return None
            name, sep, _ = source.partition(" at ") if isinstance(source, str) else ("", "", "")
            return name if sep and name else None
        f = f.f_back
        n += 1
    return None


def eager_frames(frames: Iterable[Frame]) -> bool:
    """:func:`eager_dispatch` for a recorded stack (``(function, file, line)``,
    innermost first). A recorded stack holds no function objects: a jitted op
    of jax that the program called itself (``jnp.sin(x)``) is told apart
    only by a live stack (the jit ledger marks its executables by their
    function's compile events)."""
    return _eager((name, filename, None) for name, filename, _ in frames)
