"""Who keeps an array alive, by the program's own names.

A leak suspect is a line whose arrays keep growing; the holders profile
says where they were made, not what keeps them. Python can tell that: a
global of one of the program's modules, a local of a running function, and
the containers and attributes under them, down to the array.
:func:`holders_of` searches from those names down (a list, a dict, an
object's attributes, ...) for a few of the line's arrays, and names each
path as the program would write it: ``__main__.history[…]``,
``__main__.trainer.cache['s2']``, ``train() local outs[…]``.

Why from the names down and not from the arrays up (``gc.get_referrers``):
the collector does not track a dict or tuple that holds only untracked
values, and NumPy arrays are untracked, so a dict of arrays has no
referrers to find; and a running function's locals are no object the
collector sees (Python 3.11 on).

What it costs: a walk of what the program's globals and its threads' locals
reach, :data:`MAX_OBJECTS` objects at most, to :data:`MAX_DEPTH` steps,
handed back to the program's threads every :data:`CHUNK` objects (each
piece holds the interpreter about a millisecond). It runs only when asked
(the ``holders_who`` command) and says how long it took.

It runs none of the program's code: it reads containers' slots, objects'
``__dict__`` and ``__slots__`` through the C descriptors only (a class's own
property of those names would run its code, and is not read), compares by
identity, and shows a dict key only where it is a ``str`` or an ``int``.
Libraries' modules and running functions (``LibraryFilter``) are no start:
what the program keeps, it keeps under its own names.

Stdlib only (the agent runs in the user's job).
"""

from __future__ import annotations

import collections
import os
import sys
import time
import types
from typing import Any, Callable

from jaxtop.probes.base import hand_back
from jaxtop.probes.holders_scan import arrays_at

__all__ = ["CHUNK", "MAX_DEPTH", "MAX_OBJECTS", "WHO_MIN_INTERVAL_S", "WHO_SITES", "WhoCommand", "holders_of"]

#: Steps from a name down to an array at most (an array in a list in a dict
#: in an attribute of an object in a global is four).
MAX_DEPTH = 6
#: Objects looked at, at most, over the whole search.
MAX_OBJECTS = 300_000
#: Objects and container items looked at between two hand-backs of the interpreter.
CHUNK = 500
#: Items of one container looked at, at most (a list of a million floats).
MAX_ITEMS = 10_000
#: Paths kept per array.
MAX_PATHS = 3
#: ``holders_who``: a search at most this often (each walks the program's objects) ...
WHO_MIN_INTERVAL_S = 2.0
#: ... for at most this many sites at once, and this many arrays of each.
WHO_SITES = 3
WHO_ARRAYS = 3

#: Containers whose items are never arrays' holders worth walking into.
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)


def _own_dirs() -> tuple[str, ...]:
    """jaxtop's own code (its frames hold the arrays it searches for, and are not the program's)."""
    import jaxtop

    return tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in (jaxtop.__file__ or "", __file__))


_OWN_DIRS = _own_dirs()


def _descriptor(obj: Any, name: str, kind: type) -> Any:
    """The C-level descriptor ``name`` of ``obj``'s type, if it is one of
    ``kind`` (a class's own property of that name would run its code)."""
    for klass in type(obj).__mro__:
        desc = vars(klass).get(name)
        if desc is not None:
            return desc if type(desc) is kind else None
    return None


def _children(obj: Any) -> list[tuple[Any, Any]]:
    """``(step, value)`` of what ``obj`` holds: ``step`` an ``int`` (an
    index), a ``("k", key)`` (a dict's key) or a ``str`` (an attribute's
    name), read as ``[3]``, ``['k']`` and ``.attr`` (:func:`_path`); [] for
    what is not walked into."""
    cls = type(obj)  # its real type: a __class__ property of the program's is its code
    # By the object's real type (isinstance would read a __class__ property of the program's).
    if cls in _ATOMS or issubclass(cls, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                                         types.CodeType, types.FrameType, types.MethodType)):
        return []
    if cls is list or cls is tuple or cls is collections.deque:
        try:
            items = list(obj)[:MAX_ITEMS]  # a snapshot: the program's threads may change it meanwhile
        except RuntimeError:
            return []
        return list(enumerate(items))
    if cls is dict:
        try:
            items = list(obj.items())[:MAX_ITEMS]
        except RuntimeError:
            return []
        return [(("k", k), v) for k, v in items]
    if cls is set or cls is frozenset:
        return [(("k", None), v) for v in list(obj)[:MAX_ITEMS]]
    out: list[tuple[Any, Any]] = []
    desc = _descriptor(obj, "__dict__", types.GetSetDescriptorType)
    if desc is not None:
        try:
            own = desc.__get__(obj, cls)
        except Exception:
            own = None
        if type(own) is dict:
            out += [(k, v) for k, v in list(own.items())[:MAX_ITEMS] if type(k) is str]
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if type(slots) not in (tuple, list, str):
            continue  # another iterable's iteration would be its code
        for name in ([slots] if type(slots) is str else slots):
            if type(name) is not str:
                continue
            member = _descriptor(obj, name, types.MemberDescriptorType)
            if member is None:
                continue
            try:
                out.append((name, member.__get__(obj, cls)))
            except (AttributeError, TypeError):
                continue
    return out


