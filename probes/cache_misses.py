"""JAX's tracing-cache-miss explanations: turned on, read, and kept quiet.

With ``jax_explain_cache_misses`` on, jax logs why a function was traced and
compiled again (which argument, old and new type, the call site). The jit
ledger reads those records for its recompile reasons:

* :func:`parse_cache_miss` reads one record (any wording of jax 0.4.30 to
  0.10.2), :func:`name_key` spells a jitted function's name one way;
* :class:`CacheMissFilter` sees each record before any handler and hides
  the ones that exist only because jaxtop turned the option on;
* :class:`ExplainSwitch` turns the option on when the program left it
  alone, notices the program taking it over, and undoes everything;
* :func:`subscribe_reasons` hands each recompile reason the ledger read to
  others in the process (the budget's compile log names it in its report).

Stdlib and jax only: this runs in the user's job.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "CacheMissFilter",
    "EXPLAIN_ENV",
    "EXPLAIN_OPTION",
    "ExplainSwitch",
    "MISS_LOGGERS",
    "MissBook",
    "user_call_site",
    "PERSISTENT_CACHE_LOGGERS",
    "name_key",
    "parse_cache_miss",
    "publish_reason",
    "subscribe_reasons",
    "unsubscribe_reasons",
]

#: The config option, and its environment variable.
EXPLAIN_OPTION = "jax_explain_cache_misses"
EXPLAIN_ENV = "JAX_EXPLAIN_CACHE_MISSES"
#: Loggers that write the tracing-cache-miss explanations: ``jax._src.pjit``
#: up to jax 0.8.3, ``jax._src.interpreters.partial_eval`` from 0.9.2. Both
#: are watched on every version: the move happened between those releases,
#: and a filter on a logger that never writes such a record costs nothing.
MISS_LOGGERS = ("jax._src.pjit", "jax._src.interpreters.partial_eval")
#: Loggers whose persistent-cache records go from DEBUG to WARNING while the
#: option is on (only when the persistent compilation cache is enabled).
PERSISTENT_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
#: Those records' format strings start so (jax 0.6.2 to 0.10.2).
_PERSISTENT_PREFIXES = (
    "PERSISTENT COMPILATION CACHE MISS",
    "Not writing persistent cache entry",
    "Writing %s to persistent compilation cache",
)
_MISS_PREFIX = "TRACING CACHE MISS"

_NAME_CHARS = re.compile(r"[^\w.-]")
_MISS_HEAD = re.compile(
    r"^TRACING CACHE MISS at (?P<site>.*) \((?P<fn>[^()]*)\)(?: costing [\d.]+ ms)?(?: because)?:\s*$")
_SITE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)?$")
_FOR_FN = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<def>\S+))?\s*$")
_NEW_FN = re.compile(r"^\s*(?P<name>.+?) id=\d+(?: defined at (?P<def>\S+))?\s*$")
#: One argument's type change: jax 0.6.2+ and jax 0.4.30–0.5.x wording.
_DIFF_NOW = re.compile(r"\*\s+at (?P<arg>.+?), now (?P<new>.+?) and before (?P<old>.+?)\s*$")
_DIFF_SEEN = re.compile(r"\*\s+at (?P<arg>.+?), seen (?P<old>.+?), but now given (?P<new>.+?)\s*$")
#: A static argument's value changed: jax says so as a pytree-metadata
#: difference of its ``Static`` node (jax 0.6.2+).
_STATIC = re.compile(
    r"\*\s+at input path (?P<arg>.+?), now <class '[^']*Static'> with pytree metadata Static\(val=(?P<new>.*?)\)"
    r" and before <class '[^']*Static'> with pytree metadata Static\(val=(?P<old>.*?)\), so the pytree")
_PATH_NAME = re.compile(r"\['(?P<name>[^']+)'\]$")
_PATH_POS = re.compile(r"^\[0\]\[(?P<pos>\d+)\]$")
_OBJECT_REPR = re.compile(r"^<(?:[\w.]+\.)?(?P<cls>\w+) object at 0x[0-9a-f]+>$")


def _static_arg(path: str) -> str:
    """``[1]['train']`` -> ``train``; ``[0][1]`` -> ``#1``."""
    m = _PATH_NAME.search(path)
    if m:
        return m.group("name")
    m = _PATH_POS.match(path)
    return f"#{m.group('pos')}" if m else path


