"""Learned line layouts (jaxtop.export.layouts) and the export fast path built on them.

The fast path must be invisible: every export is compared byte for byte with
the plain path (every line decoded, by orjson where it reads as json.loads
does) and with json.loads on every line, on real recordings and on lines made
to trip it up.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from jaxtop import protocol
from jaxtop.export import convert, formats as export, typed
from jaxtop.export.layouts import Layout, Layouts, lookup, number_paths

FIXTURES = Path(__file__).parent / "fixtures"


def learn(text: str) -> Layout:
    layout = Layout(text, json.loads(text))
    layout.capture()
    return layout


def test_number_paths_skip_numbers_inside_strings_and_keys() -> None:
    text = '{"h2d":{"count":3},"shape":"float32[8,128]","l":[1,[2.5,{"x":-4e-3}]],"s":"a\\"1,2","z":null}\n'
    found = [(path, text[a:b], f) for path, a, b, f in number_paths(text)]
    assert found == [
        (("h2d", "count"), "3", False),
        (("l", 0), "1", False),
        (("l", 1, 0), "2.5", True),
        (("l", 1, 1, "x"), "-4e-3", True),
    ]


def test_a_layout_reads_back_what_json_loads_reads() -> None:
    rng = random.Random(7)
    line = (FIXTURES / "synthetic_gpu.jsonl").read_text().splitlines(keepends=True)[5]
    layout = learn(line)
    for _ in range(200):
        rec = json.loads(line)
        for path in layout.index:  # new numbers of the same types
            value = lookup(rec, path)
            new = rng.choice([0, 1, -7, 2**62, 10**299]) if isinstance(value, int) else rng.choice(
                [0.0, -1.5, 1e-05, 1.7976931348623157e308, 3.14159])
            target = rec
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = new
        text = json.dumps(rec, separators=(",", ":")) + "\n"
        m = layout.pattern.fullmatch(text)
        assert m is not None
        groups = m.groups()
        for path, i in layout.index.items():
            conv = float if i in layout.floats else int
            got = conv(groups[i])
            assert type(got) is type(lookup(rec, path)) and got == lookup(rec, path)


@pytest.mark.parametrize("other", [
    '{"h3d":{"count":1},"s":"x"}\n',        # a key with other digits
    '{"h2d":{"count":01},"s":"x"}\n',       # not JSON: a leading zero
    '{"h2d":{"count":-0},"s":"x"}\n',       # -0 reads back as 0: not the same text
    '{"h2d":{"count":1.5},"s":"x"}\n',      # a float where the layout has an integer
    '{"h2d":{"count":1},"s":"y"}\n',        # another string
    '{"h2d":{"count":1},"s":"x"} \n',       # other whitespace
    '{"h2d":{"count":"1"},"s":"x"}\n',      # a string where the number was
    '{"h2d":{"count":1},"s":"x"}',          # no newline
    '{"h2d":{"count":1e5},"s":"x"}\n',      # an exponent is a float in JSON
])
def test_a_layout_matches_only_its_own_shape(other: str) -> None:
    layout = learn('{"h2d":{"count":12},"s":"x"}\n')
    assert layout.pattern.fullmatch('{"h2d":{"count":999},"s":"x"}\n')
    assert layout.pattern.fullmatch(other) is None


def test_integer_holes_stay_within_float_range() -> None:
    layout = learn('{"n":5}\n')
    assert layout.pattern.fullmatch('{"n":%s}\n' % ("9" * 300))
    assert layout.pattern.fullmatch('{"n":%s}\n' % ("9" * 301)) is None


def test_repeated_keys_follow_json_loads_or_are_not_learned() -> None:
    layout = learn('{"a":1,"a":2}\n')  # json.loads keeps the last
    assert layout.index == {("a",): 1}
    with pytest.raises(ValueError):
        learn('{"a":1,"a":"x"}\n')
    with pytest.raises(ValueError):
        learn('{"a":{"b":1},"a":{"c":2}}\n')


def test_layouts_cache_finds_alternating_shapes_and_bounds_learning() -> None:
    cache = Layouts(free_learns=4, min_hits_per_learn=10)
    a, b = '{"a":1,"t":2.5}\n', '{"b":1,"t":2.5}\n'
    for text in (a, b):
        assert cache.match(text) is None
        assert cache.learn(text, json.loads(text), lambda layout, record: "emit") is not None
    for k in range(20):
        hit = cache.match((a if k % 2 else b).replace("2.5", f"{k}.5"))
        assert hit is not None and hit[1].group(2) == f"{k}.5"
    # Every line its own shape: learning stops once it stops paying.
    for k in range(200):
        text = '{"k%d":1}\n' % k
        if cache.match(text) is None:
            cache.learn(text, json.loads(text), lambda layout, record: "emit")
    assert cache.learned <= 4 + cache.hits // 10 + 1
    assert cache.match('{"a":1,"t":9.5}\n') is None or cache.learned > 2  # cache may have been cleared


def test_a_refused_layout_is_not_kept() -> None:
    cache = Layouts()
    text = '{"a":1}\n'
    assert cache.learn(text, json.loads(text), lambda layout, record: None) is None
    assert cache.match(text) is None


# ------------------------------------------------------------- export equality

def both(path: Path, monkeypatch: pytest.MonkeyPatch, min_hits: int) -> None:
    """Export ``path`` by each fast path (typed decoding, and the learned
    layouts it replaced, still used where msgspec is missing), plain, and
    plain with json.loads alone: same bytes, same counts; each fast path
    used."""
    made: list[Layouts] = []

    class Recorded(Layouts):
        def __init__(self) -> None:
            super().__init__(free_learns=64)  # learn every trick the test plays
            made.append(self)

    typed_lines = [0]

    def counted(decode):
        def wrapper(line):
            typed_lines[0] += 1
            return decode(line)
        return wrapper

    monkeypatch.setattr(convert, "Layouts", Recorded)
    monkeypatch.setattr(typed, "decode_sample", counted(typed.decode_sample))
    monkeypatch.setattr(typed, "decode_trace_sample", counted(typed.decode_trace_sample))
    for write in (export.write_csv, export.write_perfetto):
        plain, fast, reference = io.StringIO(), io.StringIO(), io.StringIO()
        s1 = write(str(path), plain, fast=False)
        typed_lines[0] = 0
        s2 = write(str(path), fast, fast=True)
        assert fast.getvalue() == plain.getvalue(), write.__name__
        assert (s1.records, s1.malformed, s1.truncated, s1.errors) == (s2.records, s2.malformed, s2.truncated, s2.errors)
        assert typed_lines[0] >= min_hits, (write.__name__, typed_lines[0])
        with monkeypatch.context() as m:  # the learned layouts
            m.setattr(typed, "decode_sample", None)
            m.setattr(typed, "decode_trace_sample", None)
            by_layouts = io.StringIO()
            s4 = write(str(path), by_layouts, fast=True)
        assert by_layouts.getvalue() == plain.getvalue(), write.__name__
        assert (s1.records, s1.malformed, s1.truncated, s1.errors) == (s4.records, s4.malformed, s4.truncated, s4.errors)
        assert made[-1].hits >= min_hits, (write.__name__, made[-1].hits)
        with monkeypatch.context() as m:
            m.setattr(convert, "decode", protocol.decode)  # no orjson
            s3 = write(str(path), reference, fast=False)
        assert reference.getvalue() == plain.getvalue(), write.__name__
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
    for k in range(3 * export.MAX_SHAPES):
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
    both(path, monkeypatch, min_hits=2 * export.MAX_SHAPES)
