"""Budgets per line of the program: ``h2d@train.py:27=0``.

A limit whose name is ``DIRECTION@SITE`` (DIRECTION one of ``h2d``, ``d2h``,
``d2d`` or ``transfers``; SITE ``file.py:LINE``, or a longer end of the
path such as ``src/train.py:27``) counts the implicit transfers the agent
attributed to that line (the sample field ``transfer_sites``). Transfers
jaxtop could not tie to a line are not counted against any site: where
there were some in the window and the site stayed within its limit, the
result is n/a (the site may have made them), never a pass.

Pure and standard library only.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from jaxtop.wire.protocol import DIRECTIONS

__all__ = ["SITE_FIELD", "SiteName", "parse_site_name", "site_count", "site_detail", "unattributed", "worst_sites"]

#: The sample field the counts come from.
SITE_FIELD = "transfer_sites"
_WORDS = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device", "transfers": "all"}


class SiteName:
    """A parsed ``DIRECTION@FILE:LINE``."""

    def __init__(self, direction: str, path: str, line: int) -> None:
        self.direction, self.path, self.line = direction, path, line

    @property
    def about(self) -> str:
        what = "implicit transfers" if self.direction == "transfers" else f"implicit {_WORDS[self.direction]} transfers"
        return f"{what} made at {self.path}:{self.line}"

    def matches(self, site: Mapping[str, Any]) -> bool:
        """Whether a wire site is this one: same line, the file ending with the path given."""
        if site.get("line") != self.line:
            return False
        if self.direction != "transfers" and site.get("direction") != self.direction:
            return False
        filename = str(site.get("file") or "")
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


def _field(fields: Mapping[str, Any]) -> dict[str, Any] | None:
    value = fields.get(SITE_FIELD)
    return value if isinstance(value, dict) and isinstance(value.get("sites"), list) else None


def site_count(fields: Mapping[str, Any], site: SiteName) -> int | None:
    """Transfers attributed to ``site`` since the agent started (None: no
    ``transfer_sites`` field seen). Sites beyond the agent's top 50 are not
    sent: one of them reads 0 until it climbs into them."""
    value = _field(fields)
    if value is None:
        return None
    return sum(int(s.get("count_total") or 0) for s in value["sites"] if isinstance(s, dict) and site.matches(s))


def unattributed(fields: Mapping[str, Any]) -> int | None:
    """Transfers the agent could not tie to a line, since it started."""
    value = _field(fields)
    if value is None:
        return None
    counts = value.get("unattributed")
    return sum(int(n) for n in counts.values() if isinstance(n, int)) if isinstance(counts, dict) else 0


def site_detail(fields: Mapping[str, Any], site: SiteName) -> list[str]:
    """What was transferred there: the function called and its arguments."""
    value = _field(fields)
    out = []
    for s in (value or {}).get("sites", []):
        if not isinstance(s, dict) or not site.matches(s):
            continue
        args = ", ".join(f"{a.get('name') or '?'}: {a.get('kind')} {a.get('shape')}" for a in s.get("args") or []
                         if isinstance(a, dict))
        out.append(f"{s.get('direction')} by {s.get('callee') or '?'} in {s.get('function') or '?'}: "
                   f"{s.get('count_total')} transfer(s)" + (f" of {args}" if args else ""))
    return out


def _site_text(s: Mapping[str, Any]) -> str:
    args = ", ".join(str(a.get("name") or a.get("kind")) for a in s.get("args") or [] if isinstance(a, dict))
    where = f"{os.path.basename(str(s.get('file') or '?'))}:{s.get('line')}"
    return f"{where} ({s.get('callee') or '?'}" + (f": {args})" if args else ")")


def worst_sites(start: Mapping[str, Any] | None, end: Mapping[str, Any], direction: str,
                n: int = 3) -> list[tuple[int, str]]:
    """The lines that made the most ``direction`` transfers between two
    readings' fields: ``(count, "train.py:27 (step: batch)")``, most first."""
    before: dict[tuple, int] = {}
    for s in (_field(start or {}) or {}).get("sites", []):
        if isinstance(s, dict):
            before[(s.get("direction"), s.get("file"), s.get("line"))] = int(s.get("count_total") or 0)
    ranked = []
    for s in (_field(end) or {}).get("sites", []):
        if not isinstance(s, dict) or s.get("direction") != direction:
            continue
        count = int(s.get("count_total") or 0) - before.get((s.get("direction"), s.get("file"), s.get("line")), 0)
        if count > 0:
            ranked.append((count, _site_text(s)))
    ranked.sort(key=lambda cs: (-cs[0], cs[1]))
    return ranked[:n]
