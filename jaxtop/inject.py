"""Start the agent inside a running Python process that did not start it.

How (docs/attach.md):

* Python >= 3.14 on both sides: ``sys.remote_exec(pid, bootstrap)``, which
  runs the file in the target's main thread at its next eval-loop check.
* Older Pythons: gdb. gdb stops the target only long enough to call two
  functions that are safe at any instruction: ``mmap`` (a bare system call:
  no allocator lock) for a page holding one line of Python, and
  ``Py_AddPendingCall(PyRun_SimpleString, page)``, which CPython provides to
  be called from any thread without the GIL. gdb then detaches; the target's
  main thread runs that line itself at its next eval-loop check, holding the
  GIL, between two bytecodes: the same safe point as ``sys.remote_exec``.

The line runs the bootstrap file below with ``runpy`` in its own namespace
(nothing is added to ``__main__``) and swallows every exception, so a
missing bootstrap (the CLI gave up and removed it) does nothing at all. The
bootstrap makes this jaxtop importable in the target (only the packages the
agent needs), calls ``jaxtop.instrument()`` and writes the outcome to a
result file the CLI waits for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxtop import client, paths

DEFAULT_TIMEOUT_S = 15.0
GDB_TIMEOUT_S = 30.0


class InjectError(RuntimeError):
    """Injection did not happen (or did not finish); the message says what to do."""


@dataclass(frozen=True)
class Target:
    pid: int
    python: tuple[int, int]


# -- checks that need no ptrace ---------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/PID/status`` (readable for every process), or
    {} when it cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        pass
    return fields


def _real_uid(status: dict[str, str]) -> int | None:
    """The real uid from a status ``Uid:`` line (real, effective, saved, fs).

    The real uid is the one the agent would go by (``os.getuid()``): its
    socket directory and the only peers it accepts."""
    try:
        return int(status["Uid"].split()[0])
    except (KeyError, IndexError, ValueError):
        return None


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "?"


def _not_attachable(pid: int) -> str:
    """Why the kernel refuses a process of our own uid, and what gets past it."""
    # The /proc/PID files of a non-dumpable process belong to root: for a
    # non-root caller that tells non-dumpable apart from a security module.
    try:
        dumpable = os.getuid() == 0 or os.stat(f"/proc/{pid}").st_uid != 0
    except OSError:
        dumpable = True
    why = ("it is non-dumpable" if not dumpable else "it is probably non-dumpable")
    return (
        f"process {pid} is not attachable: it runs as your uid, but the kernel refuses to let jaxtop inspect or "
        f"trace it ({why}: it called prctl(PR_SET_DUMPABLE, 0) or runs a setuid/setcap executable; or a security "
        "module such as SELinux or AppArmor forbids it). Injecting into it needs CAP_SYS_PTRACE: run jaxtop as "
        "root, or add the capability (`--cap-add=SYS_PTRACE` in docker); or start the program with `jaxtop run`"
    )


def _python_version_of(pid: int) -> tuple[str, tuple[int, int]]:
    """The target's executable and Python major.minor, or InjectError."""
    if pid == 1:
        # init (of the machine or of a container): it reaps every orphan and
        # its death ends them all; no one should pause it to inject code.
        raise InjectError(
            "PID 1 cannot be injected: it is init (of this system or container); jaxtop never stops it. "
            "If it is your Python program, start it with `jaxtop run` or call jaxtop.instrument() in it"
        )
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        raise InjectError(f"no process {pid}")
    # Whose it is, from the Uid line (readable for any process): a failed
    # read of /proc/PID/exe says nothing about the owner.
    uid, me = _real_uid(_status(pid)), os.getuid()
    if uid is not None and uid != me:
        # Even root, who may trace it, must not: the target could not read
        # jaxtop's private bootstrap, and its agent would serve only its own uid.
        raise InjectError(
            f"process {pid} belongs to another user, {paths.describe_uid(uid)}, not to you, "
            f"{paths.describe_uid(me)}: its agent would accept that user only. Run jaxtop as that user "
            f"(e.g. `sudo -u '#{uid}' jaxtop …`)"
        )
    try:
        exe = os.readlink(proc / "exe")
    except PermissionError:
        raise InjectError(_not_attachable(pid)) from None
    except FileNotFoundError:
        if not proc.exists():
            raise InjectError(f"process {pid} exited") from None
        raise InjectError(f"process {pid} ({_command_name(pid)}) is not a Python process: it has no executable "
                          "(a kernel thread)") from None
    except OSError as exc:
        raise InjectError(f"cannot inspect process {pid}: {exc.strerror}") from None
    try:
        maps = (proc / "maps").read_text(errors="replace")
    except PermissionError:
        raise InjectError(_not_attachable(pid)) from None
    except OSError as exc:
        raise InjectError(f"cannot read /proc/{pid}/maps: {exc.strerror}") from None
    version = _version_from_maps(maps, exe)
    if version is None:
        raise InjectError(f"process {pid} ({os.path.basename(exe)}) is not a Python process: no libpython or python executable in it")
    return exe, version


