"""Which exceptions are out-of-memory errors: jax's runtime error classes,
and the OOM found in an exception or the chain it was raised from.

Imports nothing beyond the standard library: it runs in the exception hooks
and on the agent's thread.
"""

from __future__ import annotations

import sys

from .lines import is_oom_text

__all__ = ["error_classes", "exception_text", "find_oom_exception", "jax_imported", "type_name"]


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or "" when the exception cannot be printed."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text


def find_oom_exception(exc: BaseException | None, depth: int = 8) -> BaseException | None:
    """``exc`` or the first exception it was raised from (``__cause__``,
    then ``__context__``) whose text says the memory ran out."""
    seen: set[int] = set()
    while exc is not None and depth > 0 and id(exc) not in seen:
        seen.add(id(exc))
        if is_oom_text(exception_text(exc)):
            return exc
        exc = exc.__cause__ or exc.__context__
        depth -= 1
    return None


def type_name(exc: BaseException) -> str:
    """The exception's class as a traceback names it
    (``jax.errors.JaxRuntimeError``; a builtin's bare name)."""
    cls = type(exc)
    module = getattr(cls, "__module__", "") or ""
    return f"{module}.{cls.__qualname__}" if module and module != "builtins" else cls.__qualname__


def jax_imported() -> bool:
    """True once ``import jax`` has finished (not while it runs on some
    thread: importing from another thread then would break it)."""
    jax = sys.modules.get("jax")
    spec = getattr(jax, "__spec__", None)
    return jax is not None and spec is not None and not getattr(spec, "_initializing", False)


def error_classes() -> list[type]:
    """jax's runtime error class(es): ``jax.errors.JaxRuntimeError``, and
    ``XlaRuntimeError`` where it is another class (older jaxlib).

    Imports nothing: it may run on the agent's thread, and jax imports
    both modules itself.
    """
    found: list[type] = []
    if not jax_imported():
        return found
    candidates = [getattr(sys.modules.get("jax.errors"), "JaxRuntimeError", None),
                  getattr(sys.modules.get("jax._src.lib.xla_client"), "XlaRuntimeError", None),
                  getattr(sys.modules.get("jaxlib.xla_client"), "XlaRuntimeError", None)]
    for cls in candidates:
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in found:
            found.append(cls)
    return found