def _static_value(value: str) -> str:
    """A value's repr, short: ``<__main__.Cfg object at 0x7f…>`` -> ``a Cfg object``."""
    m = _OBJECT_REPR.match(value.strip())
    return f"a {m.group('cls')} object" if m else value.strip()[:80]


def name_key(name: str) -> str:
    """One spelling for a jitted function's name, whoever reports it.

    ``jax.monitoring`` says ``jit(step)`` or ``jit(<lambda>)``; the compiled
    module is ``jit_step`` or ``jit__lambda`` (``jit__lambda_`` before jax
    0.10): the characters a module name cannot hold become ``_``, and
    trailing ``_`` are dropped, so all of them meet on ``jit_step`` /
    ``jit__lambda``.
    """
    key = _NAME_CHARS.sub("_", name).rstrip("_") or name
    # Generated code can name a function with megabytes: every report of
    # it (a table row, a storm, a leak) would carry them.
    return key if len(key) <= MAX_KEY else key[:MAX_KEY - 1] + "…"


#: The longest function key kept (the rest of a longer name is cut, alike
#: whoever reports it, so the reports still meet).
MAX_KEY = 256


def parse_cache_miss(message: str) -> dict[str, Any] | None:
    """Read one tracing-cache-miss explanation (any wording of jax 0.4.30–0.10.2).

    Args:
        message: the log record's formatted message.

    Returns:
        None when it is not such a record; else ``kind`` (``types``: an
        argument's shape or dtype changed; ``static``: a static argument's
        value changed (``same_repr`` when both values print alike: an
        object without value equality); ``new_function``: first trace of
        this function object; ``redefined``: a new function object defined on
        a line that was traced before, the mark of jit closures created in a
        loop; ``other``: any other key difference, in ``text``), ``fn`` (the
        function's name as jax prints it), ``key`` (:func:`name_key` of its
        jit), ``call_site`` (``file:line``), ``call_fn``, ``defined_at``,
        ``arg``/``old``/``new`` of the first changed argument and ``diffs``
        (every ``[arg, old, new]`` named, at most 4), ``text`` (the
        explanation without its header, at most 600 characters).
    """
    lines = message.splitlines()
    if not lines or not lines[0].startswith(_MISS_PREFIX):
        return None
    out: dict[str, Any] = {"kind": "other", "fn": None, "key": None, "call_site": None,
                           "call_fn": None, "defined_at": None}
    head = _MISS_HEAD.match(lines[0])
    if head:
        site = _SITE.match(head.group("site"))
        out["call_site"] = f"{site.group('file')}:{site.group('line')}" if site else head.group("site")
        out["call_fn"] = head.group("fn")
    body = lines[1:]
    for i, line in enumerate(body):
        stripped = line.strip()
        if stripped.startswith("never seen function"):
            out["kind"] = "new_function"
            m = _NEW_FN.match(body[i + 1]) if i + 1 < len(body) else None
            if m:
                out["fn"], out["defined_at"] = m.group("name"), m.group("def")
            break
        m = _FOR_FN.match(line)
        if m:
            out["fn"], out["defined_at"] = m.group("name"), m.group("def")
            break
    if out["kind"] == "new_function" and "re-defined repeatedly" in message:
        out["kind"] = "redefined"
    for line in body:
        m = _STATIC.search(line)
        if m:
            out["kind"] = "static"
            out["arg"] = _static_arg(m.group("arg"))
            out["old"], out["new"] = _static_value(m.group("old")), _static_value(m.group("new"))
            if out["old"] == out["new"]:
                # Equal reprs: a new object that hashes or compares unequal
                # to the last one (no __hash__/__eq__ by value).
                out["same_repr"] = True
            break
    diffs = []
    for line in body if out["kind"] != "static" else ():
        m = _DIFF_NOW.search(line) or _DIFF_SEEN.search(line)
        if m and len(diffs) < 4:
            diff = [m.group("arg"), m.group("old"), m.group("new")]
            if diff not in diffs:
                diffs.append(diff)
    if diffs:
        out["kind"] = "types" if out["kind"] == "other" else out["kind"]
        out["arg"], out["old"], out["new"] = diffs[0]
        out["diffs"] = diffs
    if out["fn"]:
        out["key"] = name_key(f"jit({out['fn']})")
    text = "\n".join(line.rstrip() for line in body).strip()
    out["text"] = text[:600]
    return out


