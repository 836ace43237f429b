#!/usr/bin/env python3
"""An oracle for implicit JAX transfers per program line, from JAX's own
transfer guard only (nothing of jaxtop is imported).

    python tests/transfer_oracle.py [--json-out PATH] [--mode disallow|log]
        [--include PATH]... [--table] PROGRAM.py [ARGS...]

PROGRAM runs as ``__main__`` (sys.argv and sys.path[0] as for
``python PROGRAM.py``) from a copy of its source in which every simple
statement S on line L (Expr, Assign, AugAssign, AnnAssign with a value,
Return, Delete, Raise, Assert) of a module or function body became::

    _jto_r = False
    try:
        with __jto__.attempt(PATH, L):      # jax.transfer_guard("disallow")
            S
    except BaseException as _jto_e:
        if not __jto__.caught(_jto_e, PATH, L):   # not a guard error
            raise
        _jto_r = True
    if _jto_r:
        with __jto__.rerun(PATH, L):        # jax.transfer_guard("log"), counted
            S

The header expressions of if/elif/while (test), for (the iterable and each
next()) and with (the context expressions) are counted on their line in "log"
mode (no disallow attempt): they run once, as in the program.

Counting: fd 2 goes through a pipe for the whole run; JAX writes each guard
line with one write() (``W1206 05:51:29.465543  8684 guard_lib.cc:125]
host-to-device transfer: ...``, or jaxlib's older
``2026-12-03 19:09:21.852989: W .../transfer_guard_lib.cc:108] ...``). A guard
line written while a counting frame is the innermost one of the writing thread
(its id is in the abseil header) counts on that frame's line and is not
forwarded; every other byte goes on to the real stderr. The pipe is drained
(under a lock shared with a pump thread) at each counting frame's entry and
exit, so the attribution is exact, not timing-dependent.

Counts of a failed attempt are thrown away: statement L's disallow attempt may
run nested wrapped statements (in the program's own functions) that catch and
count their own transfers first, then fail itself; the rerun repeats them, and
only the rerun's counts stand. The innermost wrapped statement always catches
first, so a transfer counts on the innermost program statement that makes it.

Records, in the JSON: ``lines`` (counted guard lines per file/line/direction),
``caught`` (guard errors per the innermost frame of a transformed file in the
error's traceback, and the error's direction), ``disagreements`` (a caught line
that is not its statement's first line, or a caught direction the rerun did not
count), ``unattributed`` (guard lines outside any counting frame: code the
oracle could not wrap, other threads; forwarded to stderr). ``--mode log`` runs
every statement once under "log" only (no disallow, no rerun): a cross-check
that the disallow attempts do not change what JAX transfers.

Limits: a statement that raises a guard error runs twice (its side effects too:
``next(it)`` in it takes two items); statements directly in a class body, and
statements with yield/await other than ``yield V`` / ``x = yield V``, are not
wrapped; JAX is set to "log" globally when the program first imports it, so
such code still shows up under ``unattributed``.
"""

from __future__ import annotations

import builtins
import collections
import fcntl
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script under python -P, or imported: its sibling, then out of the way
    sys.path.insert(0, _HERE)
    from transfer_oracle_rewrite import BUILTIN_NAME, _Finder, transform  # noqa: E402
    sys.path.remove(_HERE)
else:
    from transfer_oracle_rewrite import BUILTIN_NAME, _Finder, transform  # noqa: E402

DIRECTIONS = {"host-to-device": "h2d", "device-to-host": "d2h", "device-to-device": "d2d"}
GUARD_LINE = re.compile(
    rb"(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(?P<tid>\d+) [^\]\n]*?guard_lib\.cc:\d+\] "
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] [^\]\n]*?guard_lib\.cc:\d+\] )"
    rb"(?P<dir>host-to-device|device-to-host|device-to-device) transfer: [^\n]*\n"
)
GUARD_ERROR = re.compile(r"Disallowed (host-to-device|device-to-host|device-to-device) transfer")
GUARD_ERROR_TYPES = ("JaxRuntimeError", "XlaRuntimeError")
F_SETPIPE_SZ = 1031


# ----------------------------------------------------------------------------
# The runtime: frames, the fd-2 pump, the guard levels.


