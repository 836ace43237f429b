"""`jaxtop export`: CSV rows and the Perfetto trace-event structure."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
from pathlib import Path

import pytest

from conftest import PY
from jaxtop.wire import protocol
from jaxtop.export import convert, formats as export

FIXTURES = Path(__file__).parent / "fixtures"


def samples_of(path):
    return [json.loads(l) for l in path.read_bytes().splitlines() if json.loads(l)["type"] == "sample"]


@pytest.mark.parametrize("name", ["synthetic_gpu.jsonl", "cpu_train_loop.jsonl"])
def test_csv_has_one_row_per_sample_and_device(name):
    path = FIXTURES / name
    out = io.StringIO()
    stats = export.write_csv(str(path), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    samples = samples_of(path)
    assert stats.malformed == 0
    assert list(rows[0].keys()) == list(export.CSV_COLUMNS)
    assert len(rows) == sum(max(1, len(s["devices"])) for s in samples)
    # Values come straight from the sample: check the last one, device by device.
    last = samples[-1]
    tail = rows[-max(1, len(last["devices"])):]
    for row, dev in zip(tail, last["devices"] or [{}]):
        assert row["seq"] == str(last["seq"])
        assert row["device_id"] == ("" if not dev else str(dev["id"]))
        assert row["bytes_in_use"] == ("" if dev.get("bytes_in_use") is None else str(dev["bytes_in_use"]))
        assert row["h2d_count_total"] == str(last["transfers"]["h2d"]["count_total"])
        assert row["rss_bytes"] == str(last["process"]["rss_bytes"])


def test_missing_values_are_empty_cells_not_zero():
    path = FIXTURES / "cpu_train_loop.jsonl"
    out = io.StringIO()
    export.write_csv(str(path), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    cpu_rows = [r for r in rows if r["platform"] == "cpu"]
    assert cpu_rows and all(r["fragmentation"] == "" and r["pool_bytes"] == "" for r in cpu_rows)


def validate_trace(doc):
    """The parts of the trace-event format that Perfetto relies on."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    last_ts = {}
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("M", "C", "i"), ev
        assert isinstance(ev["name"], str) and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "M":
            assert ev["name"] == "process_name" and isinstance(ev["args"]["name"], str)
            continue
        assert isinstance(ev["ts"], int)
        if ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
            # Each counter track moves forward in time.
            key = (ev["pid"], ev["name"])
            assert ev["ts"] >= last_ts.get(key, 0)
            last_ts[key] = ev["ts"]
        else:
            assert ev["s"] in ("g", "p", "t")
    return doc


def test_perfetto_trace_is_well_formed_with_counters_and_instants():
    out = io.StringIO()
    export.write_perfetto(str(FIXTURES / "synthetic_gpu.jsonl"), out)
    doc = validate_trace(json.loads(out.getvalue()))
    names = {ev["name"] for ev in doc["traceEvents"]}
    assert {"device 0 memory (bytes)", "device 1 memory (bytes)", "device 0 fragmentation",
            "implicit transfers/s", "host RSS (bytes)"} <= names
    mem = [ev for ev in doc["traceEvents"] if ev["name"] == "device 0 memory (bytes)"]
    first = samples_of(FIXTURES / "synthetic_gpu.jsonl")[0]
    assert mem[0]["args"]["bytes_in_use"] == first["devices"][0]["bytes_in_use"]
    assert mem[0]["ts"] == round(first["t"] * 1e6)


def test_perfetto_marks_compiles_as_instant_events():
    out = io.StringIO()
    export.write_perfetto(str(FIXTURES / "cpu_train_loop.jsonl"), out)
    doc = validate_trace(json.loads(out.getvalue()))
    samples = samples_of(FIXTURES / "cpu_train_loop.jsonl")
    totals = [s["compile"]["count_total"] for s in samples]
    rises = sum(1 for a, b in zip(totals, totals[1:]) if b > a)
    compiles = [ev for ev in doc["traceEvents"] if ev["ph"] == "i" and ev["name"].startswith("compile")]
    assert rises > 0 and len(compiles) == rises


