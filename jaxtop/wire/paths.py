"""Paths jaxtop trusts: the agents' socket directory, the files jaxtop
writes, and where the Python processes it starts import from.

Agents put their sockets in one private directory per user. The directory
is trusted only while it is private: a real directory (not a symbolic
link), owned by the current uid, that nobody else may write. Its default
name, ``/tmp/jaxtop-$UID``, can be taken first by anyone; whoever
owns the directory decides which "agents" a client sees and receives their
commands. So the agent (:func:`ensure_socket_dir`) refuses a directory that is
not private and the clients (:func:`check_socket_dir`) refuse one that others
could have written to. Neither ever chmods or chowns a directory jaxtop did
not create: an explicit ``$JAXTOP_SOCKET_DIR`` that is shared (a project
directory, ``/tmp`` itself) is refused, not made private.

Every file jaxtop writes (:func:`write_atomic`, :func:`replacing`,
:func:`create_output`) is made under a random name in its directory, with
``O_EXCL|O_NOFOLLOW``, then renamed over its name. A directory that a group
shares (a setgid project directory, mode 2770) is not sticky, so the
kernel's ``fs.protected_symlinks`` does not apply there: any member could
plant a symbolic link at a name jaxtop would open, and the write would land
in whatever the link points to, with the writer's rights. A rename replaces
the link itself. A link is followed only when this user (or root) made it;
then the file it names is replaced and the link stays. A device, a FIFO or a
terminal of this user's (or root's) is written through, as a shell's ``>``
would; anyone else's is replaced like a file.

Children that run jaxtop's own modules (:func:`python_command`) import from
where this process does, never from the working directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import sys
from pathlib import Path
from typing import IO, Any, Iterator

#: Mode bits the agent refuses on an existing directory: any access for group or others.
AGENT_FORBIDDEN_MODE = 0o077
#: Mode bits clients refuse: group or others could have planted sockets.
CLIENT_FORBIDDEN_MODE = 0o022


class SocketDirError(OSError):
    """The socket directory, or a socket in it, is not safe to use.

    An :class:`OSError`, as :func:`jaxtop.instrument` documents for "the
    socket could not be created". The message is one line that names the
    path and, where that is the problem, its owner.
    """


def socket_dir() -> Path:
    """The per-user socket directory (not created).

    ``$JAXTOP_SOCKET_DIR`` wins (tests, unusual setups); then
    ``$XDG_RUNTIME_DIR/jaxtop``; then ``/tmp/jaxtop-$UID``.
    """
    override = os.environ.get("JAXTOP_SOCKET_DIR")
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "jaxtop"
    return Path(f"/tmp/jaxtop-{os.getuid()}")


def describe_uid(uid: int) -> str:
    """``nobody (uid 65534)``, or ``uid N`` when the name is unknown."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _advice(path: Path) -> str:
    if os.environ.get("JAXTOP_SOCKET_DIR"):
        # Telling someone to chmod what may be /tmp or a project directory
        # would be wrong: point them at a directory of jaxtop's own.
        return ("set JAXTOP_SOCKET_DIR to a directory that does not exist yet (jaxtop creates it, mode 0700) "
                "or unset it")
    return "remove it (jaxtop creates it again, mode 0700) or set JAXTOP_SOCKET_DIR to a private directory"


