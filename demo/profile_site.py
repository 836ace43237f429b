"""The top allocation site in the demo's own code, read from a device
memory profile: what the profiling strategy shows."""

from __future__ import annotations

import gzip
import inspect
import os

from jaxtop.demo import strategies as strategies_module

_STRATEGIES_FILE = os.path.realpath(strategies_module.__file__)


def demo_site(path: str | None) -> tuple[str, int] | None:
    """The frame of the strategies' code that allocated the most live bytes.

    The probe's top site is the innermost frame outside jax; in the demo's
    workload that can be the bootstrap that started the process, which says
    nothing. The innermost frame in ``strategies.py`` is the one a user
    reading that file can act on.

    Args:
        path: a profile :func:`~jaxtop.probes.memory_profile.take_profile` saved.

    Returns:
        ("Class.function (strategies.py:LINE)", bytes), or None when no live
        buffer was allocated there (or the file cannot be read).
    """
    from jaxtop.probes.memory_profile import ProfileDecodeError, decode_profile

    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        profile = decode_profile(data)
    except (OSError, EOFError, ProfileDecodeError):
        return None
    bytes_i = next((i for i, (kind, unit) in enumerate(profile.sample_types) if kind == "space" or unit == "bytes"), None)
    if bytes_i is None:
        return None
    ours: dict[int, bool] = {}  # function id -> in strategies.py
    per_site: dict[tuple[str, int], int] = {}
    for sample in profile.samples:
        nbytes = sample.values[bytes_i] if bytes_i < len(sample.values) else 0
        if nbytes <= 0:
            continue
        site = None
        for loc_id in sample.location_ids:  # innermost first
            for func_id, line in profile.locations.get(loc_id, ()):
                if func_id not in ours:
                    filename = profile.functions.get(func_id, ("", ""))[1]
                    ours[func_id] = bool(filename) and os.path.realpath(filename) == _STRATEGIES_FILE
                if ours[func_id]:
                    site = (profile.functions[func_id][0], line)
                    break
            if site:
                break
        if site:
            per_site[site] = per_site.get(site, 0) + nbytes
    if not per_site:
        return None
    (function, line), nbytes = max(per_site.items(), key=lambda item: (item[1], -item[0][1]))
    owner = _class_at(line)
    return f"{owner + '.' if owner else ''}{function} (strategies.py:{line})", nbytes


def _class_at(line: int) -> str | None:
    """The strategy class whose source holds ``line`` of strategies.py."""
    for cls in vars(strategies_module).values():
        if inspect.isclass(cls) and cls.__module__ == strategies_module.__name__:
            try:
                lines, start = inspect.getsourcelines(cls)
            except (OSError, TypeError):
                continue
            if start <= line < start + len(lines):
                return cls.__name__
    return None
