"""The one decoder (:mod:`jaxtop.wire.records.decoder`) held to what it
promises: its fast path (msgspec) and careful path (``json.loads``) agree on
every recorded line; whatever a line holds, what comes out is a record whose
strings a terminal cannot obey, whose fields have their types (or read n/a,
noted in ``odd``), or a ``ProtocolError``. hypothesis is not installed in
this project's venv, so the hostile inputs are enumerated: every unsafe
character, in every encoding, at every kind of position."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

import msgspec
import pytest

from jaxtop.wire.protocol import ProtocolError
from jaxtop.wire.records import Unknown, decode, from_dict, is_clean
from jaxtop.wire.records.core import ODD_KEY
from test_records import CENSUS, RECORDINGS, _lines

# == 3. the decoder ==============================================================================

def _all_recorded_lines() -> list[bytes]:
    return [line for path in RECORDINGS for line in _lines(path)] + [CENSUS.read_bytes().strip()]


def test_the_fast_and_careful_paths_read_every_recorded_line_alike():
    lines = _all_recorded_lines()
    clean = 0
    for line in lines:
        fast = decode(line)
        assert fast == from_dict(json.loads(line)), line[:200]
        assert decode(line.decode()) == fast
        assert fast.odd == ()
        clean += is_clean(line)
    # What the agent writes takes the fast path, else this compared the
    # careful path with itself. (Some jit lines recorded on the TPU take
    # the careful path: XLA's fingerprints were written as raw bytes, control
    # characters included.)
    assert clean >= 0.95 * len(lines)


#: Every character a terminal would obey: C0 controls but tab and newline,
#: DEL, C1 controls, bidi overrides and isolates.
UNSAFE = [chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0),
                           *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
#: How a line may carry one: a JSON escape in lower- or upper-case hex, or
#: the character itself (UTF-8).
ENCODINGS = {
    "escaped": lambda c: f"\\u{ord(c):04x}",
    "escaped-upper": lambda c: f"\\u{ord(c):04X}",
    "raw": lambda c: c,
}


#: What a terminal would obey (jaxtop.wire.safe_text.UNSAFE, written out).
_UNSAFE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _strings(value: Any) -> Iterable[str]:
    """Every string of a decoded record, at any depth, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            yield from _strings(getattr(value, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _unsafe_strings(record: Any) -> list[str]:
    return [s for s in _strings(record) if _UNSAFE_RE.search(s)]


def _shown(c: str) -> str:
    """How a decoded string shows an unsafe character: as the text of its
    escape (jaxtop.wire.safe_text.terminal_safe)."""
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _at(*path: Any) -> Callable[[Any], Any]:
    """A getter of the value at ``path`` in a decoded record: an attribute
    of a struct, a key or index of JSON (a part may be either, as its type
    is made finer)."""
    def get(value: Any) -> Any:
        for step in path:
            if isinstance(step, int) or isinstance(value, dict):
                value = value[step]
            else:
                value = getattr(value, step)
        return value
    return get


def _key_of(*path: Any) -> Callable[[Any], Any]:
    """A getter of the one key of the object at ``path``."""
    return lambda record: next(iter(_at(*path)(record)))


#: (what, line with @ where the string goes, its getter). Every kind of
#: place a string can be: typed fields, list items, typed dict keys and
#: values, the keys and values of JSON parts at any depth, an Any field,
#: an unknown record's type and the decoder's own notes.
PLACES: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("typed field", '{"type":"sample","t":1.0,"devices":[{"id":0,"platform":"@"}]}', _at("devices", 0, "platform")),
    ("device name", '{"type":"sample","t":1.0,"devices":[{"id":"@"}]}', _at("devices", 0, "id")),
    ("nested typed field", '{"type":"sample","t":1.0,"transfers":{"top_shapes":[{"shape":"@"}]}}',
     _at("transfers", "top_shapes", 0, "shape")),
    ("gpu name", '{"type":"hello","t":1.0,"nvml":{"available":true,"devices":[{"index":0,"name":"@"}]}}',
     _at("nvml", "devices", 0, "name")),
    ("list item", '{"type":"hello","t":1.0,"argv":["train.py","@"]}', _at("argv", 1)),
    ("typed dict key", '{"type":"sample","t":1.0,"transfer_capture":{"guard":{"@":"log"}}}',
     _key_of("transfer_capture", "guard")),
    ("typed dict value", '{"type":"sample","t":1.0,"transfer_capture":{"guard":{"h2d":"@"}}}',
     _at("transfer_capture", "guard", "h2d")),
    ("versions value", '{"type":"hello","t":1.0,"versions":{"jax":"@"}}', _at("versions", "jax")),
    ("json value", '{"type":"sample","t":1.0,"demo":{"k":"@"}}', _at("demo", "k")),
    ("json key", '{"type":"sample","t":1.0,"demo":{"@":1}}', _key_of("demo")),
    ("deep json key", '{"type":"sample","t":1.0,"demo":{"a":[{"b":[{"@":[]}]}]}}', _key_of("demo", "a", 0, "b", 0)),
    ("deep json item", '{"type":"sample","t":1.0,"demo":{"a":[[["@"]]]}}', _at("demo", "a", 0, 0, 0)),
    ("event text", '{"type":"sample","t":1.0,"events":[{"kind":"error","t":1.0,"text":"@"}]}',
     _at("events", 0, "text")),
    ("history row", '{"type":"history","t":1.0,"rows":[[1.0,"@"]]}', _at("rows", 0, 1)),
    ("any field", '{"type":"error","t":1.0,"message":"@","fatal":true}', _at("message")),
    ("reply result", '{"type":"reply","t":1.0,"id":1,"ok":true,"result":{"rows":[{"@":"@"}]}}',
     lambda r: "".join(next(iter(r.result["rows"][0].items())))),
    ("census", '{"type":"oom_census","t":1.0,"id":"1-1","verdict":"@"}', _at("verdict")),
    ("unknown type", '{"type":"@","t":1.0}', _at("type")),
    ("odd note", '{"type":"sample","t":1.0,"seq":"@"}', lambda r: r.odd[0].value),
    ("odd path", '{"type":"sample","t":1.0,"transfer_capture":{"guard":{"@":1}}}', lambda r: r.odd[0].where),
]


def _in(template: str, text: str) -> bytes:
    return template.replace("@", text).encode("utf-8")


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("what,template,get", PLACES, ids=[p[0] for p in PLACES])
def test_every_unsafe_character_anywhere_comes_out_as_the_text_of_its_escape(what, template, get, encoding):
    failures = []
    for c in UNSAFE:
        line = _in(template, "a" + ENCODINGS[encoding](c) + "b")
        if encoding == "raw" and c < " ":
            # JSON has no raw control character in a string: such a line
            # is no record at all (json.loads refuses it too).
            try:
                decode(line)
            except ProtocolError:
                continue
            failures.append(f"U+{ord(c):04X}: read, not refused")
            continue
        try:
            record = decode(line)
            got = get(record)
        except Exception as exc:  # noqa: BLE001 - every failure is listed, not only the first
            failures.append(f"U+{ord(c):04X}: {type(exc).__name__}: {exc}")
            continue
        if ("a" + _shown(c) + "b") not in got or _unsafe_strings(record):
            failures.append(f"U+{ord(c):04X}: {got!r}")
    assert failures == []


@pytest.mark.parametrize("template", [
    # A buffer map is numbers only (the decoder leaves it unwalked for
    # speed); a string there, or under any other key named "map", is
    # still a string a terminal would obey.
    '{"type":"sample","t":1.0,"devices":[{"id":0,"live_arrays":{"map":[["@",1]]}}]}',
    '{"type":"sample","t":1.0,"demo":{"map":["@"]}}',
    '{"type":"sample","t":1.0,"demo":{"map":{"@":1}}}',
], ids=["live_arrays.map", "json map item", "json map key"])
def test_an_unsafe_character_in_a_map_comes_out_escaped(template):
    record = decode(_in(template, "\\u001b]0;title\\u0007"))
    assert _unsafe_strings(record) == []


def test_a_line_is_clean_only_without_unsafe_characters():
    # The scan is what keeps a line off the fast path, which shows strings
    # as they are: it must flag every unsafe character it could let through.
    assert is_clean(b'{"type":"sample","t":1.0,"argv":["caf\\u00e9","\\n","\\t"]}')
    assert is_clean('{"type":"sample","t":1.0,"argv":["café"]}'.encode())
    for c in UNSAFE:
        for name, encode in ENCODINGS.items():
            line = _in('{"type":"sample","argv":["@"]}', encode(c))
            if name == "raw" and c < " ":
                # A raw control character is no JSON: the fast path refuses
                # it as the careful one does, flagged or not.
                with pytest.raises(ProtocolError):
                    decode(line)
            else:
                assert not is_clean(line), (hex(ord(c)), name)


@pytest.mark.parametrize("line,get,where,should", [
    ('{"type":"sample","t":1.0,"seq":"x"}', _at("seq"), "seq", "a number"),
    ('{"type":"sample","t":1.0,"seq":true}', _at("seq"), "seq", "a number"),
    ('{"type":"sample","t":1.0,"final":1}', _at("final"), "final", "true or false"),
    ('{"type":"sample","t":"now"}', _at("t"), "t", "a number"),
    ('{"type":"sample","t":1e12}', _at("t"), "t", "a number"),  # beyond 1e11 s: no time a program ran at
    ('{"type":"sample","t":1.0,"process":"x"}', _at("process"), "process", "an object"),
    ('{"type":"sample","t":1.0,"devices":[{"id":true}]}', _at("devices", 0, "id"), "devices[].id",
     "an integer or a name"),
    ('{"type":"sample","t":1.0,"devices":[{"id":0.0}]}', _at("devices", 0, "id"), "devices[].id",
     "an integer or a name"),
    ('{"type":"sample","t":1.0,"devices":[{"id":0,"bytes_in_use":"x"}]}', _at("devices", 0, "bytes_in_use"),
     "devices[].bytes_in_use", "a number"),
    ('{"type":"sample","t":1.0,"devices":[{"id":0,"live_arrays":{"top":[{"nbytes":[1]}]}}]}',
     _at("devices", 0, "live_arrays", "top", 0, "nbytes"), "devices[].live_arrays.top[].nbytes", "a number"),
    ('{"type":"sample","t":1.0,"transfers":{"h2d":{"count":{}}}}', _at("transfers", "h2d", "count"),
     "transfers.h2d.count", "a number"),
    ('{"type":"sample","t":1.0,"transfer_capture":{"guard":{"h2d":1}}}', lambda r: r.transfer_capture.guard.get("h2d"),
     "transfer_capture.guard.h2d", "a string"),
    ('{"type":"sample","t":1.0,"demo":[1]}', _at("demo"), "demo", "an object"),
    ('{"type":"hello","t":1.0,"argv":"train.py"}', _at("argv"), "argv", "an array"),
    ('{"type":"error","t":1.0,"message":"m","fatal":"yes"}', _at("fatal"), "fatal", "true or false"),
])
def test_a_field_of_the_wrong_type_reads_n_a_and_is_noted_where_it_is(line, get, where, should):
    # The careful path keeps every other part: the line carries a good
    # one beside the bad (seq 5, or an error's message).
    good = ',"seq":5}' if '"sample"' in line and '"seq"' not in line else "}"
    record = decode(line[:-1] + good)
    assert get(record) is None
    assert [(o.where, o.should) for o in record.odd] == [(where, should)]
    if good != "}":
        assert record.seq == 5


@pytest.mark.parametrize("text,value", [
    (str(2**63 - 1), 2**63 - 1),  # the largest that stays an integer
    (str(-(2**63)), -(2**63)),
    (str(2**63), float(2**63)),
    (str(-(2**63) - 1), float(-(2**63) - 1)),
    (str(2**64), float(2**64)),
    (str(10**300), 1e300),
])
@pytest.mark.parametrize("place", ["seq", "device"])
def test_an_integer_beyond_64_bits_reads_as_a_float(text, value, place):
    line = ('{"type":"sample","t":1.0,"seq":%s}' if place == "seq" else
            '{"type":"sample","t":1.0,"devices":[{"id":0,"bytes_in_use":%s}]}') % text
    record = decode(line)
    got = record.seq if place == "seq" else record.devices[0].bytes_in_use
    assert got == value and type(got) is type(value)
    assert record.odd == ()


#: A figure read where the agent writes one, beside each kind of JSON part.
NUMBER_PLACES = {
    "typed": ('{"type":"sample","t":1.0,"seq":@}', _at("seq")),
    "nested typed": ('{"type":"sample","t":1.0,"devices":[{"id":0,"bytes_in_use":@}]}',
                     _at("devices", 0, "bytes_in_use")),
    "json part": ('{"type":"sample","t":1.0,"demo":{"x":@}}', _at("demo", "x")),
    "list item": ('{"type":"sample","t":1.0,"demo":{"x":[[@]]}}', _at("demo", "x", 0, 0)),
    "any field": ('{"type":"reply","t":1.0,"id":1,"ok":true,"result":{"x":[@]}}', _at("result", "x", 0)),
}


def _paths(places: Iterable[str]) -> list[Any]:
    """Each place on each path: ``fast`` (the line as it is, clean) and
    ``careful`` (with a string the scan flags). msgspec reads an integer in
    an open JSON part exactly, up to 4300 digits: the fast path checks
    those parts (events, demo, history rows, a reply's result) itself."""
    return [pytest.param(place, path, id=f"{place}-{path}") for place in places for path in ("fast", "careful")]


def _on(path: str, template: str) -> str:
    """``template`` as the path ``path`` reads it."""
    assert is_clean(template.encode())
    return template if path == "fast" else template.replace('{"type":"', '{"argv":["\\u001b"],"type":"', 1)



@pytest.mark.parametrize("place,path", _paths(NUMBER_PLACES))
@pytest.mark.parametrize("number", [str(10**4000), str(-(10**4000)), str(10**4300 - 1)],
                         ids=["10**4000", "-10**4000", "4300 digits"])
def test_an_integer_beyond_a_floats_range_refuses_the_line(number, place, path):
    line = _in(_on(path, NUMBER_PLACES[place][0]), number)
    with pytest.raises(ProtocolError):
        decode(line)


@pytest.mark.parametrize("place,path", _paths(NUMBER_PLACES))
def test_an_integer_beyond_64_bits_reads_as_a_float_in_any_part(place, path):
    # Every figure, typed or not, is read as orjson reads it (docs/protocol.md).
    template, get = NUMBER_PLACES[place]
    got = get(decode(_in(_on(path, template), str(2**64))))
    assert got == float(2**64) and type(got) is float


@pytest.mark.parametrize("place,path", _paths(NUMBER_PLACES))
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_a_number_that_is_no_json_number_reads_n_a(number, place, path):
    template, get = NUMBER_PLACES[place]
    assert get(decode(_in(_on(path, template), number))) is None


@pytest.mark.parametrize("line,t", [
    (b'{"type":"newer_record","t":5.0,"x":{"y":1}}', 5.0),
    (b'{"type":"newer_record","t":"later"}', None),
    (b'{"type":"newer_record"}', None),
    (b'{"type":"newer_record","t":true}', None),
    (b'{"type":"newer_record","t":1e12}', None),  # as any record's t: no time a program ran at
    (b'{"type":"newer_record","t":-1e300}', None),
    (b'{"type":"Sample","t":5.0}', 5.0),  # types are spelled exactly
])
def test_an_unknown_type_gives_unknown(line, t):
    record = decode(line)
    assert isinstance(record, Unknown)
    assert record.type == json.loads(line)["type"] and record.t == t
    assert msgspec.convert(msgspec.structs.asdict(record), Unknown) == record  # every field of its declared type


#: What a line would have to carry to write the decoder's notes itself.
_FORGED = '[{"where":"seq","value":"forged","should":"a number"}]'


@pytest.mark.parametrize("key", ["\\u2066odd", "\u2066odd", "\\\\u2066odd"], ids=["escaped", "raw", "backslash"])
@pytest.mark.parametrize("kind", ["sample", "hello", "error"])
def test_no_line_can_write_the_decoders_notes(key, kind):
    line = f'{{"type":"{kind}","t":1.0,"{key}":{_FORGED}}}'.encode()
    assert decode(line).odd == ()
    # Beside a real note, only the real one.
    record = decode(f'{{"type":"{kind}","t":"now","{key}":{_FORGED}}}'.encode())
    assert [o.where for o in record.odd] == ["t"]


def test_no_dict_can_write_the_decoders_notes():
    record = from_dict({"type": "sample", "t": 1.0, ODD_KEY: json.loads(_FORGED)})
    assert record.odd == ()


def _deep_dict(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return {"type": "sample", "t": 1.0, "demo": value}


@pytest.mark.parametrize("line", [
    b"[" * 100_000,
    b'{"a":' * 100_000,
    b'{"type":"sample","t":1.0,"demo":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"type":"sample","t":1.0,"devices":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"type":"sample","t":1.0,"argv":["\\u001b"],"demo":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"type":"newer_record","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
], ids=["arrays", "objects", "json part", "typed part", "careful path", "unknown type"])
def test_deep_nesting_is_refused_not_a_recursion_error(line):
    with pytest.raises(ProtocolError):
        decode(line)


def test_a_deep_dict_is_refused_not_a_recursion_error():
    with pytest.raises(ProtocolError):
        from_dict(_deep_dict(100_000))


@pytest.mark.parametrize("line", [
    b"", b" ", b"[]", b"[1]", b"1", b"1.5", b'"sample"', b"null", b"true", b"{}", b'{"t":1.0}',
    b'{"type":1}', b'{"type":null}', b'{"type":["sample"]}', b'{"type":{"sample":1}}',
    b"{", b'{"type":"sample"', b'{"type":"sample"} {"type":"sample"}', b"not json", b"\xff\xfe",
    b'{"type":"sample","t":1.0,"argv":["\\u001b"]', b'["\\u001b"]',
])
def test_a_line_that_is_no_object_with_a_type_is_refused(line):
    with pytest.raises(ProtocolError):
        decode(line)


@pytest.mark.parametrize("value", [[], "sample", None, 1, {"t": 1.0}, {"type": 1}])
def test_a_value_that_is_no_object_with_a_type_is_refused(value):
    with pytest.raises(ProtocolError):
        from_dict(value)


def test_a_newer_agents_recording_replays_with_what_this_reader_knows(tmp_path):
    """Unknown fields (at every level) and unknown record types, as a newer
    agent would add them: the fields are ignored on the fast path (the
    line stays clean), the record types skipped, and everything known is
    shown as from an agent of today."""
    from jaxtop.dashboard.model import Model
    from jaxtop.dashboard.sources.live import ingest
    from jaxtop.testing import synthetic

    records = [synthetic.hello(7, 2, 1000.0)] + list(synthetic.samples(7, 2, 1000.0, 30))
    newer = []
    for rec in records:
        rec = json.loads(json.dumps(rec))
        rec["future_field"] = {"nested": [1, 2, {"deeper": "x"}]}
        for dev in rec.get("devices") or ():
            dev["future_figure_bytes"] = 12345
            if isinstance(dev.get("live_arrays"), dict):
                dev["live_arrays"]["future_scan"] = [1, 2]
        newer.append(json.dumps(rec).encode() + b"\n")
        newer.append(b'{"type":"future_record","t":1000.5,"what":{"a":1}}\n')
    assert all(is_clean(line) for line in newer)
    today, tomorrow = Model(clock=lambda: 0.0), Model(clock=lambda: 0.0)
    ingest(today, 7, [json.dumps(r).encode() + b"\n" for r in records])
    ingest(tomorrow, 7, newer)
    a, b = today.snapshot(now=2000.0, window_s=None), tomorrow.snapshot(now=2000.0, window_s=None)
    assert [e.text for e in b.events] == [e.text for e in a.events]  # nothing said of the unknown
    assert a.devices and [(d.id, d.bytes_in_use, d.live_bytes) for d in a.devices] == \
        [(d.id, d.bytes_in_use, d.live_bytes) for d in b.devices]
    assert a.processes[0].seq == b.processes[0].seq == records[-1]["seq"]
    assert all(not decode(line).odd for line in newer if b'"sample"' in line)