class CacheMissFilter(logging.Filter):
    """Reads JAX's cache-miss records; hides the ones jaxtop caused.

    A filter on the exact logger rather than a handler: it sees each record
    of that logger before any handler, and can drop one without changing
    what happens to any other. A handler could not: it runs after the
    logger's other handlers, the ``jax`` logger's own StreamHandler and the
    root's would print the record anyway, and its mere presence would stop
    Python's last-resort handler from printing the program's own warnings.

    Args:
        on_miss: called with the record's message for every tracing-cache-miss
            record (on the thread that logged it; must not raise).
        jaxtop_owns: whether the option is on only because jaxtop turned it
            on (called per record: the program may take it over later).
        user_local: whether the program turned the option on for this thread
            only (``with jax.explain_cache_misses(True)``): its records are
            the program's.
    """

    def __init__(self, on_miss: Callable[[str, float], None], jaxtop_owns: Callable[[], bool],
                 user_local: Callable[[], bool]) -> None:
        super().__init__()
        self._on_miss = on_miss
        self._jaxtop_owns = jaxtop_owns
        self._user_local = user_local
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not isinstance(msg, str):
            return True
        if msg.startswith(_MISS_PREFIX):
            try:
                self._on_miss(record.getMessage(), record.created)
            except Exception:
                pass
            if self._ours():
                # Without jaxtop this record would not exist.
                self.hidden += 1
                return False
            return True
        if record.levelno == logging.WARNING and msg.startswith(_PERSISTENT_PREFIXES) and self._ours():
            # Without jaxtop jax would have logged it at DEBUG: do so, and
            # let it through only where the program's logging takes DEBUG.
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            logger = logging.getLogger(record.name)
            if not logger.isEnabledFor(logging.DEBUG):
                self.hidden += 1
                return False
        return True

    def _ours(self) -> bool:
        try:
            return self._jaxtop_owns() and not self._user_local()
        except Exception:
            return False