class _Frame:
    __slots__ = ("kind", "path", "line", "counts", "caught", "disagreements", "own", "caught_info")

    def __init__(self, kind, path, line):
        self.kind = kind  # "attempt" (disallow), "count" (log), "root"
        self.path, self.line = path, line
        self.counts = collections.Counter()  # (path, line, dir) -> guard lines, pending
        self.caught = collections.Counter()  # (path, line, dir) -> guard errors, pending
        self.disagreements = collections.Counter()  # tuple -> n, pending
        self.own = collections.Counter()  # dir -> guard lines counted on this frame itself
        self.caught_info = None  # (path, line, dir) of the error a rerun frame repeats

    def merge_into(self, other):
        other.counts.update(self.counts)
        other.caught.update(self.caught)
        other.disagreements.update(self.disagreements)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class Oracle:
    def __init__(self, files, mode="disallow"):
        self.files = set(files)
        self.mode = mode
        self.lock = threading.Lock()
        self.root = _Frame("root", None, None)
        self.stacks = {}  # native thread id -> frame stack
        self.local = threading.local()
        self.unattributed = collections.Counter()
        self.jax = None
        self.main_tid = threading.get_native_id()
        self.rfd = None
        self.real_err = None
        self.stopping = False
        self.thread = None

    # -- guard levels ---------------------------------------------------
    def _guard(self, level):
        jax = self.jax
        if jax is None:
            mod = sys.modules.get("jax")
            if mod is None or not hasattr(mod, "transfer_guard") or not hasattr(mod, "config"):
                return _NULL  # no jax yet: no transfer possible, and importing it here
                # would read JAX_PLATFORMS/XLA_FLAGS before the program sets them
            self.jax = jax = mod
            # Code the oracle does not wrap still shows (under "unattributed").
            jax.config.update("jax_transfer_guard", "log")
        return jax.transfer_guard(level)

    def _stack(self):
        try:
            return self.local.stack
        except AttributeError:
            stack = self.local.stack = []
            with self.lock:
                self.stacks[threading.get_native_id()] = stack
            return stack

    # -- fd 2 -------------------------------------------------------------
    def start_capture(self):
        sys.stderr.flush()
        self.real_err = os.dup(2)
        os.set_inheritable(self.real_err, False)
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.dup2(w, 2)
        os.close(w)
        os.set_blocking(r, False)
        self.rfd = r
        self.thread = threading.Thread(target=self._pump, name="transfer-oracle-fd2", daemon=True)
        self.thread.start()

    def stop_capture(self):
        try:
            sys.stderr.flush()
        except Exception:
            pass
        self.stopping = True
        self.thread.join()
        with self.lock:
            self._drain_locked()
            os.dup2(self.real_err, 2)
            self._drain_locked()
            os.close(self.rfd)

    def _pump(self):
        while not self.stopping:
            try:
                ready, _, _ = select.select([self.rfd], [], [], 0.05)
            except (OSError, ValueError):
                return
            if ready:
                with self.lock:
                    self._drain_locked()

    def _drain_locked(self):
        while True:
            try:
                data = os.read(self.rfd, 1 << 20)
            except BlockingIOError:
                return
            if not data:
                return
            self._process_locked(data)

    def _forward(self, data):
        while data:
            try:
                n = os.write(self.real_err, data)
            except OSError:
                return
            data = data[n:]

    def _process_locked(self, data):
        pos = 0
        for m in GUARD_LINE.finditer(data):
            if self._count_locked(m):
                self._forward(data[pos : m.start()])
                pos = m.end()
        self._forward(data[pos:])

    def _count_locked(self, m):
        direction = DIRECTIONS[m["dir"].decode()]
        tid = int(m["tid"]) if m["tid"] else self.main_tid
        frame = None
        for f in reversed(self.stacks.get(tid, ())):
            if f.kind == "count":
                frame = f
                break
        if frame is None:
            self.unattributed[direction] += 1
            return False
        frame.counts[(frame.path, frame.line, direction)] += 1
        frame.own[direction] += 1
        return True

    # -- the wrappers' calls ----------------------------------------------
    def attempt(self, path, line):
        if self.mode == "log":
            return _Count(self, path, line, None)
        return _Attempt(self, path, line)

    def rerun(self, path, line):
        info, self.local.caught_info = getattr(self.local, "caught_info", None), None
        return _Count(self, path, line, info)

    def caught(self, exc, path, line):
        direction = self.guard_direction(exc)
        if direction is None:
            return False
        where = self.program_frame(exc.__traceback__) or (path, line)
        stack = self._stack()
        with self.lock:
            (stack[-1] if stack else self.root).caught[(where[0], where[1], direction)] += 1
        self.local.caught_info = (where[0], where[1], direction)
        return True

    def guard_direction(self, exc):
        seen = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, RuntimeError) or type(exc).__name__ in GUARD_ERROR_TYPES:
                m = GUARD_ERROR.search(str(exc))
                if m:
                    return DIRECTIONS[m[1]]
            exc = exc.__cause__
        return None

    def program_frame(self, tb):
        where = None
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if path in self.files:
                where = (path, tb.tb_lineno)
            tb = tb.tb_next
        return where

    def expr(self, path, line, thunk):
        with _Count(self, path, line, None):
            return thunk()

    _PLAIN = (range, list, tuple, dict, set, frozenset, str, bytes)

    def iterate(self, path, line, thunk):
        with _Count(self, path, line, None):
            obj = thunk()
            if type(obj) in self._PLAIN:
                return obj
            it = iter(obj)
        return self._iterate(path, line, it)

    def _iterate(self, path, line, it):
        while True:
            with _Count(self, path, line, None):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def stash(self, value):
        self.local.stash = value

    def unstash(self):
        value, self.local.stash = self.local.stash, None
        return value

    # -- results ------------------------------------------------------------
    def result(self):
        def rows(counter):
            return [
                {"file": os.path.basename(p), "path": p, "line": ln, "direction": d, "count": n}
                for (p, ln, d), n in sorted(counter.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))
            ]

        disagreements = [
            {
                "kind": kind,
                "file": os.path.basename(p),
                "path": p,
                "line": ln,
                "caught_file": os.path.basename(cp),
                "caught_line": cl,
                "direction": d,
                "count": n,
            }
            for (kind, p, ln, cp, cl, d), n in sorted(self.root.disagreements.items())
        ]
        return {
            "mode": self.mode,
            "lines": rows(self.root.counts),
            "caught": rows(self.root.caught),
            "disagreements": disagreements,
            "unattributed": dict(self.unattributed),
        }