def _check(path: Path, st: os.stat_result, forbidden: int) -> None:
    """Raise :class:`SocketDirError` unless ``st`` (an lstat of ``path``)
    is a private directory of ours."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to {os.readlink(path)}"
        except OSError:
            target = ""
        raise SocketDirError(
            f"socket directory {path} is a symbolic link{target}, owned by {describe_uid(st.st_uid)}; "
            f"jaxtop trusts only a real directory that is yours: {_advice(path)}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"socket directory {path} exists and is not a directory: {_advice(path)}")
    me = os.getuid()
    if st.st_uid != me:
        raise SocketDirError(
            f"socket directory {path} belongs to {describe_uid(st.st_uid)}, not to you, {describe_uid(me)}: "
            f"whoever owns it decides which processes jaxtop shows and receives its commands; {_advice(path)}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & forbidden:
        who = "written to" if forbidden == CLIENT_FORBIDDEN_MODE else "used"
        raise SocketDirError(
            f"socket directory {path} has mode {mode:04o}: it can be {who} by group or others, and jaxtop never "
            f"changes the mode of a directory it did not create; {_advice(path)}"
        )


def _set_private_mode(path: Path) -> None:
    """Give the directory just created here mode 0700 (the umask may have
    narrowed it), through a descriptor: if it was swapped for a link or for
    someone else's directory in between, nothing is changed and the check
    that follows refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_socket_dir(path: Path | None = None) -> Path:
    """The socket directory, checked for clients before they trust a socket in it.

    A directory that does not exist is fine (no agents). An existing one
    must be a real directory (not a symbolic link) owned by the current uid
    that neither group nor others may write.

    Args:
        path: The directory to check; the one :func:`socket_dir` names by default.

    Returns:
        The directory, which may not exist.

    Raises:
        SocketDirError: it is not safe; the message names the path and owner.
    """
    path = socket_dir() if path is None else path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise SocketDirError(f"cannot inspect socket directory {path}: {exc.strerror}") from None
    _check(path, st, CLIENT_FORBIDDEN_MODE)
    return path


def ensure_socket_dir() -> Path:
    """Create the socket directory with mode 0700, or check an existing one.

    Only a directory created here is given its mode; an existing one must
    already be private (a real directory of ours, no access for group or
    others) and is left exactly as it is otherwise.

    Raises:
        SocketDirError: it cannot be created, or it exists and is not safe
            (not a directory, a symbolic link, another user's, or open to
            group or others).
    """
    path = socket_dir()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SocketDirError(f"cannot create socket directory {path}: {exc.strerror}") from None
    else:
        _set_private_mode(path)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise SocketDirError(f"cannot inspect socket directory {path}: {exc.strerror}") from None
    _check(path, st, AGENT_FORBIDDEN_MODE)
    return path


def socket_path(pid: int) -> Path:
    """The socket an agent in process ``pid`` listens on."""
    return socket_dir() / f"{pid}.sock"


# -- files jaxtop writes -------------------------------------------------------------

#: Symbolic links followed on the way to a file before giving up, as the kernel does.
MAX_LINKS = 40
# Ctrl-C or SIGTERM while a temporary file is being made would leave it
# behind: they wait (blocked) until it is recorded or renamed.
_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _trusted(st: os.stat_result) -> bool:
    """Made by this user or by root: a link or device of anyone else's is never written through."""
    return st.st_uid in (os.geteuid(), 0)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_uid) == (b.st_dev, b.st_ino, b.st_uid)


def _lstat_and_link(dir_fd: int, name: str) -> tuple[os.stat_result, str | None]:
    """What is at ``name``, and its target when it is a link of ours.

    The owner and the target are read from the same link: through a
    descriptor of the link itself (``O_PATH``), or, without one, checked to
    be the same link after reading; never a link swapped in between.
    """
    o_path = getattr(os, "O_PATH", 0)
    if o_path:
        fd = os.open(name, o_path | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISLNK(st.st_mode) or not _trusted(st):
                return st, None
            return st, os.readlink("", dir_fd=fd)
        finally:
            os.close(fd)
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode) or not _trusted(st):
        return st, None
    text = os.readlink(name, dir_fd=dir_fd)
    if not _same(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), st):
        raise OSError(errno.EAGAIN, "the symbolic link changed while jaxtop read it")
    return st, text


