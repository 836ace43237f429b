"""``jaxtop demo --headless``: every strategy off then on, as a table."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from jaxtop.demo.metrics import fmt_metric


def _change(row: dict[str, Any]) -> str:
    off, on = row.get("off"), row.get("on")
    if off is None or on is None:
        return ""
    if off == 0:
        return "new" if on else "="
    return f"{(on - off) / abs(off):+.0%}"


def print_table(rows: list[dict[str, Any]], backend: str, out: TextIO = sys.stdout) -> None:
    head = ("strategy", "metric", "off", "on", "change", "expected", "moved as expected")
    table = [head]
    for r in rows:
        variants = r.get("variants") or ["off", "on"]
        if r.get("na"):
            table.append((r["strategy"], r["metric"], "", "", "", r.get("expect") or "", r["na"]))
            continue
        ok = {True: "yes", False: "NO", None: "(informational)"}[r.get("ok")]
        metric = r["metric"] if variants == ["off", "on"] else f"{r['metric']} ({variants[0]} → {variants[1]})"
        note = f"  {r['note']}" if r.get("note") else ""
        table.append((r["strategy"], metric, fmt_metric(r.get("off"), r.get("unit", ""), "-", precise=True),
                      fmt_metric(r.get("on"), r.get("unit", ""), "-", precise=True),
                      _change(r), r.get("expect") or "", ok + note))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head) - 1)]
    print(f"jaxtop demo --headless on {backend}", file=out)
    for i, row in enumerate(table):
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths)]
        print("  ".join(cells) + "  " + str(row[-1]), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 17, file=out)


def run(steps: int, as_json: bool, small: bool, profile_dir: str | None = None) -> int:
    import jaxtop

    handle = jaxtop.instrument()
    import jax

    jax.numpy.zeros(()).block_until_ready()
    from jaxtop.demo.runner import DemoRunner

    runner = DemoRunner(handle.agent, small=small)
    rows = runner.run_all(steps=steps, profile_dir=profile_dir)
    if as_json:
        json.dump({"backend": runner.backend, "steps": steps, "scale": runner.scale.__dict__, "rows": rows}, sys.stdout, indent=1)
        print()
    else:
        print_table(rows, runner.backend)
    failed = [r for r in rows if r.get("ok") is False]
    return 1 if failed else 0