class _Attempt:
    __slots__ = ("o", "frame", "guard", "stack")

    def __init__(self, o, path, line):
        self.o = o
        self.frame = _Frame("attempt", path, line)

    def __enter__(self):
        o = self.o
        self.stack = stack = o._stack()
        with o.lock:
            stack.append(self.frame)
        self.guard = o._guard("disallow")
        self.guard.__enter__()

    def __exit__(self, et, ev, tb):
        self.guard.__exit__(None, None, None)
        o, stack = self.o, self.stack
        with o.lock:
            stack.pop()
            if et is not None and o.guard_direction(ev) is not None:
                return False  # the rerun repeats it all: drop what the attempt counted
            self.frame.merge_into(stack[-1] if stack else o.root)
        return False


class _Count:
    __slots__ = ("o", "frame", "guard", "stack")

    def __init__(self, o, path, line, caught_info):
        self.o = o
        self.frame = _Frame("count", path, line)
        self.frame.caught_info = caught_info

    def __enter__(self):
        o = self.o
        self.stack = stack = o._stack()
        with o.lock:
            if o.rfd is not None:
                o._drain_locked()  # what came before belongs to the frame below
            stack.append(self.frame)
        self.guard = o._guard("log")
        self.guard.__enter__()

    def __exit__(self, et, ev, tb):
        self.guard.__exit__(None, None, None)
        o, stack, frame = self.o, self.stack, self.frame
        with o.lock:
            if o.rfd is not None:
                o._drain_locked()
            stack.pop()
            info = frame.caught_info
            if info is not None:
                cpath, cline, direction = info
                if (cpath, cline) != (frame.path, frame.line):
                    frame.disagreements[("caught-elsewhere", frame.path, frame.line, cpath, cline, direction)] += 1
                if not frame.own[direction]:
                    frame.disagreements[("not-counted", frame.path, frame.line, cpath, cline, direction)] += 1
            frame.merge_into(stack[-1] if stack else o.root)
        return False


# ----------------------------------------------------------------------------
# The command line and the subprocess entry.