def _opens(dir_fd: int, name: str) -> bool:
    """Whether ``name`` leads somewhere when its links are followed."""
    try:
        os.stat(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


class _Target:
    """Where a file goes: its directory (open), its name there, what is there
    now (``None``: nothing), and whether it is written through (a device, a
    FIFO, a terminal: replacing it would break what it is)."""

    def __init__(self, path: str) -> None:
        self.path = path
        current = path
        for _ in range(MAX_LINKS + 1):
            folder, self.name = os.path.split(current)
            if self.name in ("", ".", ".."):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            self.dir_fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                self.st, link = _lstat_and_link(self.dir_fd, self.name)
            except FileNotFoundError:
                self.st, link = None, None
            except BaseException:
                os.close(self.dir_fd)
                raise
            self.through = self.magic = False
            if link is None:
                mode = self.st.st_mode if self.st is not None else stat.S_IFREG
                if stat.S_ISDIR(mode):
                    os.close(self.dir_fd)
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                # Someone else's FIFO or link is replaced like a file: writing
                # through it would let them read the data, or block the writer.
                self.through = not stat.S_ISREG(mode) and not stat.S_ISLNK(mode) and _trusted(self.st)
                return
            current = os.path.join(folder, link)
            if not os.path.lexists(current) and _opens(self.dir_fd, self.name):
                # A /proc/PID/fd link to a pipe or socket ("pipe:[123]") names
                # no path but opens: it is written through, like /dev/stdout.
                self.through = self.magic = True
                return
            os.close(self.dir_fd)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def open_through(self) -> int:
        flags = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | (0 if self.magic else os.O_NOFOLLOW)
        try:
            return os.open(self.name, flags, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP and not self.magic:
                raise OSError(errno.ELOOP, "became a symbolic link while jaxtop opened it (not followed)",
                              self.path) from None
            raise

    def make_temp(self, prefix: str | None = None, perms: int = 0o666) -> tuple[int, str]:
        """A new file beside the target under a random name (``prefix``, by
        default ``.NAME.``, then 16 random hex digits and ``.tmp``), with the
        mode (and owner, where allowed) of the file it replaces when that one
        is this user's (or we are root), else ``perms`` less the umask, as
        ``open()`` would make it."""
        prefix = f".{self.name[:200]}." if prefix is None else prefix
        for _ in range(100):
            tmp = f"{prefix}{os.urandom(8).hex()}.tmp"
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, perms,
                             dir_fd=self.dir_fd)
            except FileExistsError:
                continue
            old = self.st
            if old is not None and stat.S_ISREG(old.st_mode) and os.geteuid() in (old.st_uid, 0):
                with contextlib.suppress(OSError):
                    os.fchmod(fd, old.st_mode & 0o777)
                    os.fchown(fd, old.st_uid, old.st_gid)
            return fd, tmp
        raise FileExistsError(errno.EEXIST, "no free temporary name", self.path)

    def remove(self, tmp: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=self.dir_fd)

    def rename(self, tmp: str) -> None:
        os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the block runs. One that came just
    before is handled on entry (the Python handler runs as the mask call
    returns), one that comes during it on exit."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _named(exc: OSError, path: str) -> OSError:
    """``exc`` said of ``path``, the name the caller gave, not of a temporary name."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, path)


class replacing:  # noqa: N801 (used as a function: ``with replacing(path) as f``)
    """Write a file whole or not at all: ``with replacing(path, "w") as f``.

    The file is written under a random temporary name beside it and renamed
    over ``path`` when the block ends without an exception; on any failure
    or interrupt the temporary file is removed and ``path`` is left as it
    was. A device, a FIFO or a terminal is written through instead
    (:attr:`through`). The module's docstring says which symbolic links
    are followed.

    Args:
        path: The file.
        mode: ``open()``'s mode for writing (``"wb"``, ``"w"``, ``"w+b"``).
        temp_prefix: how the temporary file's name starts (default
            ``.NAME.``); the rest is random.
        perms: A new file's permission bits, less the umask (``0o600``:
            private to this user).
        **open_kw: more arguments for ``open()`` (``encoding``, ``newline``).

    Raises:
        OSError: the file cannot be written; its ``filename`` is ``path``.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb", temp_prefix: str | None = None,
                 perms: int = 0o666, **open_kw: Any) -> None:
        self.path = os.fspath(path)
        self.mode, self.temp_prefix, self.perms, self.open_kw = mode, temp_prefix, perms, open_kw
        #: Whether the file is written through, not replaced (known on entry).
        self.through: bool | None = None
        self._target: _Target | None = None
        self._tmp: str | None = None
        self._file: IO[Any] | None = None

    def __enter__(self) -> IO[Any]:
        fd = -1
        try:
            self._target = target = _Target(self.path)
            self.through = target.through
            if target.through:
                fd = target.open_through()
            else:
                with _signals_deferred():
                    fd, self._tmp = target.make_temp(self.temp_prefix, self.perms)
            # open() owns the descriptor from here, even when it fails.
            given, fd = fd, -1
            self._file = open(given, self.mode, **self.open_kw)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            self._discard()
            if isinstance(exc, OSError):
                raise _named(exc, self.path) from None
            raise
        return self._file

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self._discard()
            return
        target, file = self._target, self._file
        assert target is not None and file is not None
        try:
            file.close()  # what is still buffered is written here: a full disk fails here
            if self._tmp is not None:
                target.rename(self._tmp)
                self._tmp = None
        except OSError as err:
            self._discard()
            raise _named(err, self.path) from None
        except BaseException:
            self._discard()
            raise
        self._discard()

    def _discard(self) -> None:
        """Close what is open, remove the temporary file if it is still there."""
        target, tmp, file = self._target, self._tmp, self._file
        self._target = self._tmp = self._file = None
        if file is not None:
            with contextlib.suppress(OSError, ValueError):
                file.close()
        if target is not None:
            if tmp is not None:
                target.remove(tmp)
            os.close(target.dir_fd)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` as the whole file ``path``, or leave it as it was
    (:class:`replacing`): a reader never sees half of it.

    Raises:
        OSError: it cannot be written (a full disk: nothing is left behind).
    """
    try:
        with replacing(path) as f:
            f.write(data)
    except OSError as exc:
        if exc.filename is None:  # the write itself failed: say which file
            raise _named(exc, os.fspath(path)) from None
        raise


def create_output(path: str | os.PathLike[str], mode: str = "wb", **open_kw: Any) -> IO[Any]:
    """A new, empty file at ``path``, open for writing as it grows (a
    recording, a spool): made under a random name and renamed over ``path``
    at once, so readers see it from the start. A device, a FIFO or a
    terminal is opened through (truncated, as a shell's ``>`` would).

    Args:
        path: The file.
        mode: ``open()``'s mode (``"wb"``).
        **open_kw: more arguments for ``open()`` (``buffering=0``).

    Raises:
        OSError: it cannot be made; its ``filename`` is ``path``.
    """
    path = os.fspath(path)
    try:
        target = _Target(path)
    except OSError as exc:
        raise _named(exc, path) from None
    fd = -1
    try:
        if target.through:
            fd = target.open_through()
        else:
            with _signals_deferred():  # never a temporary file left by an interrupt
                fd, tmp = target.make_temp()
                try:
                    target.rename(tmp)
                except BaseException:
                    target.remove(tmp)
                    raise
        given, fd = fd, -1  # open() owns the descriptor from here, even when it fails
        return open(given, mode, **open_kw)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        if isinstance(exc, OSError):
            raise _named(exc, path) from None
        raise
    finally:
        os.close(target.dir_fd)


# -- Python children -----------------------------------------------------------------

def python_command(module: str, *args: str, own_env: bool = False) -> list[str]:
    """The command that runs ``python -m module args`` in a child process
    without importing anything from the working directory.

    ``python -m`` (and ``-c``) put the working directory first on
    ``sys.path``: started in a directory others can write (a shared project
    directory, the recording's), the child ran whatever ``numpy.py`` or
    ``json.py`` was there.

    By default the child runs isolated (``-I``: no working or script
    directory on ``sys.path``, no ``PYTHON*`` variables, no user
    site-packages) and is given this process's ``sys.path`` as it is, so it
    imports jaxtop and its dependencies from where this process does
    (installed, editable through the site-packages' finder, on
    ``PYTHONPATH``). Left out: relative entries (``''`` is whatever the
    working directory is) and the working directory itself, unless jaxtop
    itself was imported from it (a checkout the user works in).

    Args:
        module: What ``-m`` would name.
        *args: Its arguments (``sys.argv[1:]``).
        own_env: The child is a program of the user's (the demo workload):
            it reads the ``PYTHON*`` variables of its environment and builds
            its own ``sys.path``, of which only the relative entries go,
            before anything is imported (``os`` and ``sys`` are loaded at
            start-up already).
    """
    if own_env:
        code = ("import os, sys; sys.path[:] = [p for p in sys.path if os.path.isabs(p)]; import runpy; "
                f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
        return [sys.executable, "-c", code, *args]
    jaxtop_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    keep = [p for p in sys.path if isinstance(p, str) and os.path.isabs(p)
            and (os.path.realpath(p) != cwd or os.path.realpath(p) == os.path.realpath(jaxtop_root))]
    code = (f"import sys; sys.path[:] = {keep!r}; import runpy; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-I", "-c", code, *args]