class ExplainSwitch:
    """``jax_explain_cache_misses``: who turned it on, and the log filters.

    jaxtop turns the option on only when the program left it alone (neither
    the option nor :data:`EXPLAIN_ENV` set) and ``wanted`` is true; it then
    owns the records, until the program sets the option itself (seen through
    a pass-through wrapper of ``jax.config.update``). :meth:`stop` removes
    the filters and the wrapper and turns the option off again if jaxtop
    still owns it.

    Args:
        wanted: turn the option on when the program did not set it.
    """

    def __init__(self, wanted: bool = True) -> None:
        self.wanted = wanted
        self.by: str | None = None  # "user" | "jaxtop" | None (off)
        self.reason: str | None = None
        self.filter: CacheMissFilter | None = None
        self.filtered: list[logging.Logger] = []
        self._we_enabled = False
        self._config: Any = None
        self._orig_update: Any = None
        self._our_update: Any = None
        self._state: Any = None

    def start(self, on_miss: Callable[[str, float], None], active: Callable[[], bool]) -> None:
        """Set the option (see the class docstring) and filter the loggers.

        Args:
            on_miss: called with each tracing-cache-miss record's message
                and time (:class:`CacheMissFilter`).
            active: whether the caller still listens (the wrapper of
                ``jax.config.update`` notices the program only then).
        """
        import jax

        config = jax.config
        self._config = config
        try:
            from jax._src import config as config_module

            self._state = getattr(config_module, "explain_cache_misses", None)
        except Exception:
            self._state = None
        user_value = bool(getattr(config, EXPLAIN_OPTION))
        if EXPLAIN_ENV in os.environ or user_value:
            self.by = "user" if user_value else None
            if not user_value:
                self.reason = f"the program set {EXPLAIN_ENV}={os.environ.get(EXPLAIN_ENV)!r}"
        elif self.wanted:
            self._wrap_config_update(config, active)
            (self._orig_update or config.update)(EXPLAIN_OPTION, True)
            self._we_enabled = True
            self.by = "jaxtop"
        else:
            self.reason = f"{EXPLAIN_OPTION} is off (jaxtop left it alone)"
        self.filter = CacheMissFilter(on_miss, self.jaxtop_owns, self.user_local)
        for name in MISS_LOGGERS + PERSISTENT_CACHE_LOGGERS:
            logger = logging.getLogger(name)
            logger.addFilter(self.filter)
            self.filtered.append(logger)

    def failed(self, reason: str) -> None:
        """:meth:`start` raised: no explanations, and why."""
        self.by, self.reason = None, reason

    def _wrap_config_update(self, config: Any, active: Callable[[], bool]) -> None:
        """Notice the program's own ``jax.config.update(EXPLAIN_OPTION, ...)``.

        The option is a plain boolean: once jaxtop has set it, the program
        setting it too changes nothing visible, yet from then on the records
        are the program's and must reach it (and stay on after jaxtop
        stops). The wrapper passes every call through unchanged.
        """
        original = config.update
        switch = self

        def update(name: Any, val: Any) -> Any:
            if name == EXPLAIN_OPTION and active():
                switch._user_took_over(val)
            return original(name, val)

        update.__wrapped__ = original  # type: ignore[attr-defined]
        update.__doc__ = getattr(original, "__doc__", None)
        self._orig_update = original
        self._our_update = update
        config.update = update

    def _user_took_over(self, value: Any) -> None:
        self._we_enabled = False
        self.by = "user" if value else None
        self.reason = None if value else f"the program set {EXPLAIN_OPTION} to {value!r}"

    def jaxtop_owns(self) -> bool:
        """The option is on only because jaxtop turned it on."""
        return self._we_enabled and self.by == "jaxtop"

    def user_local(self) -> bool:
        """The program turned the option on for this thread only
        (``with jax.explain_cache_misses(True)``)."""
        state = self._state
        get_local = getattr(state, "get_local", None)
        if get_local is None:
            return False
        return get_local() is True

    def stop(self) -> None:
        """Undo every change: log filters, ``jax.config.update``, the option."""
        for logger in self.filtered:
            try:
                logger.removeFilter(self.filter)
            except Exception:
                pass
        self.filtered = []
        config, self._config = self._config, None
        if config is not None and self._our_update is not None:
            try:
                if config.__dict__.get("update") is self._our_update:
                    del config.update  # the class's method again
            except Exception:
                pass
        try:
            if self._we_enabled and self.by == "jaxtop" and config is not None:
                if getattr(config, EXPLAIN_OPTION, False):
                    (self._orig_update or config.update)(EXPLAIN_OPTION, False)
        except Exception:
            pass
        self._we_enabled = False

    def status(self, misses_total: int) -> dict[str, Any]:
        """The ledger's ``explain`` field: on or off, by whom, and why not."""
        config = self._config
        enabled = bool(getattr(config, EXPLAIN_OPTION, False)) if config is not None else False
        out: dict[str, Any] = {"enabled": enabled, "by": self.by if enabled else None,
                               "misses_total": misses_total}
        reason = self.reason
        if enabled and reason is None:
            for logger in self.filtered[:len(MISS_LOGGERS)]:
                if logger.disabled:
                    reason = f"logger {logger.name!r} is disabled (logging configuration): no explanations"
                elif not logger.isEnabledFor(logging.WARNING):
                    reason = (f"logger {logger.name!r} is set above WARNING by the program's logging "
                              "configuration: no explanations")
                else:
                    reason = None
                    break
        if reason:
            out["reason"] = reason
        if self.filter is not None:
            out["hidden_total"] = self.filter.hidden
        return out


#: Function definitions remembered to check jax's "re-defined" guess.
MAX_DEFINITIONS = 10_000
#: Functions whose cache-miss reasons wait for their compile.
MAX_WAITING = 1_000


