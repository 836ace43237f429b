"""Queueing the line in a target through gdb (Python < 3.14).

gdb stops the target only long enough to call two functions that are safe
at any instruction: ``mmap`` (a bare system call: no allocator lock) for a
page holding one line of Python, and ``Py_AddPendingCall(PyRun_SimpleString,
page)``, which CPython provides to be called from any thread without the
GIL. gdb then detaches; the target's main thread runs that line itself at
its next eval-loop check, holding the GIL, between two bytecodes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile

from jaxtop.inject.target import InjectError, Target, already_traced, ptrace_denied, tracer_of

#: How long gdb gets to detach once it was interrupted.
GDB_TIMEOUT_S = 30.0

# Runs inside gdb (its embedded Python). gdb attaches with no shared-library
# symbols except libc's and libpython's (loading jaxlib's would keep the target
# stopped for many seconds), then lets the target run until its main thread
# enters a function where calling in is safe: at a function's entry the thread
# is in user space (a call made while it sits in a system call breaks the
# call's restart: time.sleep() would fail with errno 514), holds no allocator
# lock, and its caller-saved registers carry nothing but the arguments.
#
# gdb's own `call` is not used: it saves and restores the whole extended
# register state, which fails on some CPUs and VMs ("Couldn't write extended
# state status"). The script makes the two calls by hand with general-purpose
# registers only: arguments in rdi/rsi/..., a return address pointing back at
# the safe function's entry (where a breakpoint catches the return), below the
# red zone; then it puts every register back. x86-64 only.
_GDB_SCRIPT = r"""
import gdb

LINE = bytes.fromhex("__LINE__")
SAFE = ("PyEval_RestoreThread", "PyEval_SaveThread", "PyErr_CheckSignals")
ARGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
SAVED = ("rip", "rsp", "rax", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "eflags")


def say(text):
    gdb.write(text + "\n")
    gdb.flush()


def reg(name):
    value = gdb.parse_and_eval("$" + name)
    try:
        return int(value) & (2 ** 64 - 1)
    except gdb.error:  # a pointer-typed register (rip, rsp)
        return int(value.cast(gdb.lookup_type("long"))) & (2 ** 64 - 1)


def addr(expr):
    return int(gdb.parse_and_eval("(unsigned long)&" + expr))


class Stop(gdb.Breakpoint):
    hits = []

    def stop(self):
        Stop.hits.append(int(gdb.parse_and_eval("(unsigned long)$pc")))
        return True


def call(func, args, entry):
    # Call func(*args) in the stopped main thread; returns rax.
    rsp = reg("rsp")
    new = ((rsp - 512) & ~0xF) - 8  # below the red zone; rsp % 16 == 8 at entry, as after a call
    gdb.selected_inferior().write_memory(new, entry.to_bytes(8, "little"))
    for name, value in zip(ARGS, args):
        gdb.execute("set $%s = %d" % (name, value))
    gdb.execute("set $rax = 0")
    gdb.execute("set $rsp = %d" % new)
    gdb.execute("set $pc = %d" % func)
    back = Stop("*%d" % entry, internal=True)
    back.thread = 1
    try:
        while True:
            gdb.execute("continue")
            if reg("rsp") == new + 8:
                return reg("rax")
    finally:
        back.delete()


if gdb.selected_thread().num != 1:
    gdb.execute("thread 1")
points = []
for name in SAFE:
    try:
        bp = Stop(name, internal=True)
    except Exception:
        continue
    bp.thread = 1  # the main thread: the one that will run the pending call
    points.append(bp)
say("JAXTOP_WAITING %d" % len(points))
try:
    gdb.execute("continue")
except BaseException as exc:  # the CLI interrupts us (SIGINT) when it gives up
    say("JAXTOP_INTERRUPTED %s" % type(exc).__name__)
# Only a stop at one of our breakpoints is a safe point: a stop for any other
# reason (the CLI's interrupt, a signal) may have the thread inside a system
# call, and calling in from there would break the call's restart.
reached = bool(Stop.hits) and gdb.selected_thread() is not None and \
    int(gdb.parse_and_eval("(unsigned long)$pc")) == Stop.hits[-1]
if gdb.selected_thread() is None or gdb.selected_inferior().pid == 0:
    say("JAXTOP_EXITED")
    raise SystemExit
for bp in points:
    bp.delete()
