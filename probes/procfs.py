"""``Key:   123 kB`` lines of Linux procfs files (``/proc/PID/status``,
``/proc/meminfo``), read into figures.

No import at all: the stderr relay (started without ``site``) imports the
OOM census's parts, which read these files too.
"""

from __future__ import annotations

__all__ = ["proc_fields"]


def proc_fields(text: bytes, keys: tuple[str, ...]) -> dict[str, int]:
    """The lines of a procfs file's text among ``keys``: a figure in kB in
    bytes, one without a unit (``Threads:``) as it is; a key not there, or
    not followed by a number, is left out."""
    out: dict[str, int] = {}
    for raw in text.split(b"\n"):
        name, sep, rest = raw.partition(b":")
        if not sep:
            continue
        key = name.decode("ascii", "replace")
        if key in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == b"kB" else 1)
    return out
