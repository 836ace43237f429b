"""Census files: where they go, what they are called, and writing one so
that a reader never sees half of it."""

from __future__ import annotations

import os
import re
import time

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FILE_NAME", "census_directory", "write_census"]

#: The census file's name: ``jaxtop-oom-PID-YYYYmmdd-HHMMSS[-N].json``.
FILE_NAME = re.compile(r"jaxtop-oom-\d+-\d{8}-\d{6}(?:-\d+)?\.json")

def census_directory() -> str:
    """Where census files go: ``$JAXTOP_OOM_DIR``, else the working directory."""
    env = os.environ.get("JAXTOP_OOM_DIR")
    try:
        return os.path.abspath(env) if env else os.getcwd()
    except OSError:
        return env or "."


def write_census(census: dict[str, Any], directory: str | None = None, path: str | None = None) -> str:
    """Write a census as JSON: a new ``jaxtop-oom-PID-TIME.json`` in
    ``directory`` (default :func:`census_directory`), or over ``path``.

    Written beside under a random name and renamed, so a reader never sees
    half a census, and a link someone planted at its name is replaced, not
    written through (:func:`jaxtop.wire.paths.write_atomic`).

    Returns:
        The file's path.

    Raises:
        OSError: the file cannot be written.
    """
    import json

    if path is None:
        directory = directory or census_directory()
        os.makedirs(directory, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(census.get("t") or time.time()))
        base = os.path.join(directory, f"jaxtop-oom-{census.get('pid', os.getpid())}-{stamp}")
        path = f"{base}.json"
        n = 1
        while os.path.exists(path):
            path = f"{base}-{n}.json"
            n += 1
    text = json.dumps(census, indent=1, default=str, allow_nan=False) + "\n"
    from jaxtop.wire.paths import write_atomic

    write_atomic(path, text.encode("utf-8"))
    return path
