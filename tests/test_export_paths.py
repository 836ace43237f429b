"""The export's fast path (samples decoded by msgspec into just the fields a
format writes, jaxtop.export.typed) must be invisible: every export is
compared byte for byte with the careful path (every line decoded whole, by
orjson where it reads as json.loads does, then taken field by field) and
with json.loads on every line, on real recordings and on lines made to trip
it up. The lean types are cuts of the wire's: checked on every fixture.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import msgspec

import pytest

from jaxtop.wire import protocol
from jaxtop.export import convert, formats as export, typed
from jaxtop.export.shapes import MAX_SHAPES

FIXTURES = Path(__file__).parent / "fixtures"
WRITERS = [export.write_csv, export.write_perfetto,
           *(lambda path, out, kind=kind, **kw: export.write_sparse_csv(kind, path, out, **kw) for kind in export.SPARSE_CSV)]


def both(path: Path, monkeypatch: pytest.MonkeyPatch, min_hits: int) -> None:
    """Export ``path`` in every format fast, plain, and plain with json.loads
    alone: same bytes, same counts; the typed decoding used."""
    typed_lines = [0]  # samples the fast decoding read (not counting the lines it left)
    fast_decoder = convert.fast_decoder

    def counted(lean):
        decode = fast_decoder(lean)

        def wrapper(line):
            rec = decode(line)
            typed_lines[0] += rec.type == "sample"
            return rec
        return wrapper

    monkeypatch.setattr(convert, "fast_decoder", counted)
    for i, write in enumerate(WRITERS):
        plain, fast, reference = io.StringIO(), io.StringIO(), io.StringIO()
        s1 = write(str(path), plain, fast=False)
        typed_lines[0] = 0
        s2 = write(str(path), fast, fast=True)
        assert fast.getvalue() == plain.getvalue(), i
        assert (s1.records, s1.malformed, s1.truncated, s1.errors) == (s2.records, s2.malformed, s2.truncated, s2.errors)
        assert typed_lines[0] >= min_hits, (i, typed_lines[0])
        with monkeypatch.context() as m:
            m.setattr(convert, "decode", protocol.decode)  # no orjson
            s3 = write(str(path), reference, fast=False)
        assert reference.getvalue() == plain.getvalue(), i
        assert (s1.records, s1.malformed, s1.truncated, s1.errors) == (s3.records, s3.malformed, s3.truncated, s3.errors)


@pytest.mark.parametrize("name", ["cpu_train_loop.jsonl", "synthetic_gpu.jsonl"])
def test_fast_export_equals_plain_export_on_recordings(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Each sample many times with other numbers: the fast path serves most.
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    rng = random.Random(1)
    out = [lines[0]]
    for k in range(2000):
        rec = json.loads(lines[1 + k % (len(lines) - 1)])
        if rec.get("type") == "sample":
            rec["t"] += k * 0.1
            rec["seq"] = k
            for d in ("h2d", "d2h", "d2d"):
                x = rec["transfers"][d]
                x["count"] = rng.randrange(0, 1000)
                x["count_total"] += k
        out.append(json.dumps(rec, separators=(",", ":")) + "\n")
    path = tmp_path / name
    path.write_text("".join(out))
    both(path, monkeypatch, min_hits=1500)


def test_fast_export_equals_plain_export_on_hostile_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = json.loads((FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines()[3])
    assert base["type"] == "sample"
    text = json.dumps(base, separators=(",", ":"))
    rng = random.Random(3)

    def variant(k: int) -> str:
        rec = json.loads(text)
        rec["t"] = rec["t"] + k * 0.5
        dev = rec["devices"][0]
        dev["bytes_in_use"] = k * 1000
        line = json.dumps(rec, separators=(",", ":"))
        tricks = [
            lambda s: s,
            lambda s: s.replace('"t":', '"t":', 1).replace(f'"bytes_in_use":{k * 1000}', '"bytes_in_use":1.50'),
            lambda s: s.replace(f'"bytes_in_use":{k * 1000}', '"bytes_in_use":1e400'),
            lambda s: s.replace(f'"bytes_in_use":{k * 1000}', '"bytes_in_use":%s' % ("7" * 320)),
            lambda s: s.replace(f'"bytes_in_use":{k * 1000}', f'"bytes_in_use":{2**64 + k}'),  # orjson: a float
            lambda s: s.replace('"t":', '"t":-1e999,"u":', 1),  # orjson refuses it, json.loads reads -inf
            lambda s: s.replace('"h2d":{"count":', '"h2d":{"count":null,"count":', 1),
            lambda s: s.replace('"h2d":{"count":', '"h2d":{"count":1.7e308,"x":', 1),  # a rate beyond a float
            lambda s: s.replace('"h2d":{"count":', '"h2d":{"count":"many","x":', 1),
            lambda s: s.replace('"h2d":{"count":', '"h2d":{"x":', 1),  # no count: a rate of 0
            lambda s: s.replace('"id":0', '"id":true', 1),
            lambda s: s.replace('"id":0', '"id":0.0', 1),
            lambda s: s.replace('"devices":[', '"devices":["x",', 1),
            lambda s: s[:-1] + ',"events":[{"kind":"mark","t":1,"n":%d}]}' % k,
            lambda s: s.replace('"t":', '"t":1e400,"u":', 1),
            lambda s: s.replace('"t":', '"t":"now","u":', 1),
            lambda s: s.replace('"failed_total":', '"failed_total":%d,"x":' % (k // 3), 1),
            lambda s: s.replace('"count_total":', '"count_total":%d.0,"x":' % k, 1),
            lambda s: s.replace("{", "{ ", 1),
            # Shapes the typed decoding refuses or must read as json.loads does.
            lambda s: s.replace('"t":', '"t":1,"t":', 1),  # a repeated key: the last wins
            lambda s: s.replace('"devices":[', '"devices":null,"x":[', 1),
            lambda s: s.replace('"devices":[', '"devices":[],"x":[', 1),
            lambda s: s.replace('"devices":[', '"devices":[null,', 1),
            lambda s: s.replace('"transfers":{', '"transfers":[],"x":{', 1),
            lambda s: s.replace('"h2d":{', '"h2d":null,"x":{', 1),
            lambda s: s.replace('"h2d":{', '"h2d":7,"x":{', 1),
            lambda s: s.replace('"live_arrays":{', '"live_arrays":5,"x":{', 1),
            lambda s: s.replace('"process":{', '"process":null,"x":{', 1),
            lambda s: s.replace('"donation":{', '"donation":{"last_message":{"m":[1,2]},', 1),
            lambda s: s[:-1] + ',"holders":{"sites":[{"site":"a.py:1","bytes":%d}]}}' % k,
            lambda s: s[:-1] + ',"labels":null}',
            lambda s: s[:-1] + ',"host_syncs":{"count":%d}}' % k,
            lambda s: s.replace('"type":"sample"', '"type":"sample","type":"other"', 1),
            lambda s: s[: len(s) // 2],  # not JSON
            lambda s: s.replace('"', "\u00e9", 1),  # not JSON either
        ]
        return rng.choice(tricks)(line)

    lines = [json.dumps({"type": "hello", "t": base["t"] - 1, "pid": 42, "argv": ["x%d"]}) + "\n"]
    for k in range(3000):
        lines.append(variant(k) + "\n")
        if k == 1500:
            lines.append(json.dumps({"type": "hello", "t": base["t"], "pid": 43, "argv": []}) + "\n")
    path = tmp_path / "hostile.jsonl"
    # Not UTF-8, then a truncated last line.
    path.write_bytes("".join(lines).encode() + b"\xff\n" + b'{"type":"sample","t":')
    both(path, monkeypatch, min_hits=1000)


def test_a_trace_whose_every_sample_has_another_shape_is_written_the_same(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The typed trace keeps a format per shape of sample, at most MAX_SHAPES:
    # device ids that change every sample, and values that come and go.
    base = json.loads((FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines()[3])
    lines = [json.dumps({"type": "hello", "t": base["t"] - 1, "pid": 7, "argv": []}) + "\n"]
    for k in range(3 * MAX_SHAPES):
        rec = json.loads(json.dumps(base))
        rec["t"] += k * 0.1
        for i, dev in enumerate(rec["devices"]):
            dev["id"] = k * 10 + i
            if k % 3 == 0:
                dev["pool_bytes"] = None
            if k % 5 == 0:
                dev.pop("fragmentation", None)
        if k % 7 == 0:
            rec["process"]["rss_bytes"] = "n/a"
        lines.append(json.dumps(rec, separators=(",", ":")) + "\n")
    path = tmp_path / "shapes.jsonl"
    path.write_text("".join(lines))
    both(path, monkeypatch, min_hits=2 * MAX_SHAPES)


# ------------------------------------------------------------ the lean types

def fixture_lines() -> list[bytes]:
    lines = []
    for path in sorted(FIXTURES.glob("*.jsonl")) + sorted((FIXTURES / "tpu").glob("*.jsonl.gz")):
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        lines += [line for line in data.splitlines() if line.strip()]
    return lines


def same_as_wire(lean: Any, wire: Any, where: str) -> list[str]:
    """Where a lean record's values differ from the wire type's of the same line."""
    if isinstance(lean, msgspec.Struct):
        if wire is None:
            return [f"{where}: the wire's is None"]
        return [d for f in lean.__struct_fields__ if f != "type"
                for d in same_as_wire(getattr(lean, f), getattr(wire, f), f"{where}.{f}")]
    if isinstance(lean, list):
        if not isinstance(wire, list) or len(wire) != len(lean):
            return [f"{where}: {wire!r:.80} is not a list of {len(lean)}"]
        return [d for i, (a, b) in enumerate(zip(lean, wire)) for d in same_as_wire(a, b, f"{where}[{i}]")]
    lean = None if lean is typed.UNSET else lean
    return [] if lean == wire else [f"{where}: {lean!r:.80} != {wire!r:.80}"]


def test_the_lean_types_read_every_fixture_as_the_wires_types_do():
    from jaxtop.wire.records import decode

    samples = 0
    for line in fixture_lines():
        rec = decode(line)
        assert not getattr(rec, "odd", ()), (rec.odd, line[:200])
        if type(rec).__name__ != "Sample":
            assert convert.fast_decoder(typed.Other)(line).type != "sample"
            continue
        samples += 1
        for cls in {w.SAMPLE for w in (export._CsvWriter, export.PerfettoWriter, *export.SPARSE_CSV.values())}:
            lean = convert.fast_decoder(cls)(line)
            assert not same_as_wire(lean, rec, cls.__name__), same_as_wire(lean, rec, cls.__name__)[:5]
            # The careful path reads the line as the fast one does.
            assert typed.record(json.loads(line), cls) == lean, cls.__name__
    assert samples > 1500


def test_a_lean_type_must_be_a_cut_of_the_wires():
    from jaxtop.wire.records import core

    with pytest.raises(TypeError, match="bytes_used: .*Device has no such field"):
        @typed.cut_of(core.Device)
        class Misnamed(typed.Lean):
            bytes_used: Any = None

    with pytest.raises(TypeError, match="devices: CsvLive is no cut of what Sample.devices holds"):
        @typed.cut_of(core.Sample)
        class Misplaced(typed.Lean):
            devices: list[typed.CsvLive] | None = None