class MissBook:
    """The jit ledger's cache-miss records, between the miss and the compile.

    :meth:`reason` turns a parsed record into a recompile reason (None for a
    first trace), checking jax's "re-defined" guess; :meth:`wait` keeps the
    reasons of a function until its compile comes (:meth:`pop`): a function
    traced inside another one's trace (a jitted helper called in a jitted
    step) is inlined there and never compiles on its own, and its misses are
    no recompiles. Called under the ledger's lock.
    """

    def __init__(self) -> None:
        self._definitions: set[tuple[Any, Any]] = set()  # (function, defined at) of the misses seen
        self._waiting: dict[str, tuple[str | None, list[dict[str, Any]]]] = {}

    def reason(self, parsed: dict[str, Any], created: float) -> dict[str, Any] | None:
        definition = (parsed.get("fn"), parsed.get("defined_at"))
        seen = definition in self._definitions
        if not seen:
            if len(self._definitions) >= MAX_DEFINITIONS:
                self._definitions.clear()
            self._definitions.add(definition)
        if parsed["kind"] == "redefined" and not seen and definition[1]:
            # jax says "seen another function defined on the same line", and
            # keys that line on the jitted callable's own code: for flax's
            # nnx.jit (any wrapper defined in a library) that is the
            # wrapper's line, the same for every function it wraps. The
            # function jax names, defined where jax says, was never traced
            # before: a first trace.
            parsed["kind"] = "new_function"
        if parsed["kind"] == "new_function":
            return None  # the first trace of a function: not a recompile
        # The function row carries its name and definition; the explanation's
        # text only says more than arg/old/new when the kind is not "types".
        skip = {"key", "fn", "defined_at"} | ({"text"} if parsed["kind"] == "types" else set())
        reason = {k: v for k, v in parsed.items() if k not in skip and v is not None}
        if len(reason.get("diffs", ())) < 2:
            reason.pop("diffs", None)
        reason["t"] = round(created, 6)
        return reason

    def wait(self, key: str, defined_at: str | None, reason: dict[str, Any] | None, keep: int) -> None:
        """Keep ``reason`` (and the definition) of ``key`` until its compile."""
        was_defined, reasons = self._waiting.pop(key, (None, []))
        if reason is not None:
            reasons = (reasons + [reason])[-keep:]
        self._waiting[key] = (defined_at or was_defined, reasons)
        if len(self._waiting) > MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]  # the oldest

    def settle(self, fn: Any) -> None:
        """``fn`` (the ledger's function row) compiled: the reasons that
        waited for it become its recompile reasons, with the definition
        they named."""
        waiting = self._waiting.pop(fn.key, None)
        if waiting is None:
            return
        defined_at, reasons = waiting
        if defined_at:
            fn.defined_at = defined_at
        for reason in reasons:
            fn.add_reason(reason)


def user_call_site(reason: dict[str, Any], frame: Any) -> None:
    """jax names the innermost frame that called the jitted function: for a
    wrapper such as flax's ``nnx.jit``, a line in site-packages. The miss is
    logged on the calling thread, so the program's own line is on the stack
    above ``frame``: the one frame filter every probe uses (holders, host
    syncs) picks it for ``call_site``, and jax's line is kept as ``traced_at``."""
    from jaxtop.probes.frames import LIBRARY, walk

    site = reason.get("call_site")
    if not isinstance(site, str) or not LIBRARY.is_library(site.rpartition(":")[0]):
        return
    try:
        (filename, line, name), library, _ = walk(frame)
    except Exception:
        return
    if not library:
        reason["traced_at"] = site
        reason["call_site"], reason["call_fn"] = f"{filename}:{line}", name


# Replaced, never changed in place: publish_reason reads it without a lock.
_reason_subscribers: tuple[Callable[[str, Any], None], ...] = ()


def subscribe_reasons(fn: Callable[[str, Any], None]) -> None:
    """Hand ``fn(key, reason)`` each tracing-cache miss the jit ledger reads:
    the function's key (``jit_step``) and its recompile reason (None for a
    first trace), on the thread that traced, before its compile event."""
    global _reason_subscribers
    if fn not in _reason_subscribers:
        _reason_subscribers = _reason_subscribers + (fn,)


def unsubscribe_reasons(fn: Callable[[str, Any], None]) -> None:
    global _reason_subscribers
    _reason_subscribers = tuple(s for s in _reason_subscribers if s != fn)


def publish_reason(key: str, reason: dict[str, Any] | None) -> None:
    """Hand one miss to every subscriber; an exception from one is dropped
    (the thread is the program's)."""
    for fn in _reason_subscribers:
        try:
            fn(key, reason)
        except Exception:
            pass