def _version_from_maps(maps: str, exe: str) -> tuple[int, int] | None:
    """Python major.minor from the mapped libpython or the executable's name."""
    import re

    names = [line.rsplit(None, 1)[-1] for line in maps.splitlines() if "/" in line]
    for name in names + [exe]:
        base = os.path.basename(name)
        match = re.match(r"(?:lib)?python(\d)\.(\d+)", base)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def check_target(pid: int) -> Target:
    """Everything that can be checked without stopping the target: that it
    is not PID 1, is ours, may be inspected, runs our Python version.

    Raises:
        InjectError: it cannot be injected; the message names the cause.
    """
    _, version = _python_version_of(pid)
    ours = sys.version_info[:2]
    if version != ours:
        raise InjectError(
            f"process {pid} runs Python {version[0]}.{version[1]} but this jaxtop runs on "
            f"{ours[0]}.{ours[1]}: the agent must be imported by the same Python version. "
            f"Install jaxtop for Python {version[0]}.{version[1]} (e.g. in the target's environment) "
            "and run that jaxtop"
        )
    return Target(pid, version)


def _tracer_of(pid: int) -> int:
    """The pid tracing ``pid`` (a debugger, strace), or 0."""
    try:
        return int(_status(pid).get("TracerPid", "0"))
    except ValueError:
        return 0


def _already_traced(pid: int, tracer: int) -> str:
    return (
        f"process {pid} is already traced by pid {tracer} ({_command_name(tracer)}): a process has one tracer "
        "at a time. Detach that debugger (or strace) and try again"
    )


def _ptrace_denied(pid: int) -> str:
    """Why attaching to a process of our own uid was refused (EPERM), and the way past it."""
    tracer = _tracer_of(pid)
    if tracer:
        return _already_traced(pid, tracer)
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = None
    causes = []
    if scope == "1":
        causes.append("kernel.yama.ptrace_scope = 1 lets a process trace only its descendants (allow it with "
                      "`sudo sysctl kernel.yama.ptrace_scope=0`)")
    elif scope in ("2", "3"):
        causes.append(f"kernel.yama.ptrace_scope = {scope} lets only CAP_SYS_PTRACE trace"
                      + (" (and 3 forbids it until reboot)" if scope == "3" else ""))
    causes.append("the process is non-dumpable (prctl(PR_SET_DUMPABLE, 0), a setuid/setcap executable)")
    causes.append("a security module (SELinux, AppArmor) or a seccomp filter forbids ptrace")
    return (
        f"process {pid} is not attachable: ptrace was refused (Operation not permitted). Possible causes: "
        + "; ".join(causes)
        + ". CAP_SYS_PTRACE gets past most of them: run jaxtop as root, or start its container with "
        "`--cap-add=SYS_PTRACE` (docker) / securityContext.capabilities.add: [SYS_PTRACE] (Kubernetes)"
    )


