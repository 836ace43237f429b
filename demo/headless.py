"""``jaxtop demo --headless``: every strategy's variants measured, as a table.

``python -m jaxtop.demo.headless --markdown < run.json`` turns the output of
``jaxtop demo --headless --json`` into the Markdown table of
docs/strategies.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any, TextIO

from jaxtop.demo.metrics import fmt_metric, fmt_spread, within_text


def _change(row: dict[str, Any]) -> str:
    off, on = row.get("off"), row.get("on")
    if off is None or on is None:
        return ""
    if off == 0:
        return "new" if on else "="
    return f"{(on - off) / abs(off):+.0%}"


#: The table's columns; "spread" is empty for an exact metric (a count, a
#: size from XLA), which repeats to the unit from run to run.
HEAD = ("strategy", "metric", "off", "on", "change", "spread", "expected", "moved as expected")


def _cells(r: dict[str, Any], missing: str = "-") -> tuple[str, ...]:
    """One row's cells, in the order of :data:`HEAD`."""
    variants = r.get("variants") or ["off", "on"]
    if r.get("na"):
        return (r["strategy"], r["metric"], "", "", "", "", r.get("expect") or "", r["na"])
    unit = r.get("unit", "")
    if r.get("ok") is None and r.get("within_spread"):
        ok = within_text(r.get("spread"), unit, precise=True)
    elif r.get("ok") is None and r.get("nothing_to_lower"):
        ok = "no change needed"
    else:
        ok = {True: "yes", False: "NO", None: "(informational)"}[r.get("ok")]
    metric = r["metric"] if variants == ["off", "on"] or None in variants else f"{r['metric']} ({variants[0]} → {variants[1]})"
    note = f" ({r['note']})" if r.get("note") else ""
    return (r["strategy"], metric, fmt_metric(r.get("off"), unit, missing, precise=True),
            fmt_metric(r.get("on"), unit, missing, precise=True),
            _change(r), fmt_spread(r.get("spread"), unit, precise=True), r.get("expect") or "", ok + note)


def print_table(rows: list[dict[str, Any]], backend: str, out: TextIO = sys.stdout) -> None:
    table = [HEAD] + [_cells(r) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(HEAD) - 1)]
    print(f"jaxtop demo --headless on {backend}", file=out)
    for i, row in enumerate(table):
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths)]
        print("  ".join(cells) + "  " + str(row[-1]), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * len(HEAD[-1]), file=out)


def markdown_table(data: dict[str, Any]) -> str:
    """The JSON of ``--headless --json`` as a Markdown table, with its provenance."""
    about = data.get("run") or {}
    lines = [
        f"`{about.get('command', 'jaxtop demo --headless')}` on {about.get('machine', '?')}, "
        f"jax {about.get('jax', '?')} ({data.get('backend')} backend), {about.get('date', '?')}; "
        f"{data.get('steps')} measured steps per variant, {about.get('seconds', 0):.0f} s in all including compiling:",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
    ]
    for r in data.get("rows") or []:
        cells = [c.replace("|", "\\|") for c in _cells(r, missing="–")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _profile_dir(given: str | None) -> str | None:
    """Where the profiling strategy saves its profile: ``given`` or
    ``$JAXTOP_PROFILE_DIR`` (the runner reads it), else jaxtop's own private
    directory, not the working directory the runner falls back to (every
    ``--headless`` run left a ``jaxtop-memprof-*.prof`` in the user's
    project). The table's profiling row names the file either way."""
    if given or os.environ.get("JAXTOP_PROFILE_DIR"):
        return given
    from jaxtop.probes.memory_profile import ProfileDirError, private_profile_dir

    try:
        return private_profile_dir()
    except ProfileDirError as exc:
        fallback = tempfile.mkdtemp(prefix="jaxtop-demo-")  # mode 0700, new: private too
        print(f"jaxtop demo: {exc}; the profile goes to {fallback}", file=sys.stderr)
        return fallback


def run(steps: int, as_json: bool, small: bool, profile_dir: str | None = None) -> int:
    started = time.monotonic()
    import jaxtop

    handle = jaxtop.instrument()
    import jax

    jax.numpy.zeros(()).block_until_ready()
    from jaxtop.demo.runner import DemoRunner

    runner = DemoRunner(handle.agent, small=small, steps=steps, profile_dir=_profile_dir(profile_dir))
    rows = runner.run_all()
    if as_json:
        command = "jaxtop demo --headless --json" + (" --small" if small else "") + f" --steps {steps}"
        run_info = {"command": command, "date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
                    "machine": f"{_cpu_model()}, {_cpus()} CPUs, {platform.system()} {platform.release()}",
                    "seconds": time.monotonic() - started}
        json.dump({"backend": runner.backend, "steps": steps, "scale": runner.scale.__dict__, "run": run_info,
                   "rows": rows}, sys.stdout, indent=1)
        print()
    else:
        print_table(rows, runner.backend)
    failed = [r for r in rows if r.get("ok") is False]
    return 1 if failed else 0


def _cpu_model() -> str:
    """The processor's name where Linux tells it, else the architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "?"


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Turn `jaxtop demo --headless --json` output into Markdown.")
    parser.add_argument("--markdown", action="store_true", required=True, help="read the JSON on stdin, write Markdown")
    parser.parse_args(argv)
    sys.stdout.write(markdown_table(json.load(sys.stdin)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
