"""Budgets per line of the program: ``h2d@train.py:27=0``.

A limit whose name is ``DIRECTION@SITE`` (DIRECTION one of ``h2d``, ``d2h``,
``d2d`` or ``transfers``; SITE ``file.py:LINE``, or a longer end of the
path such as ``src/train.py:27``) counts the implicit transfers the agent
attributed to that line (the sample field ``transfer_sites``). Transfers
jaxtop could not tie to a line are not counted against any site: where
there were some in the window and the site stayed within its limit, the
result is n/a (the site may have made them), never a pass.

Pure, and standard library only at import: a spec is parsed here without
the record types, whose part (:class:`~jaxtop.wire.records.TransferSites`,
as last sent: :attr:`jaxtop.budgets.reading.Reading.fields`) the counts
read.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from jaxtop.wire.protocol import DIRECTIONS

if TYPE_CHECKING:
    from jaxtop.wire.records import TransferSite, TransferSites

__all__ = ["SiteName", "parse_site_name", "site_count", "site_detail", "unattributed", "worst_sites"]

_WORDS = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device", "transfers": "all"}


class SiteName:
    """A parsed ``DIRECTION@FILE:LINE``."""

    def __init__(self, direction: str, path: str, line: int) -> None:
        self.direction, self.path, self.line = direction, path, line

    @property
    def about(self) -> str:
        what = "implicit transfers" if self.direction == "transfers" else f"implicit {_WORDS[self.direction]} transfers"
        return f"{what} made at {self.path}:{self.line}"

    def matches(self, site: TransferSite) -> bool:
        """Whether a wire site is this one: same line, the file ending with the path given."""
        if site.line != self.line:
            return False
        if self.direction != "transfers" and site.direction != self.direction:
            return False
        filename = site.file or ""
        if "/" in self.path:
            return filename == self.path or filename.endswith("/" + self.path.lstrip("/"))
        return os.path.basename(filename) == self.path


def parse_site_name(name: str) -> SiteName | None | str:
    """``DIRECTION@FILE:LINE`` parsed; None when ``name`` has no ``@`` (not a
    site limit); a message when it has one but is malformed."""
    if "@" not in name:
        return None
    direction, _, where = name.partition("@")
    direction = direction.strip()
    if direction not in (*DIRECTIONS, "transfers"):
        return f"{direction!r} before '@' is not h2d, d2h, d2d or transfers"
    path, colon, line = where.strip().rpartition(":")
    if not colon or not path or not line.isdigit() or int(line) < 1:
        return f"{where!r} after '@' is not FILE:LINE (e.g. h2d@train.py:27)"
    return SiteName(direction, path, int(line))


def _sites(part: TransferSites | None) -> list[TransferSite] | None:
    """The part's sites; None where no ``transfer_sites`` with sites was sent
    (one with only ``error``, the probe having raised, counts none)."""
    return part.sites if part is not None else None


def site_count(part: TransferSites | None, site: SiteName) -> int | None:
    """Transfers attributed to ``site`` since the agent started (None: no
    ``transfer_sites`` field seen). Sites beyond the agent's top 50 are not
    sent: one of them reads 0 until it climbs into them."""
    sites = _sites(part)
    if sites is None:
        return None
    return sum(int(s.count_total or 0) for s in sites if site.matches(s))


def unattributed(part: TransferSites | None) -> int | None:
    """Transfers the agent could not tie to a line, since it started."""
    if part is None or part.sites is None:
        return None
    counts = part.unattributed
    return sum(int(n) for n in counts.values() if n is not None) if counts is not None else 0


def site_detail(part: TransferSites | None, site: SiteName) -> list[str]:
    """What was transferred there: the function called and its arguments."""
    out = []
    for s in _sites(part) or []:
        if not site.matches(s):
            continue
        args = ", ".join(f"{a.name or '?'}: {a.kind} {a.shape}" for a in s.args or [])
        out.append(f"{s.direction} by {s.callee or '?'} in {s.function or '?'}: "
                   f"{s.count_total} transfer(s)" + (f" of {args}" if args else ""))
    return out


def _site_text(s: TransferSite) -> str:
    args = ", ".join(str(a.name or a.kind) for a in s.args or [])
    where = f"{os.path.basename(s.file or '?')}:{s.line}"
    return f"{where} ({s.callee or '?'}" + (f": {args})" if args else ")")


def worst_sites(start: TransferSites | None, end: TransferSites | None, direction: str,
                n: int = 3) -> list[tuple[int, str]]:
    """The lines that made the most ``direction`` transfers between two
    readings' ``transfer_sites``: ``(count, "train.py:27 (step: batch)")``,
    most first."""
    before: dict[tuple, int] = {}
    for s in _sites(start) or []:
        before[(s.direction, s.file, s.line)] = int(s.count_total or 0)
    ranked = []
    for s in _sites(end) or []:
        if s.direction != direction:
            continue
        count = int(s.count_total or 0) - before.get((s.direction, s.file, s.line), 0)
        if count > 0:
            ranked.append((count, _site_text(s)))
    ranked.sort(key=lambda cs: (-cs[0], cs[1]))
    return ranked[:n]