def test_cli_export_truncated_file_and_gzip(tmp_path):
    import gzip

    src = (FIXTURES / "synthetic_gpu.jsonl").read_bytes()
    cut = tmp_path / "cut.jsonl"
    lines = src.splitlines(keepends=True)
    last_sample = max(i for i, l in enumerate(lines) if b'"type":"sample"' in l)
    cut.write_bytes(b"".join(lines[: last_sample + 1])[:-40])  # a killed writer: half a sample at the end
    res = subprocess.run([PY, "-m", "jaxtop", "export", cut, "--format", "csv"], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert b"truncated" in res.stderr
    rows = list(csv.DictReader(open(tmp_path / "cut.csv")))
    assert len(rows) == 2 * (len(samples_of(FIXTURES / "synthetic_gpu.jsonl")) - 1)

    gz = tmp_path / "session.jsonl.gz"
    gz.write_bytes(gzip.compress(src))
    res = subprocess.run([PY, "-m", "jaxtop", "export", gz, "--format", "perfetto"], capture_output=True)
    assert res.returncode == 0, res.stderr
    validate_trace(json.loads((tmp_path / "session.perfetto.json").read_text()))


def test_cli_export_missing_file():
    res = subprocess.run([PY, "-m", "jaxtop", "export", "/nonexistent.jsonl", "--format", "csv"], capture_output=True)
    assert res.returncode == 2 and b"no such file" in res.stderr


def test_cli_export_jobs(tmp_path):
    # Big enough to be split: two processes to stdout, one to a file.
    path = tmp_path / "big.jsonl"
    varied_recording(path, repeat=3)
    assert path.stat().st_size > convert.PARALLEL_MIN_BYTES
    one = subprocess.run([PY, "-m", "jaxtop", "export", path, "--format", "perfetto", "-j", "1"], capture_output=True)
    two = subprocess.run([PY, "-m", "jaxtop", "export", path, "--format", "perfetto", "-j", "2", "-o", "-"],
                         capture_output=True)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    assert two.stdout == (tmp_path / "big.perfetto.json").read_bytes()
    assert b"2 malformed" in two.stderr and b"truncated" in two.stderr
    bad = subprocess.run([PY, "-m", "jaxtop", "export", path, "--format", "csv", "-j", "0"], capture_output=True)
    assert bad.returncode == 2 and b"--jobs must be at least 1" in bad.stderr


# ------------------------------------------------------------ parallel export

def varied_recording(path: Path, second_hello_at: int | None = None, repeat: int = 1) -> None:
    """A hello and 3,000 samples from the fixtures with other numbers, a
    malformed line, a blank line and a line that is not UTF-8 along the way,
    maybe a second hello, and a truncated last line."""
    lines = (FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines()
    hello, samples = json.loads(lines[0]), [json.loads(line) for line in lines if '"sample"' in line[:20]]
    out = [json.dumps(hello)]
    for k in range(3000 * repeat):
        rec = dict(samples[k % len(samples)])
        rec["t"] = hello["t"] + 1 + k * 0.1
        rec["seq"] = k
        rec["compile"] = dict(rec.get("compile") or {}, count_total=k // 400)
        out.append(json.dumps(rec, separators=(",", ":")))
        if k == 1700:
            out += ['{"type":"sample","t":', ""]
        if k == second_hello_at:
            out.append(json.dumps(dict(hello, pid=4242, t=rec["t"])))
    data = "\n".join(out).encode() + b"\n\xff\xfe\n" + b'{"type":"sample","t":1'
    path.write_bytes(data)


@pytest.mark.parametrize("second_hello_at", [None, 1200])
def test_parallel_export_writes_what_one_pass_writes(tmp_path, monkeypatch, second_hello_at):
    path = tmp_path / "rec.jsonl"
    varied_recording(path, second_hello_at)
    monkeypatch.setattr(convert, "PARALLEL_MIN_BYTES", 0)
    assert len(convert.pieces(str(path), 3)) == 3
    redone: list[bool] = []
    finish = convert.Piece.finish

    def spy(self, *args):
        lines = finish(self, *args)
        redone.append(self.redone)
        return lines

    monkeypatch.setattr(convert.Piece, "finish", spy)
    for write in (export.write_csv, export.write_perfetto):
        for fast in (True, False):
            one, par = io.StringIO(), io.StringIO()
            s1 = write(str(path), one, fast=fast, jobs=1)
            redone.clear()
            s3 = write(str(path), par, fast=fast, jobs=3)
            assert par.getvalue() == one.getvalue(), (write.__name__, fast)
            assert (s3.records, s3.malformed, s3.truncated, s3.errors) == (s1.records, s1.malformed, s1.truncated, s1.errors)
            assert s1.malformed == 2 and s1.truncated
            # A piece is converted again only when its guessed start state
            # was wrong: after a second hello (the pid changed).
            assert redone == [False, second_hello_at is not None], redone


def test_parallel_export_to_a_real_file_and_its_json_loads(tmp_path, monkeypatch):
    path = tmp_path / "rec.jsonl"
    varied_recording(path)
    monkeypatch.setattr(convert, "PARALLEL_MIN_BYTES", 0)
    for jobs in (1, 2):
        with open(tmp_path / f"out{jobs}.json", "w", newline="") as out:
            export.write_perfetto(str(path), out, jobs=jobs)
    assert (tmp_path / "out2.json").read_bytes() == (tmp_path / "out1.json").read_bytes()
    trace = json.loads((tmp_path / "out2.json").read_text())
    assert len(trace["traceEvents"]) > 3000


def test_pieces_cut_at_line_starts(tmp_path, monkeypatch):
    path = tmp_path / "rec.jsonl"
    varied_recording(path)
    monkeypatch.setattr(convert, "PARALLEL_MIN_BYTES", 0)
    data = path.read_bytes()
    pieces = convert.pieces(str(path), 4)
    assert pieces[0][0] == 0 and pieces[-1][1] == len(data)
    for (a, b), (c, _) in zip(pieces, pieces[1:]):
        assert b == c and data[c - 1:c] == b"\n"
    monkeypatch.setattr(convert, "PARALLEL_MIN_BYTES", len(data) + 1)
    assert convert.pieces(str(path), 4) == [(0, len(data))]


def test_parallel_perfetto_when_the_first_piece_writes_nothing(tmp_path, monkeypatch):
    # No event before the second piece: its first event must lose its comma.
    lines = (FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines()
    samples = [line for line in lines if '"sample"' in line[:20]]
    path = tmp_path / "rec.jsonl"
    path.write_text(("not json" * 100 + "\n") * 3000 + "\n".join(samples * 3) + "\n")
    monkeypatch.setattr(convert, "PARALLEL_MIN_BYTES", 0)
    one, par = io.StringIO(), io.StringIO()
    export.write_perfetto(str(path), one, jobs=1)
    export.write_perfetto(str(path), par, jobs=2)
    assert par.getvalue() == one.getvalue()
    assert json.loads(par.getvalue())["traceEvents"]


# ------------------------------------------------------------ decoding lines

def same_value(a, b) -> bool:
    """Equal, with the same types all the way down (1 == 1.0 is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


TRICKY_LINES = [
    b'{"type":"sample","n":18446744073709551615}',  # the largest integer orjson reads exactly
    b'{"type":"sample","n":18446744073709551616}',  # orjson reads these three as floats
    b'{"type":"sample","n":-9223372036854775809}',
    b'{"type":"sample","n":%s}' % (b"7" * 320),
    b'{"type":"sample","s":"12345678901234567890"}',  # a long run of digits in a string
    b'{"type":"sample","n":NaN,"m":Infinity,"k":-Infinity}',
    b'{"type":"sample","n":1e400,"m":-1e400,"k":1e-400}',
    b'{"type":"sample","n":-0,"m":-0.0,"k":0.1000000000000000055511151231257827021181583404541015625}',
    b'{"type":"sample","n":4.9e-324,"m":1.7976931348623157e308,"k":123456789012345678.5}',
    b'{"type":"sample","a":1,"b":2,"a":{"c":3}}',  # a repeated key: the last value, the first place
    b'{"type":"sample","s":"\\ud800"}',  # a lone surrogate, escaped
    b'{"type":"sample","s":"\xed\xa0\x80"}',  # a lone surrogate, encoded
    b'{"type":"sample","s":"\\u00e9\xc3\xa9\\ud83d\\ude00"}',
    b'\xef\xbb\xbf{"type":"sample"}',  # a byte order mark
    b'{"type":"sample","s":"\xff"}',  # not UTF-8
    b'{"type":"sample","s":"a\tb"}',  # a raw control character
    b'{"type":"sample"} x',
    b'{"type":1}',
    b'["type","sample"]',
    b'"sample"',
    b'[' * 2000,  # json.loads: RecursionError; orjson: too deep
    b'[' * 1010 + b']' * 1010,  # orjson reads it; json.loads does not
    b'{"type":"sample","a":' + b'[' * 2000 + b']' * 2000 + b'}',
]


@pytest.mark.parametrize("line", TRICKY_LINES)
def test_decode_reads_what_json_loads_reads(line):
    # ``decode`` reads most lines with orjson: values, refusals and messages
    # must be protocol.decode's (json.loads), bytes or text, with or without
    # the newline.
    variants = [line, line + b"\n"]
    try:
        variants += [line.decode() + "\n"]
    except UnicodeDecodeError:
        pass
    for text in variants:
        try:
            want = protocol.decode(text)
        except protocol.ProtocolError as exc:
            want = exc
        except RecursionError:
            want = protocol.ProtocolError("not JSON: nested too deeply")
        if isinstance(want, Exception):
            with pytest.raises(protocol.ProtocolError) as got:
                convert.decode(text)
            assert str(got.value) == str(want), text[:60]
        else:
            assert same_value(convert.decode(text), want), text[:60]


def test_export_keeps_big_integers_and_skips_deeply_nested_lines(tmp_path):
    lines = (FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines()
    sample = json.loads(next(line for line in lines if '"sample"' in line[:20]))
    big = dict(sample, seq=2**64, process=dict(sample["process"], rss_bytes=-(10**25)))
    events = dict(sample, events=[{"kind": "mark", "t": sample["t"], "a": "@"}])
    deep = json.dumps(events, separators=(",", ":")).replace('"@"', "[" * 1020 + "]" * 1020)
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(big), "[" * 2000, "[" * 1010 + "]" * 1010, deep,
                               json.dumps(sample)]) + "\n")
    for write in (export.write_csv, export.write_perfetto):
        outputs = []
        for fast in (True, False):
            out = io.StringIO()
            stats = write(str(path), out, fast=fast)  # no RecursionError
            outputs.append(out.getvalue())
            # Not records, and too deep for json.loads (which has the last word on those).
            assert stats.errors[:2] == ["line 3: not JSON: nested too deeply",
                                        "line 4: not JSON: nested too deeply"], stats.errors
            # The 1,020-deep event: json.loads cannot read it, orjson can; the
            # CSV writer never looks at it, the Perfetto writer cannot write it.
            assert stats.malformed == (2 if write is export.write_csv else 3)
        assert outputs[0] == outputs[1]
        if write is export.write_csv:
            row = next(csv.DictReader(io.StringIO(outputs[0])))
            assert row["seq"] == str(2**64) and row["rss_bytes"] == str(-(10**25))
        else:
            trace = json.loads(outputs[0])
            rss = [ev["args"]["rss"] for ev in trace["traceEvents"] if ev["name"] == "host RSS (bytes)"]
            assert rss[0] == -(10**25) and type(rss[0]) is int


def test_the_finite_test_of_counter_values_agrees_with_math_isfinite():
    from jaxtop.export.trace import _finite

    def reference(v):
        try:
            return protocol.is_number(v) and math.isfinite(v)
        except OverflowError:
            return False

    values = [0, 1, -1, 1.5, -0.0, 5e-324, 1.7976931348623157e308, float("inf"), float("-inf"), float("nan"), None,
              True, False, "1", [1], {}, 2**1023 - 1, 2**1023, -2**1023, 2**1024, 10**400, -10**400]
    assert [_finite(v) for v in values] == [reference(v) for v in values]


# ------------------------------------------------------------ reading lines

@pytest.mark.parametrize("seed", range(6))
def test_blocks_read_the_lines_iter_blocks_reads(monkeypatch, seed):
    # convert.blocks reads into one buffer and hands out views of it: the
    # same lines as protocol.iter_blocks, the same too-long lines skipped
    # (one None each), the same truncation, from a plain file, a window of
    # one and a stream that has only read().
    import random

    rng = random.Random(seed)
    monkeypatch.setattr(protocol, "BLOCK_BYTES", 64)
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 100)
    parts = [b"x" * rng.choice([0, 1, 5, 63, 64, 65, 99, 100, 101, 150, 300, 1000]) for _ in range(200)]
    data = b"\n".join(parts) + rng.choice([b"", b"\n", b"tail", b" "])

    def want(stream):
        stats = protocol.ReadStats()
        lines = []
        for block in protocol.iter_blocks(stream, stats):
            lines += [None] if block is None else block.split(b"\n")[:-1]
        return lines, stats.truncated

    def got(stream):
        stats = protocol.ReadStats()
        lines = []
        for block in convert.blocks(stream, stats):
            lines += [None] if block is None else [bytes(line) for line in block]
        return lines, stats.truncated

    class ReadOnly:
        def __init__(self, data):
            self.f = io.BytesIO(data)

        def read(self, n):
            return self.f.read(n)

    assert got(io.BytesIO(data)) == want(io.BytesIO(data))
    assert got(ReadOnly(data)) == want(io.BytesIO(data))
    start = len(data) // 3
    assert got(convert.Window(io.BytesIO(data), start, len(data))) == want(io.BytesIO(data[start:]))