if reached and points and gdb.selected_thread().num == 1:
    gdb.execute("set scheduler-locking on")  # only the main thread runs our calls
    saved = {name: reg(name) for name in SAVED}
    entry = saved["rip"]
    try:
        size = (len(LINE) + 1 + 4095) // 4096 * 4096
        page = call(addr("mmap"), (0, size, 3, 0x22, 2 ** 64 - 1, 0), entry)
        if page in (0, 2 ** 64 - 1) or page > 2 ** 63:
            say("JAXTOP_PAGE 0")
        else:
            gdb.selected_inferior().write_memory(page, LINE + b"\0")
            rc = call(addr("Py_AddPendingCall"), (addr("PyRun_SimpleString"), page), entry)
            say("JAXTOP_PAGE %d" % page)
            say("JAXTOP_RC %d" % (rc if rc < 2 ** 31 else rc - 2 ** 32 if rc < 2 ** 32 else rc - 2 ** 64))
    finally:
        for name, value in saved.items():
            gdb.execute("set $%s = %d" % (name, value))
else:
    say("JAXTOP_NO_SAFE_POINT")
gdb.execute("detach")
"""


def run_gdb(target: Target, line: bytes, timeout_s: float) -> None:
    """Queue ``line`` as a pending call in ``target``'s main thread through gdb.

    Args:
        target: the checked target.
        line: the Python line to queue.
        timeout_s: how long the main thread may take to reach a safe point.

    Raises:
        InjectError: nothing was queued; the message says why.
    """
    tracer = tracer_of(target.pid)
    if tracer:
        raise InjectError(already_traced(target.pid, tracer))
    gdb = shutil.which("gdb")
    if gdb is None:
        raise InjectError(
            "gdb is not installed (needed to inject into Python < 3.14). Install it: "
            "`sudo apt install gdb` (Debian/Ubuntu), `sudo dnf install gdb` (Fedora/RHEL), "
            "`conda install -c conda-forge gdb`; or start the program with `jaxtop run`"
        )
    fd, script = tempfile.mkstemp(prefix="jaxtop-gdb-", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(_GDB_SCRIPT.replace("__LINE__", line.hex()))
    cmd = [
        gdb, "-batch", "-nx", "-q",
        "-iex", "set auto-solib-add off",
        "-iex", "set confirm off",
        "-iex", "set pagination off",
        "-p", str(target.pid),
        "-ex", "handle SIGINT stop print nopass",
        "-ex", "set unwindonsignal on",
        "-ex", r"sharedlibrary ^/.*/libc\.so",
        "-ex", r"sharedlibrary libpython",
        "-ex", f"source {script}",
    ]
    try:
        # gdb runs from /: its embedded Python resolves a relative entry of the
        # user's PYTHONPATH ('.') against its working directory, and ours may
        # be one that others write (gdb's -nx already skips ./.gdbinit).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True, cwd="/")
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # No thread reached a safe function: interrupt gdb, which then
            # removes its breakpoints and detaches without calling in.
            proc.send_signal(signal.SIGINT)
            try:
                out, _ = proc.communicate(timeout=GDB_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                raise InjectError(f"gdb did not detach from process {target.pid}; check that it runs (kill -CONT {target.pid})") from None
    finally:
        os.unlink(script)
    if "ptrace: Operation not permitted" in out or "Could not attach to process" in out:
        raise InjectError(ptrace_denied(target.pid))
    if "JAXTOP_EXITED" in out or "No such process" in out or "The program no longer exists" in out:
        raise InjectError(f"process {target.pid} exited during injection")
    if "JAXTOP_NO_SAFE_POINT" in out:
        raise InjectError(
            f"no thread of process {target.pid} reached a safe point within {timeout_s:g} s (it is idle or blocked "
            "in a system call); nothing was injected. Try again while it is working, or raise --inject-timeout"
        )
    if "JAXTOP_WAITING 0" in out or "No symbol \"Py_AddPendingCall\"" in out:
        raise InjectError(f"process {target.pid} has no CPython symbols gdb can call (not CPython, or a stripped build)")
    rc = page = None
    for text in out.splitlines():
        if text.startswith("JAXTOP_RC "):
            rc = int(text.split()[1])
        elif text.startswith("JAXTOP_PAGE "):
            page = int(text.split()[1])
    if not page:
        raise InjectError(f"could not map a page in process {target.pid}: " + _tail(out))
    if rc != 0:
        raise InjectError(f"Py_AddPendingCall failed in process {target.pid} (rc={rc}): " + _tail(out))


def _tail(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])