def _check_visible(pid: int, paths_needed: list[str]) -> None:
    """Refuse when the target cannot open the files it would run.

    ``/proc/PID/root`` resolves a path in the target's mount namespace: a
    container, or a service with a private /tmp (systemd's PrivateTmp=),
    does not see jaxtop's bootstrap there, and the queued line would then do
    nothing at all, which would look like a main thread stuck in C.
    """
    for needed in paths_needed:
        try:
            os.stat(f"/proc/{pid}/root{needed}")
        except FileNotFoundError:
            try:
                other = os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            except OSError:
                other = True
            where = "it runs in another mount namespace" if other else "its root directory is not ours"
            raise InjectError(
                f"process {pid} cannot see {needed}, which it would have to run: {where} (a container, or a service "
                "with a private /tmp such as systemd's PrivateTmp=). Nothing was injected. Run jaxtop inside the "
                "same mount namespace (the same container, with jaxtop installed there), or start the program "
                "with `jaxtop run`"
            ) from None
        except OSError:
            return  # cannot tell from here (no access to its root): go on


# -- the bootstrap ---------------------------------------------------------------------

_BOOTSTRAP = r'''
# Written by `jaxtop attach --inject`; runs once in the target's main thread.
import importlib.util
import json
import os
import sys
import traceback

PARAMS = __PARAMS__


def _write(result):
    tmp = PARAMS["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, PARAMS["result"])


class _JaxtopFinder:
    """Finds jaxtop (and, if the target lacks them, psutil and pynvml) where
    the attaching jaxtop has them, without putting that whole environment on
    the target's sys.path."""

    def __init__(self, packages, fallbacks):
        self.packages = packages
        self.fallbacks = fallbacks

    def find_spec(self, name, path=None, target=None):
        where = self.packages.get(name)
        if where is None and name in self.fallbacks:
            where = self.fallbacks[name]
        if where is None:
            return None
        if where.endswith(".py"):
            return importlib.util.spec_from_file_location(name, where)
        return importlib.util.spec_from_file_location(
            name, os.path.join(where, "__init__.py"), submodule_search_locations=[where]
        )


def _main():
    if tuple(sys.version_info[:2]) != tuple(PARAMS["python"]):
        _write({"ok": False, "error": "Python version changed: " + sys.version})
        return
    import jaxtop  # noqa: F401 (a jaxtop the target already has wins only if it is ours)

    handle = jaxtop.instrument(**PARAMS["instrument"])
    _write({"ok": True, "socket": str(handle.socket_path), "jax_imported": "jax" in sys.modules,
            "pid": os.getpid()})


_finder = _JaxtopFinder(PARAMS["packages"], {})
sys.meta_path.insert(0, _finder)
fallbacks = {}
for _name, _where in PARAMS["fallbacks"].items():
    if importlib.util.find_spec(_name) is None:
        fallbacks[_name] = _where
_finder.fallbacks = fallbacks
try:
    _main()
except BaseException as exc:
    try:
        _write({"ok": False, "error": type(exc).__name__ + ": " + str(exc),
                "traceback": traceback.format_exc(limit=8)})
    except BaseException:
        pass
'''


