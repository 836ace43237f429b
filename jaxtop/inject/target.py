"""What can be learned of a target without stopping it, and why the kernel
may refuse to let jaxtop trace it: every check that needs no ptrace, and
the messages that name the cause and the way past it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from jaxtop.wire import paths


class InjectError(RuntimeError):
    """Injection did not happen (or did not finish); the message says what to do."""


@dataclass(frozen=True)
class Target:
    """A process found fit to inject into.

    Attributes:
        pid: its process id.
        python: the Python major.minor it runs (this jaxtop's own).
    """

    pid: int
    python: tuple[int, int]


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
    """The process's command name, or ``?``."""
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


def tracer_of(pid: int) -> int:
    """The pid tracing ``pid`` (a debugger, strace), or 0."""
    try:
        return int(_status(pid).get("TracerPid", "0"))
    except ValueError:
        return 0


def already_traced(pid: int, tracer: int) -> str:
    """Why ``pid`` cannot be traced: ``tracer`` traces it already."""
    return (
        f"process {pid} is already traced by pid {tracer} ({_command_name(tracer)}): a process has one tracer "
        "at a time. Detach that debugger (or strace) and try again"
    )


def ptrace_denied(pid: int) -> str:
    """Why attaching to a process of our own uid was refused (EPERM), and the way past it."""
    tracer = tracer_of(pid)
    if tracer:
        return already_traced(pid, tracer)
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


def check_visible(pid: int, paths_needed: list[str]) -> None:
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
