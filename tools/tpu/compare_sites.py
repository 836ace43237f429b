#!/usr/bin/env python
"""jaxtop's implicit transfers per line against JAX's own guard, on one run each.

    python tools/tpu/compare_sites.py RECORDING.jsonl[.gz] ORACLE.json

RECORDING is a ``jaxtop run --log`` of a program, ORACLE the JSON of
``tests/transfer_oracle.py --json-out`` on the same program and arguments.
Prints one row per (file, line, direction) with both counts and exits 1
where they differ or a transfer was left unattributed.
"""

from __future__ import annotations

import gzip
import json
import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    recording, oracle_path = argv
    opener = gzip.open if recording.endswith(".gz") else open
    field = None
    with opener(recording, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "sample" and record.get("transfer_sites"):
                field = record["transfer_sites"]
    if field is None:
        print("the recording has no transfer_sites field", file=sys.stderr)
        return 1
    ours: dict[tuple[str, int, str], int] = {}
    for site in field["sites"]:
        key = (os.path.basename(site["file"]), site["line"], site["direction"])
        ours[key] = ours.get(key, 0) + site["count_total"]
    with open(oracle_path) as f:
        oracle = {(r["file"], r["line"], r["direction"]): r["count"] for r in json.load(f)["lines"]}
    differ = 0
    print(f"{'line':<28} {'dir':<4} {'jaxtop':>7} {'oracle':>7}")
    for key in sorted(set(ours) | set(oracle)):
        mark = "" if ours.get(key) == oracle.get(key) else "  <- differs"
        differ += bool(mark)
        print(f"{key[0] + ':' + str(key[1]):<28} {key[2]:<4} {ours.get(key, 0):>7} {oracle.get(key, 0):>7}{mark}")
    print(f"unattributed: {field['unattributed'] or 0} {field.get('unattributed_reasons') or ''}")
    return 1 if differ or field["unattributed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