def _table(result):
    rows = [f"{'file':<28} {'line':>5} {'dir':<4} {'count':>6}"]
    for r in result["lines"]:
        rows.append(f"{r['file']:<28} {r['line']:>5} {r['direction']:<4} {r['count']:>6}")
    rows.append(f"caught: {[(r['file'], r['line'], r['direction'], r['count']) for r in result['caught']]}")
    rows.append(f"disagreements: {result['disagreements']}")
    rows.append(f"unattributed: {result['unattributed']}")
    return "\n".join(rows) + "\n"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    json_out, mode, table, include = None, "disallow", False, []
    while argv and argv[0].startswith("--"):
        opt = argv.pop(0)
        if opt == "--":
            break
        if opt == "--table":
            table = True
        elif opt in ("--json-out", "--mode", "--include") and argv:
            val = argv.pop(0)
            if opt == "--json-out":
                json_out = val
            elif opt == "--mode":
                if val not in ("disallow", "log"):
                    sys.exit(f"transfer_oracle: --mode disallow|log, not {val!r}")
                mode = val
            else:
                include.append(val)
        else:
            if opt == "--help":
                print(__doc__)
                return 0
            sys.exit(f"transfer_oracle: bad option {opt}")
    if not argv:
        sys.exit("usage: transfer_oracle.py [--json-out PATH] [--mode disallow|log] [--table] PROGRAM.py [ARGS...]")
    program, args = argv[0], argv[1:]
    path = os.path.abspath(program)
    with open(path, "rb") as fh:
        code = transform(fh.read(), path)

    # JAX's guard lines are warnings: keep them from being filtered out.
    try:
        if int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")) > 1:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    except ValueError:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"

    oracle = Oracle([path], mode)
    setattr(builtins, BUILTIN_NAME, oracle)
    if include:
        sys.meta_path.insert(0, _Finder(oracle, include))
    sys.argv = [program, *args]
    if sys.flags.safe_path:  # python -P: nothing of the oracle's own is first on the path
        sys.path.insert(0, os.path.dirname(path))
    else:  # the oracle's directory stood where `python PROGRAM.py` puts the program's
        sys.path[0] = os.path.dirname(path)
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    module.__spec__ = None
    module.__loader__ = None
    sys.modules["__main__"] = module

    failure = None
    status = 0
    oracle.start_capture()
    try:
        exec(code, module.__dict__)
    except SystemExit as e:
        status, failure = e.code, e
    except BaseException as e:  # the program's: reported as python would, below
        status, failure = 1, e
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        oracle.stop_capture()
        result = oracle.result()
        result["program"] = path
        result["argv"] = [program, *args]
        result["exit_status"] = 0 if status is None else status if isinstance(status, int) else 1
        result["exception"] = None if failure is None else type(failure).__name__
        text = json.dumps(result, indent=1)
        if json_out:
            with open(json_out, "w") as fh:
                fh.write(text + "\n")
        else:
            sys.stdout.write(text + "\n")
        if table:
            sys.stderr.write(_table(result))
            sys.stderr.flush()
    if isinstance(failure, (SystemExit, KeyboardInterrupt)):
        raise failure
    if failure is not None:
        tb = failure.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        failure = failure.with_traceback(tb or failure.__traceback__)
        sys.excepthook(type(failure), failure, failure.__traceback__)
        sys.exit(1)
    return status


def oracle_run(program, args=(), env=None, timeout=300, mode="disallow", include=(), cwd=None):
    """Runs PROGRAM under the oracle in a fresh interpreter: (json result,
    CompletedProcess with the program's stdout/stderr bytes and exit status)."""
    with tempfile.TemporaryDirectory(prefix="transfer-oracle-") as tmp:
        out = os.path.join(tmp, "oracle.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--json-out", out, "--mode", mode]
        for inc in include:
            cmd += ["--include", str(inc)]
        cmd += [str(program), *map(str, args)]
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, cwd=cwd)
        if not os.path.exists(out):
            raise RuntimeError(f"the oracle wrote no result (exit {proc.returncode}): {proc.stderr.decode(errors='replace')[-3000:]}")
        with open(out) as fh:
            result = json.load(fh)
    return result, proc


def oracle_counts(program, args=(), env=None, timeout=300, *, mode="disallow", check=True, include=()):
    """{(basename, line, direction): guard lines} for PROGRAM run under the
    oracle in a subprocess (fresh fd 2 and JAX state). With check, a program
    that exits non-zero raises."""
    result, proc = oracle_run(program, args, env=env, timeout=timeout, mode=mode, include=include)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return {(r["file"], r["line"], r["direction"]): r["count"] for r in result["lines"]}


if __name__ == "__main__":
    sys.exit(main())
