"""What a jitted callable runs, by name, and what its parameters are
called, read without running any code of the program's.

jax's post-call hook hands the transfer-sites probe the jitted callable
of each call: a ``PjitFunction`` whose own ``__dict__`` names what it wraps
(``_fun``, ``__wrapped__``), maybe through more wrappers (jax's API
boundary, ``functools.wraps``, Flax NNX's ``JitFn``), or pmap's inner
closure (jax 0.7 on). The names are read from instance dictionaries,
function slots, code objects and jax's own records, never through a
property, ``__getattr__``, ``__eq__``, ``__signature__`` or ``__repr__``
of the program's: this runs on jaxtop's thread.

Standard library only (this runs inside the user's job).
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["MAX_UNWRAP", "callee_of", "params_of"]


def _own_attr(obj: Any, name: str) -> Any:
    """``obj``'s attribute from its instance ``__dict__`` or a function's
    slots, never through a property or ``__getattr__`` of the program's:
    None where it is not there so."""
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)) and name in ("__name__", "__module__"):
        return getattr(obj, name, None)
    try:
        namespace = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    if type(namespace) is not dict:
        return None
    return dict.get(namespace, name)


#: Wrappers followed from a jitted callable to the function it runs.
MAX_UNWRAP = 8


def _unwrapped(fun: Any) -> Any:
    """The innermost callable ``fun`` wraps, through the attributes that
    name it in the wrappers' own ``__dict__``: jax's ``_fun``, and
    ``__wrapped__`` (``functools.wraps``, jax's API boundary, Flax NNX's
    ``JitFn``, which ``nnx.jit`` hands jax in place of the user's step:
    one level down its parameters read ``*args`` and the step's arguments
    were named ``arg0``, ``arg1``...); None where ``fun`` wraps nothing."""
    inner = None
    obj = fun
    for _ in range(MAX_UNWRAP):
        nxt = _own_attr(obj, "_fun")
        if nxt is None or nxt is obj:
            nxt = _own_attr(obj, "__wrapped__")
        if nxt is None or nxt is obj:
            break
        inner = obj = nxt
    return inner


def _pmapped(function: types.FunctionType) -> tuple[str, bool, tuple[str, ...]] | None:
    """``jax.pmap(f)``'s name and the names of the arguments its calls get,
    or None where ``function`` is not pmap's inner function.

    jax (0.7 on) runs a pmap as a jit of ``shard_map`` around a closure
    ``_fun(*flat_args)`` of ``jax/_src/pmap.py``: the hook sees that
    closure, called with the pytree leaves of the user's arguments. Its
    cells hold jax's ``WrappedFun`` of the user's function (its debug info
    names it and its parameters) and ``in_tree``, the treedef of ``(args,
    kwargs)`` (C++, reading it runs no code of the program): each leaf is
    named after its argument (``params[leaf 3]``, ``batch['image']``).
    Without this a pmapped step read ``_fun (op)`` with ``arg4``, ``arg5``
    (jax's spmd MNIST example)."""
    code = function.__code__
    if function.__name__ != "_fun" or not code.co_filename.endswith(("jax/_src/pmap.py", "jax\\_src\\pmap.py")):
        return None
    try:
        cells = dict(zip(code.co_freevars, function.__closure__ or ()))
        wrapped = cells["fun"].cell_contents
        in_tree = cells["in_tree"].cell_contents
        if type(wrapped).__module__ != "jax._src.linear_util" or type(in_tree).__name__ != "PyTreeDef":
            return None
        debug = wrapped.debug_info
        name = debug.func_name
        names = tuple(debug.arg_names or ())
        args_tree = in_tree.children()[0]
        flat: list[str] = []
        for i, sub in enumerate(args_tree.children()):
            arg = names[i] if i < len(names) and isinstance(names[i], str) else f"arg{i}"
            leaves = sub.num_leaves
            if leaves == 1 and sub.num_nodes == 1:
                flat.append(arg)
                continue
            keys = _dict_keys(sub)
            flat += ([f"{arg}[{k!r}]" for k in keys] if keys is not None and len(keys) == leaves
                     else [f"{arg}[leaf {k}]" for k in range(leaves)])
        if not isinstance(name, str):
            return None
        return (name, False, tuple(flat))
    except Exception:
        return None


def _dict_keys(tree: Any) -> list[Any] | None:
    """The keys of a treedef that is a dict of leaves (str or int keys),
    else None."""
    data = tree.node_data()
    if data is None or data[0] is not dict:
        return None
    keys = list(data[1])
    children = tree.children()
    if len(keys) != len(children) or any(c.num_nodes != 1 for c in children):
        return None
    return keys if all(type(k) in (str, int) for k in keys) else None


def _plain_function(obj: Any) -> types.FunctionType | None:
    """The Python function ``obj`` is (or a bound method's), else None."""
    if type(obj) is types.FunctionType:
        return obj
    if type(obj) is types.MethodType and type(obj.__func__) is types.FunctionType:
        return obj.__func__
    return None


def params_of(fun: Any) -> tuple[str, ...]:
    """The parameter names of a plain function (a bound method's without its
    first), read from its code object; () for anything else (a callable
    object, a partial): arguments are then named by position. Unlike
    ``inspect.signature``, runs none of the program's code."""
    function = _plain_function(fun)
    if function is None:
        return ()
    code = function.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return tuple(names[1:]) if type(fun) is types.MethodType else tuple(names)


def callee_of(fun: Any) -> tuple[str, bool, tuple[str, ...]]:
    """(name, is it one of jax's own ops, parameter names) of a jitted
    callable, read without running any of the program's code."""
    # Read on the agent's thread: nothing here may run the program's
    # code (a property, __getattr__, __eq__, __signature__, __repr__):
    # the jitted wrapper's own attributes, then the wrapped function's
    # code object where it is a plain function or method.
    inner = _unwrapped(fun)
    function = _plain_function(inner) if inner is not None else _plain_function(fun)
    mapped = _pmapped(function) if function is not None else None
    if mapped is not None:
        return mapped
    if function is not None:
        name = function.__name__
        module = function.__module__ if isinstance(function.__module__, str) else ""
    else:
        named = _own_attr(fun, "__name__")
        name = named if isinstance(named, str) else type(inner if inner is not None else fun).__name__
        module = ""
    op = module.startswith("jax.") or (function is not None and _own_attr(function, "_apply_primitive") is True)
    return (str(name), op, params_of(inner if inner is not None else fun))
