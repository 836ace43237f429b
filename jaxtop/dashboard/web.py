"""The dashboard in a browser (``jaxtop serve``): what is written on the
server in a terminal is delivered to the browser as a download instead.

``w`` writes the session to a temporary file, hands it to the browser
(``App.deliver_binary``) and removes it once delivered; a memory profile
(``s``) is written by the program where it runs, and each new one is
delivered when its reply arrives. In a terminal none of this runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

__all__ = ["WebDeliveries"]


class WebDeliveries:
    """What the browser has been sent, per app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent_profiles: set[str] = set()
        self._tmp: str | None = None

    @property
    def active(self) -> bool:
        return bool(getattr(self.app, "is_web", False))

    def session_dir(self) -> str:
        """Where ``w`` writes before the file goes to the browser (private, made on first use)."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="jaxtop-serve-")
        return self._tmp

    def deliver(self, paths: list[str]) -> None:
        """Send written files to the browser as downloads."""
        for path in paths:
            self.app.deliver_binary(path, save_filename=os.path.basename(path), open_method="download",
                                    mime_type="application/x-ndjson" if path.endswith(".jsonl") else None)

    def on_snapshot(self, snap: Any) -> None:
        """A memory profile that arrived since the last snapshot goes to the browser."""
        for proc in snap.processes:
            profile = proc.last_profile
            path = getattr(profile, "path", None) if profile is not None else None
            if path and path not in self.sent_profiles and os.path.isfile(path):
                self.sent_profiles.add(path)
                self.app.deliver_binary(path, save_filename=os.path.basename(path), open_method="download")

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
