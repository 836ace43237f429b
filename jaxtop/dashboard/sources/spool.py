"""A live session's spool on disk: compressed segments of the raw lines,
written as they come and copied back out when the session is saved."""

from __future__ import annotations

import gzip
from typing import IO

from jaxtop.wire import paths

__all__ = ["Spool", "copy_gzip_lines"]


class Spool(gzip.GzipFile):
    """One spool segment: gzip (level 1, cheap) on a new file made as every
    file jaxtop writes (:func:`jaxtop.wire.paths.create_output`); closing it
    closes the file."""

    def __init__(self, path: str) -> None:
        self._raw = paths.create_output(path)
        try:
            super().__init__(fileobj=self._raw, mode="wb", compresslevel=1)
        except BaseException:
            self._raw.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def copy_gzip_lines(src: str, out: IO[bytes], skip: int = 0) -> None:
    """Copy the complete lines of a (possibly still open) gzip spool, after
    the first ``skip`` ones."""
    try:
        with gzip.open(src, "rb") as f:
            while True:
                try:
                    line = f.readline()
                except (EOFError, OSError):
                    break  # the unfinished tail of a stream still being written
                if not line or not line.endswith(b"\n"):
                    break
                if skip:
                    skip -= 1
                    continue
                out.write(line)
    except OSError:
        pass