def _path(node: tuple[Any, ...]) -> str:
    """The Python expression of a search node ``(parent node, step, ...)``,
    list indices and int keys folded to ``[…]`` (a list's items are one path)."""
    parts: list[str] = []
    while node is not None:
        parent, step = node[0], node[1]
        if parent is None:
            parts.append(step)  # the root's name
        elif step.__class__ is int:
            parts.append("[…]")
        elif step.__class__ is str:
            parts.append(f".{step}")
        else:
            key = step[1]
            parts.append("{…}" if key is None else "[…]" if type(key) is int else f"[{_key_text(key)}]")
        node = parent
    return "".join(reversed(parts))


def _key_text(key: Any) -> str:
    """A dict key as the program would write it, where that runs none of its
    code (a ``str``, quoted, or an ``int``); ``…`` for any other."""
    if type(key) is str:
        return repr(key)
    if type(key) is int:
        return str(key)
    return "…"


_TYPE_DICT = vars(type)["__dict__"]  # the C-level slot of a class's namespace
_CODE_ONLY = (types.FunctionType, staticmethod, classmethod, property, types.MethodDescriptorType)


def _inner_names(path: str, value: Any, module: str) -> list[tuple[str, Any]]:
    """What a module's own class or function keeps by a name of the program:
    a class's attributes (``train.Cache.store``: a cache shared by every
    instance) and a function's closure (``train.step() closure history``:
    a list a step made by a factory appends to). Only a class or function
    the module defined (its namespace's own ``__module__``, its code's
    module globals); read through C-level slots, running no code of the
    program's (a metaclass's property, a cell's contents are plain reads)."""
    out: list[tuple[str, Any]] = []
    cls = type(value)
    if issubclass(cls, type):
        try:
            own = _TYPE_DICT.__get__(value, cls)
        except Exception:
            return out
        defined_in = own.get("__module__")
        if type(defined_in) is not str or defined_in != module:
            return out
        try:
            items = list(own.items())[:MAX_ITEMS]
        except RuntimeError:
            return out
        out += [(f"{path}.{k}", v) for k, v in items
                if type(k) is str and not k.startswith("__") and not issubclass(type(v), _CODE_ONLY)
                and type(v) not in _ATOMS]
    elif cls is types.FunctionType:
        if type(value.__module__) is not str or value.__module__ != module:
            return out
        cells = value.__closure__ or ()
        for var, cell in zip(value.__code__.co_freevars, cells):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if type(contents) not in _ATOMS and not issubclass(type(contents), _CODE_ONLY):
                out.append((f"{path}() closure {var}", contents))
    return out


def _roots(is_library: Callable[[str], bool]) -> list[tuple[str, Any]]:
    """The program's names: its modules' globals and its threads' running
    functions' locals (jaxtop's own code and libraries' left out)."""
    out: list[tuple[str, Any]] = []
    module_dict = vars(types.ModuleType)["__dict__"]  # the C-level slot: a module subclass's own property is its code
    for name, module in list(sys.modules.items()):
        if not issubclass(type(module), types.ModuleType) or type(name) is not str:
            continue
        try:
            names_of = module_dict.__get__(module, type(module))
        except Exception:
            continue
        if type(names_of) is not dict:
            continue
        file = names_of.get("__file__")  # not getattr: a module's own __getattr__ is its code
        if name != "__main__" and (type(file) is not str or is_library(file) or file.startswith(_OWN_DIRS)):
            continue
        try:
            names = list(names_of.items())
        except RuntimeError:
            continue
        for key, value in names:
            if type(key) is not str or key.startswith("__"):
                continue
            out.append((f"{name}.{key}", value))
            out += _inner_names(f"{name}.{key}", value, name)
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(_OWN_DIRS) and not is_library(code.co_filename):
                try:
                    local = list(frame.f_locals.items())
                except Exception:
                    local = []
                out += [(f"{code.co_name}() local {key}", value) for key, value in local if type(key) is str]
            frame = frame.f_back
    return out


def _hand_back(_seconds: float) -> None:
    """Between two pieces of the walk: let the interpreter go
    (:func:`jaxtop.probes.base.hand_back`; ``sleep(0)`` hands it only to a
    thread that already waited Python's 5 ms switch interval)."""
    hand_back()


