"""Whether a line passes the same value every call or new data: the agent
compares two calls' arguments it reads (a NumPy array by object and a hash
of up to 4,096 evenly spread elements; a scalar by value), and the wire,
the T screen and the advice say which.

Pure (the token, the comparison), then a real program under ``jaxtop run``.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np

from conftest import PY, TARGETS
from jaxtop.probes.transfer_site import Site
from jaxtop.probes.transfer_values import NUMPY, ArgInfo, describe_value, token_of


def _described(value) -> ArgInfo:
    out: list[ArgInfo] = []
    describe_value("x", value, np, None, out)
    (arg,) = out
    return arg


def test_an_array_refilled_in_place_is_not_the_same_value():
    a = np.zeros((64, 64), np.float32)
    first = token_of(a, np)
    assert token_of(a, np) == first  # read again: the same
    a[:] = 1
    assert token_of(a, np) != first  # the same object, other contents
    assert token_of(np.zeros((64, 64), np.float32), np) != first  # another object


def test_a_large_array_is_sampled_and_a_change_among_the_samples_is_seen():
    a = np.zeros(1_000_000, np.float32)
    first = token_of(a, np)
    a[-1] = 5.0  # the last element is always among those read
    assert token_of(a, np) != first


def test_no_token_where_reading_could_run_the_programs_code():
    class Mine(np.ndarray):
        def __getitem__(self, key):  # the program's code: never run for a token
            raise AssertionError("ran the program's __getitem__")

    assert token_of(np.zeros(4).view(Mine), np) is None
    assert token_of(np.array([object()], dtype=object), np) is None


def test_a_site_says_whether_its_value_was_the_same_as_at_the_call_read_before():
    site = Site()
    fixed = np.ones(8, np.float32)
    site.merge((_described(fixed),), False, 1.0, "step")
    assert site.args[0].same is None  # one call read: unknown
    site.merge((_described(fixed),), False, 2.0, "step")
    assert site.args[0].same is True and site.args[0].wire()["same"] is True
    site.merge((_described(np.ones(8, np.float32) * 2),), False, 3.0, "step")
    assert site.args[0].same is False
    site.merge((_described(3),), False, 4.0, "step")  # a scalar now: another kind, nothing to compare
    assert site.args[0].same is None and "same" not in site.args[0].wire()
    site.merge((_described(3),), False, 5.0, "step")
    assert site.args[0].same is True
    assert _described(fixed).kind == NUMPY


def test_the_same_array_new_data_and_a_refilled_buffer_on_the_wire(child_env, tmp_path):
    script = TARGETS / "same_or_new.py"
    lines = {text.rsplit("# ", 1)[1]: i for i, text in enumerate(script.read_text().splitlines(), 1) if "  # " in text
             and text.rstrip().endswith(("SAME", "NEW", "REFILLED"))}
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "4"],
                          cwd=TARGETS, env=child_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    same = {}
    with open(log, "rb") as f:
        for raw in f:
            for site in (json.loads(raw).get("transfer_sites") or {}).get("sites") or ():
                for arg in site.get("args") or ():
                    if arg.get("same") is not None:
                        same[site["line"]] = arg["same"]
    assert same.get(lines["SAME"]) is True and same.get(lines["NEW"]) is False \
        and same.get(lines["REFILLED"]) is False, (same, lines)
