"""Where agents put their sockets: one private directory per user."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class SocketDirError(RuntimeError):
    """The socket directory exists but is not safe to use."""


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


def ensure_socket_dir() -> Path:
    """Create the socket directory with mode 0700, or check an existing one.

    Raises:
        SocketDirError: it belongs to another user or is not a directory.
    """
    path = socket_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"{path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise SocketDirError(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            "remove it or set JAXTOP_SOCKET_DIR"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def socket_path(pid: int) -> Path:
    """The socket an agent in process ``pid`` listens on."""
    return socket_dir() / f"{pid}.sock"