def holders_of(targets: list[Any], is_library: Callable[[str], bool] | None = None,
               pause: Callable[[float], Any] = _hand_back, clock: Callable[[], float] = time.perf_counter,
               max_objects: int = MAX_OBJECTS) -> dict[str, Any]:
    """The names that keep ``targets`` alive.

    Args:
        targets: a few arrays.
        is_library: what counts as a library's file (its module's globals
            are no start); default: jaxtop's library filter.
        pause: hands the interpreter back to the program's threads.

    Returns:
        ``{"paths": {path: how many of the targets it holds}, "unnamed":
        targets no path was found to, "objects": objects looked at,
        "complete": whether the search ended within its bounds, "seconds":
        the search's time, "longest_piece_s": the longest piece of it
        without a hand-back}``. List indices and int keys are folded
        (``history[…]``): a list's items are one path.
    """
    if is_library is None:
        from jaxtop.probes.frames import LIBRARY

        is_library = LIBRARY.is_library
    wanted = {id(t): i for i, t in enumerate(targets)}
    found: dict[int, set[str]] = {}
    began = piece = clock()
    longest = 0.0
    seen: set[int] = set()
    looked = work = 0
    complete = True
    # Depth first from each name. A node: (parent node, step, value, depth);
    # a root's parent is None and its step its name.
    stack: list[tuple[Any, Any, Any, int]] = [(None, name, value, 0) for name, value in reversed(_roots(is_library))]
    work += len(stack)
    while stack:
        node = stack.pop()
        value, depth = node[2], node[3]
        hit = wanted.get(id(value))
        if hit is not None:
            paths = found.setdefault(hit, set())
            if len(paths) < MAX_PATHS:
                paths.add(_path(node))
            continue
        if depth >= MAX_DEPTH or id(value) in seen:
            continue
        seen.add(id(value))
        looked += 1
        if looked >= max_objects:
            complete = False
            break
        children = _children(value)
        work += 1 + len(children)
        for step, child in reversed(children):
            if type(child) not in _ATOMS:
                stack.append((node, step, child, depth + 1))
        if work >= CHUNK:
            work = 0
            now = clock()
            longest = max(longest, now - piece)
            pause(0)
            piece = clock()
    end = clock()
    longest = max(longest, end - piece)
    folded: dict[str, int] = {}
    for names in found.values():
        for name in names:
            folded[name] = folded.get(name, 0) + 1
    return {"paths": folded, "unnamed": len(targets) - len(found), "objects": looked, "complete": complete,
            "seconds": round(end - began, 4), "longest_piece_s": round(longest, 4)}


class WhoCommand:
    """The agent's ``holders_who`` command: the program's names that keep a
    site's arrays alive, for ``{"file", "line"}`` or, without them, the leak
    suspects (at most :data:`WHO_SITES`), :data:`WHO_ARRAYS` of each site's
    newest arrays searched for (:func:`holders_of`), at most one search per
    :data:`WHO_MIN_INTERVAL_S`.

    Args:
        arrays: the last live-array scan and the devices' labels (None before one).
        monotonic: the clock of the rate limit.
    """

    def __init__(self, arrays: Callable[[], Any], monotonic: Callable[[], float] = time.monotonic) -> None:
        self._arrays = arrays
        self._mono = monotonic
        self._last_t = -1e18

    def __call__(self, args: dict[str, Any], suspects: list[tuple[str, int]]) -> dict[str, Any]:
        """Returns ``{"who": [{"file", "line", "arrays", "paths", "unnamed",
        "objects", "complete"}], "seconds", "longest_piece_s"}``, or
        ``{"who": [], "error"}`` (nothing to search, too soon, no scan yet)."""
        now = self._mono()
        if now - self._last_t < WHO_MIN_INTERVAL_S:
            return {"who": [], "error": f"asked again within {WHO_MIN_INTERVAL_S:g} s"}
        file, line = args.get("file"), args.get("line")
        if file is not None or line is not None:
            if not isinstance(file, str) or line.__class__ is not int or not file or len(file) > 4096:
                return {"who": [], "error": "file (a string) and line (an integer) name the site"}
            sites = {(file, line)}
        else:
            sites = set(suspects[:WHO_SITES])
            if not sites:
                return {"who": [], "error": "no leak suspect to search for: name a site (file, line)"}
        source = self._arrays()
        if source is None:
            return {"who": [], "error": "no scan of the live arrays yet (or none is taken: each would pause the program "
                                       "longer than JAXTOP_MAX_PAUSE_MS allows, 1 ms by default)"}
        self._last_t = now
        began = time.perf_counter()
        found = arrays_at(source[0], sites, WHO_ARRAYS)
        out, longest = [], 0.0
        for (site_file, site_line), targets in sorted(found.items()):
            entry: dict[str, Any] = {"file": site_file, "line": site_line, "arrays": len(targets)}
            if targets:
                res = holders_of(targets)
                longest = max(longest, res["longest_piece_s"])
                entry.update(paths=res["paths"], unnamed=res["unnamed"], objects=res["objects"],
                             complete=res["complete"])
            out.append(entry)
        found.clear()
        return {"who": out, "seconds": round(time.perf_counter() - began, 4), "longest_piece_s": round(longest, 4)}
