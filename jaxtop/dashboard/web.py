"""The dashboard in a browser (``jaxtop serve``): what is written on the
server in a terminal is delivered to the browser as a download instead.

Only files that this dashboard made this session go to the browser, from a
private directory it creates (mode 0700, removed with the app): ``w`` writes
the session there; ``s`` asks the agent to write its memory profile there,
and the profile is sent when the reply arrives. A reply names its file by
path, and a reply may come from a recording (``jaxtop serve replay``) or
from a program that was asked nothing: a path outside that directory, a
link, a file not of ours, or a reply nobody asked for is never sent, so a
recording that names ``~/.ssh/id_rsa`` cannot make the server hand it to
the browser. In a terminal none of this runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from typing import Any, BinaryIO

__all__ = ["WebDeliveries", "whole_packet_writes"]


def whole_packet_writes(driver: Any) -> None:
    """Make the web driver write each packet whole, one at a time.

    Textual's web driver sends its packets (screen updates, file chunks) to
    the server with a bare ``os.write`` on stdout, from two threads: the
    app's, and its input thread, which answers the server's requests for the
    next chunk of a delivered file. A packet larger than a pipe writes
    atomically (4 KiB) can then interleave with another, and ``os.write``
    may write only part of one; textual-serve then fails to decode the
    stream ("More data expected"), drops the app, and the download never
    arrives (CI saw ``w`` deliver nothing while its status line redrew).
    Installed once, before the first delivery; a driver without those
    attributes (another Textual) is left alone."""
    if getattr(driver, "_jaxtop_whole_writes", False):
        return
    fileno = getattr(driver, "fileno", None)
    if not isinstance(fileno, int) or not callable(getattr(driver, "_write", None)):
        return
    lock = threading.Lock()

    def write(data: bytes) -> None:
        view = memoryview(data)
        with lock:
            while view:
                view = view[os.write(fileno, view):]

    driver._write = write
    driver._jaxtop_whole_writes = True


class WebDeliveries:
    """What the browser has been sent, per app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent_profiles: set[str] = set()
        self._tmp: str | None = None
        self._profiles_asked = 0  # profiles requested by this dashboard and not yet delivered

    @property
    def active(self) -> bool:
        return bool(getattr(self.app, "is_web", False))

    def session_dir(self) -> str:
        """Where ``w`` and ``s`` write before a file goes to the browser (private, made on first use)."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="jaxtop-serve-")
        return self._tmp

    def profile_args(self) -> dict[str, Any]:
        """The ``memory_profile`` command's arguments: in a browser, write
        into :meth:`session_dir` (the only place a profile is sent from)."""
        return {"directory": self.session_dir()} if self.active else {}

    def profile_requested(self) -> None:
        """This dashboard asked for a memory profile: the next one that
        arrives in :meth:`session_dir` may go to the browser."""
        if self.active:
            self._profiles_asked += 1

    def _open_own(self, path: str) -> BinaryIO | None:
        """``path`` opened for reading if it is a regular file of ours directly
        in :meth:`session_dir`, not a link; else None."""
        if self._tmp is None or not isinstance(path, str) or not os.path.isabs(path):
            return None
        if os.path.realpath(os.path.dirname(path)) != os.path.realpath(self._tmp):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")

    def deliver(self, paths: list[str]) -> None:
        """Send files written by ``w`` in :meth:`session_dir` to the browser as downloads."""
        for path in paths:
            f = self._open_own(path)
            if f is None:
                continue
            whole_packet_writes(getattr(self.app, "_driver", None))
            self.app.deliver_binary(f, save_filename=os.path.basename(path), open_method="download",
                                    mime_type="application/x-ndjson" if path.endswith(".jsonl") else None)

    def on_snapshot(self, snap: Any) -> None:
        """A memory profile this dashboard asked for, written in
        :meth:`session_dir`, goes to the browser once."""
        if not self._profiles_asked:
            return
        for proc in snap.processes:
            profile = proc.last_profile
            path = getattr(profile, "path", None) if profile is not None else None
            if not path or path in self.sent_profiles:
                continue
            f = self._open_own(path)
            if f is None:
                continue
            self.sent_profiles.add(path)
            self._profiles_asked -= 1
            whole_packet_writes(getattr(self.app, "_driver", None))
            self.app.deliver_binary(f, save_filename=os.path.basename(path), open_method="download")
            if not self._profiles_asked:
                return

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
