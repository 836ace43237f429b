"""What an implicit transfer copied: a call's host values, by name, kind, shape and size.

A jitted call copies to the device every argument that is not already a
device array: NumPy arrays and scalars, Python scalars, and those inside
lists, tuples and dicts. :func:`describe_value` names each such value as the
call's parameter (``batch['x']``, ``lr``); on jax's slow path the values met
are jax's own typed literals (:func:`literal_kind`). Sizes are what jax
copies: 64-bit values as 32-bit ones unless ``jax_enable_x64`` is on.

Standard library only (numpy and jax are passed in or looked up once imported).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ArgInfo", "MAX_ARGS", "NUMPY", "NUMPY_SCALAR", "OTHER_DEVICE", "PY_SCALAR", "describe_value",
           "literal_kind", "token_of"]

#: Arguments described per call at most.
MAX_ARGS = 32

#: The kinds of a transferred value, as a user names them.
NUMPY, PY_SCALAR, NUMPY_SCALAR, OTHER_DEVICE = "NumPy array", "Python scalar", "NumPy scalar", "another device's array"
_PY_SCALARS = (bool, int, float, complex)


@dataclass(frozen=True)
class ArgInfo:
    """One transferred value of a call: its name in the call, kind, shape, dtype and size.

    ``token`` tells this value from another of the same name at the next
    call read (:func:`token_of`); ``same``: whether it was the same value as
    at the call read before (None: unknown). Neither takes part in equality:
    two reads of one argument are one argument."""

    name: str
    kind: str
    shape: str
    nbytes: int | None
    token: Any = field(default=None, compare=False)
    same: bool | None = field(default=None, compare=False)

    def wire(self) -> dict[str, Any]:
        out = {"name": cut(self.name), "kind": cut(self.kind), "shape": cut(self.shape), "bytes": self.nbytes}
        if self.same is not None:
            out["same"] = self.same
        return out


#: The longest name the wire carries of the program's (a function, a file,
#: an argument): generated code can name things with megabytes, and a
#: recording would grow by that much at every sample that carries them.
MAX_WIRE_NAME = 256


def cut(text: str, limit: int = MAX_WIRE_NAME) -> str:
    """``text`` within ``limit`` characters, an ellipsis where cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe_value(name: str, value: Any, np: Any, array_type: Any, out: list[ArgInfo], prefix: str = "") -> None:
    """Append what of ``value`` a call would copy to the device (its host
    leaves: NumPy arrays and scalars, Python scalars, in lists, tuples and
    dicts), under ``name``; jax Arrays (already on a device) are skipped."""
    if len(out) >= MAX_ARGS:
        return
    # By the value's type: isinstance would read a __class__ of the program's.
    cls = type(value)
    if array_type is not None and issubclass(cls, array_type):
        return
    kind = None
    if type(value) in _PY_SCALARS:
        dtype = {bool: "bool", int: "int", float: "float", complex: "complex"}[type(value)]
        # What jax makes of it: a weakly typed 32-bit value (64-bit with jax_enable_x64).
        size = 1 if dtype == "bool" else (8 if _x64() else 4) * (2 if dtype == "complex" else 1)
        out.append(ArgInfo(name, prefix + PY_SCALAR, f"{dtype}[]", size, ("v", type(value), value)))
        return
    if np is not None:
        if issubclass(cls, np.ndarray):
            kind = NUMPY
        elif issubclass(cls, np.generic):
            kind = NUMPY_SCALAR
    if kind is not None:
        shape = ",".join(str(d) for d in value.shape)
        nbytes = int(value.nbytes)
        if value.dtype.itemsize == 8 and value.dtype.kind in "fiuc" and not _x64():
            nbytes //= 2  # jax copies 64-bit values as 32-bit ones unless jax_enable_x64 is on
        out.append(ArgInfo(name, prefix + kind, f"{value.dtype}[{shape}]", nbytes, token_of(value, np)))
        return
    # The containers' own C iteration, never a subclass's __iter__ or items():
    # none of the program's code runs for a description.
    if issubclass(cls, list):
        for i, item in enumerate(list.__iter__(value)):
            describe_value(f"{name}[{i}]", item, np, array_type, out, "list of ")
        return
    if issubclass(cls, tuple):
        for i, item in enumerate(tuple.__iter__(value)):
            describe_value(f"{name}[{i}]", item, np, array_type, out, prefix)
        return
    if issubclass(cls, dict):
        for key, item in dict.items(value):
            describe_value(f"{name}[{key_text(key)}]", item, np, array_type, out, prefix)


