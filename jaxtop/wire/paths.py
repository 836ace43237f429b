"""Where agents put their sockets: one private directory per user.

The directory is trusted only while it is private: a real directory (not a
symbolic link), owned by the current uid, that nobody else may write. Its
default name, ``/tmp/jaxtop-$UID``, can be taken first by anyone; whoever
owns the directory decides which "agents" a client sees and receives their
commands. So the agent (:func:`ensure_socket_dir`) refuses a directory that is
not private and the clients (:func:`check_socket_dir`) refuse one that others
could have written to. Neither ever chmods or chowns a directory jaxtop did
not create: an explicit ``$JAXTOP_SOCKET_DIR`` that is shared (a project
directory, ``/tmp`` itself) is refused, not made private.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