def _package_locations() -> tuple[dict[str, str], dict[str, str]]:
    """Where this jaxtop's agent packages live, and psutil/pynvml as fallbacks."""
    import importlib.util

    import jaxtop
    import jaxtop.probes

    packages = {"jaxtop": list(jaxtop.__path__)[0], "jaxtop.probes": list(jaxtop.probes.__path__)[0]}
    fallbacks: dict[str, str] = {}
    for name in ("psutil", "pynvml"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            fallbacks[name] = list(spec.submodule_search_locations)[0]
        else:
            fallbacks[name] = spec.origin
    return packages, fallbacks


def _one_line(boot: str) -> str:
    """The Python line the target runs: the bootstrap, or nothing at all."""
    code = f"try:\n __import__('runpy').run_path({boot!r}, run_name='__jaxtop_inject__')\nexcept BaseException:\n pass\n"
    return f"exec({code!r}, {{}})"


# -- injection ---------------------------------------------------------------------------


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


def _run_gdb(target: Target, line: bytes, timeout_s: float) -> None:
    tracer = _tracer_of(target.pid)
    if tracer:
        raise InjectError(_already_traced(target.pid, tracer))
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
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
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
        raise InjectError(_ptrace_denied(target.pid))
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


def _remote_exec(target: Target, boot: str) -> None:
    try:
        sys.remote_exec(target.pid, boot)  # type: ignore[attr-defined]
    except PermissionError:
        raise InjectError(_ptrace_denied(target.pid)) from None
    except ProcessLookupError:
        raise InjectError(f"process {target.pid} exited during injection") from None
    except RuntimeError as exc:
        if "disabled" in str(exc).lower():
            raise InjectError(
                f"remote debugging is disabled in process {target.pid} (PYTHON_DISABLE_REMOTE_DEBUG or "
                "-X disable_remote_debug); restart it with `jaxtop run`"
            ) from None
        raise InjectError(f"sys.remote_exec failed: {exc}") from None


def inject(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.1,
           method: str | None = None) -> dict[str, Any]:
    """Start the agent in ``pid``; returns the bootstrap's report.

    Raises:
        InjectError: with what happened and what to do. On failure the target
            is left as it was: a bootstrap that has not run yet finds its file
            gone and does nothing.
        paths.SocketDirError: this user's socket directory is not safe to use.
    """
    target = check_target(pid)
    paths.check_socket_dir()
    if paths.socket_path(pid).exists():
        return {"ok": True, "socket": str(paths.socket_path(pid)), "already": True}
    workdir = tempfile.mkdtemp(prefix="jaxtop-inject-")
    boot = os.path.join(workdir, "bootstrap.py")
    result = os.path.join(workdir, "result.json")
    packages, fallbacks = _package_locations()
    params = {
        "result": result,
        "python": list(target.python),
        "packages": packages,
        "fallbacks": fallbacks,
        "instrument": {"interval_s": interval_s},
    }
    Path(boot).write_text(_BOOTSTRAP.replace("__PARAMS__", repr(params)))
    if method is None:
        method = "remote_exec" if target.python >= (3, 14) and hasattr(sys, "remote_exec") else "gdb"
    try:
        _check_visible(pid, [boot, packages["jaxtop"]])
        if method == "remote_exec":
            # The same guarded one-liner as with gdb: nothing lands in the
            # namespace it runs in, and no exception escapes.
            line_file = os.path.join(workdir, "run_bootstrap.py")
            Path(line_file).write_text(_one_line(boot) + "\n")
            _remote_exec(target, line_file)
        else:
            _run_gdb(target, _one_line(boot).encode(), timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(result):
                report = json.loads(Path(result).read_text())
                if not report.get("ok"):
                    raise InjectError(f"the agent did not start in process {pid}: {report.get('error')}\n{report.get('traceback', '')}".rstrip())
                return report
            if not client.pid_alive(pid):
                raise InjectError(f"process {pid} exited during injection")
            time.sleep(0.05)
        raise InjectError(
            f"process {pid} did not run the injected code within {timeout_s:g} s: its main thread is "
            "probably inside a long C call (a blocking read, a long XLA computation, time.sleep). "
            "The pending injection was withdrawn; try again when it is back in Python code, or raise --inject-timeout"
        )
    finally:
        # On failure this withdraws the injection: a pending line that runs
        # later finds no bootstrap and does nothing.
        shutil.rmtree(workdir, ignore_errors=True)


def detach(pid: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """Ask the agent in ``pid`` to stop; returns its reply."""
    from jaxtop import protocol

    deadline = time.monotonic() + timeout_s
    rec: dict[str, Any] | None = None
    with client.AgentConnection.open(pid) as agent:
        command_id = agent.send_command("detach")
        # Samples keep coming until the agent acts on the command: skip to its reply.
        for line in agent.lines(should_stop=lambda: time.monotonic() >= deadline):
            try:
                candidate = protocol.decode(line)
            except protocol.ProtocolError:
                continue
            if candidate.get("type") == "reply" and candidate.get("id") == command_id:
                rec = candidate
                break
    if rec is None:
        if time.monotonic() >= deadline:
            raise InjectError(f"the agent in process {pid} did not reply within {timeout_s:g} s")
        raise InjectError(f"the agent in process {pid} closed the connection without replying")
    if not rec.get("ok"):
        raise InjectError(f"detach failed: {rec.get('error')}")
    deadline = time.monotonic() + timeout_s
    while paths.socket_path(pid).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return rec.get("result") or {}