#: Elements of a NumPy array read for its token (a strided sample beyond).
TOKEN_ELEMENTS = 4096


def token_of(value: Any, np: Any) -> Any:
    """What tells a NumPy value from another: for an array, the object
    (its id) and a hash of up to :data:`TOKEN_ELEMENTS` of its elements,
    evenly spread (an array the program refills in place is the same object
    with other contents); None where reading it could run the program's
    code (a subclass) or means nothing (object arrays). Read on the
    program's thread, for the few calls whose arguments are described."""
    try:
        if type(value) is np.ndarray:
            if value.dtype.hasobject:
                return None
            size = value.size
            if size > TOKEN_ELEMENTS:
                picked = value.flat[np.linspace(0, size - 1, TOKEN_ELEMENTS).astype(np.intp)]
            else:
                picked = value
            return ("a", id(value), value.dtype.str, value.shape, hash(picked.tobytes()))
        if isinstance(value, np.generic) and type(value).__module__ == "numpy":
            return ("s", value.dtype.str, value.tobytes())
    except Exception:
        return None
    return None


#: Keys whose repr is Python's own (a subclass's may be the program's code).
_PLAIN_KEYS = (str, int, float, bool, bytes, type(None))


def key_text(key: Any) -> str:
    """A dict key as written in the program (``'x'``, ``3``); a key of any
    other type by its type's name alone: its ``__repr__`` is the program's
    code, which the description must not run."""
    if type(key) in _PLAIN_KEYS:
        text = repr(key)
        return text if len(text) <= 40 else text[:39] + "…"
    return f"<{type(key).__name__}>"


def _x64() -> bool:
    """Whether jax keeps 64-bit values (``jax_enable_x64``)."""
    jax = sys.modules.get("jax")
    try:
        return bool(jax.config.jax_enable_x64) if jax is not None else False
    except Exception:
        return False


def literal_kind(x: Any) -> tuple[str, str, int | None]:
    """Kind, shape and bytes of a value met on the slow path. jax wraps a
    Python scalar it canonicalised as a typed literal (``TypedFloat``, or a
    ``TypedNdArray`` of a weak type)."""
    tname = type(x).__name__
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if shape is None and dtype is not None:
        shape = ()  # a typed scalar
    text = f"{dtype}[{','.join(str(d) for d in shape)}]" if dtype is not None and shape is not None else tname
    nbytes = getattr(x, "nbytes", None)
    if not isinstance(nbytes, int) and shape == () and isinstance(getattr(dtype, "itemsize", None), int):
        nbytes = dtype.itemsize
    nbytes = int(nbytes) if isinstance(nbytes, int) else None
    if type(x) in _PY_SCALARS or tname.startswith("Typed") and tname != "TypedNdArray":
        return PY_SCALAR, text, nbytes
    if tname == "TypedNdArray":
        weak = getattr(getattr(x, "aval", None), "weak_type", False)
        return (PY_SCALAR if weak else NUMPY), text, nbytes
    if tname == "ArrayImpl":
        return OTHER_DEVICE, text, nbytes
    if "ndarray" in tname:
        return NUMPY, text, nbytes
    return (NUMPY_SCALAR if hasattr(x, "dtype") else tname), text, nbytes
