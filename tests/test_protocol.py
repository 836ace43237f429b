"""Pure layer: the wire format (jaxtop/wire/protocol.py)."""

from __future__ import annotations

import io
import json
import math
import types

import pytest

from jaxtop.wire import protocol
from jaxtop.wire.protocol import ProtocolError, ReadStats, decode, encode, iter_records


def read_all(data: bytes, stats: ReadStats | None = None) -> list[dict]:
    return list(iter_records(io.BytesIO(data), stats))


# -- encode / decode -----------------------------------------------------------


def test_encode_is_one_compact_line():
    line = encode({"type": "sample", "t": 1.5, "devices": [{"id": 0, "bytes_in_use": 12}]})
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert b" " not in line  # compact separators
    assert json.loads(line) == {"type": "sample", "t": 1.5, "devices": [{"id": 0, "bytes_in_use": 12}]}


def test_encode_escapes_newlines_inside_strings():
    # A record must never span two lines, whatever the strings contain.
    line = encode({"type": "event", "t": 0.0, "text": "a\nb\r\nc\u2028"})
    assert line.count(b"\n") == 1
    assert decode(line)["text"] == "a\nb\r\nc\u2028"


@pytest.mark.parametrize(
    "record",
    [
        {"type": "hello", "t": 1700000000.25, "protocol": 1, "argv": ["x.py", "--n", "3"]},
        {"type": "sample", "t": 2.0, "seq": 7, "devices": [], "nested": {"a": [1, 2, {"b": None}]}},
        {"type": "event", "t": 3.0, "text": "ünïcødé ✓", "big": 2**62, "neg": -1, "flag": False},
    ],
)
def test_round_trip(record):
    assert decode(encode(record)) == record
    assert decode(encode(record).decode()) == record  # str input too


def test_nan_and_inf_become_null_recursively():
    record = {
        "type": "sample",
        "t": 1.0,
        "frag": math.nan,
        "rates": [1.0, math.inf, -math.inf],
        "nested": {"x": math.nan, "y": (2.0, math.nan)},
        "ok": 0.5,
    }
    line = encode(record)
    assert b"NaN" not in line and b"Infinity" not in line
    # Strict JSON readers (jq, browsers) accept it.
    strict = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert strict == {
        "type": "sample",
        "t": 1.0,
        "frag": None,
        "rates": [1.0, None, None],
        "nested": {"x": None, "y": [2.0, None]},
        "ok": 0.5,
    }


def test_encode_does_not_mutate_its_input():
    record = {"type": "sample", "t": 1.0, "v": [math.nan]}
    encode(record)
    assert math.isnan(record["v"][0])


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"{\"type\": \"sample\", \"t\": 1\n",  # cut mid-object
        b"[1, 2, 3]\n",  # not an object
        b"{\"t\": 1.0}\n",  # no type
        b"{\"type\": 5, \"t\": 1.0}\n",  # type not a string
        b"\xff\xfe{\"type\":\"x\"}\n",  # not UTF-8
        b"\"sample\"\n",
        b"[" * 2000 + b"\n",  # RecursionError inside json.loads
        b'{"a":' * 5000 + b"\n",
        b'{"type": "x", "v": ' + b"[" * 100_000 + b"\n",
    ],
)
def test_decode_rejects_non_records(line):
    with pytest.raises(ProtocolError):
        decode(line)


def test_decode_raises_only_protocol_error(monkeypatch):
    # The agent decodes lines from any peer: whatever the decoder raises
    # must come out as ProtocolError, never escape as something else.
    def broken(_line):
        raise TypeError("the decoder broke")

    monkeypatch.setattr(protocol, "json", types.SimpleNamespace(loads=broken))
    with pytest.raises(ProtocolError, match="the decoder broke"):
        decode(b'{"type": "ping"}')


def test_protocol_error_is_a_value_error():
    # Callers that catch ValueError (e.g. around json) still catch ours.
    assert issubclass(ProtocolError, ValueError)


# -- iter_records ----------------------------------------------------------------


def test_iter_records_reads_every_line_in_order():
    records = [{"type": "sample", "t": float(i), "seq": i} for i in range(1, 6)]
    data = b"".join(encode(r) for r in records)
    stats = ReadStats()
    assert read_all(data, stats) == records
    assert stats.records == 5
    assert stats.malformed == 0
    assert stats.truncated is False
    assert stats.first_error is None


def test_truncated_last_line_is_skipped_and_flagged():
    good = [encode({"type": "hello", "t": 1.0}), encode({"type": "sample", "t": 2.0, "seq": 1})]
    cut = encode({"type": "sample", "t": 3.0, "seq": 2})[:-7]  # a killed writer
    stats = ReadStats()
    out = read_all(b"".join(good) + cut, stats)
    assert [r["type"] for r in out] == ["hello", "sample"]
    assert stats.truncated is True
    assert stats.malformed == 0  # a truncated tail is not "malformed"
    assert stats.records == 2


def test_truncated_last_line_that_happens_to_be_valid_json_is_still_skipped():
    # Without its newline we cannot know the writer finished the line.
    data = encode({"type": "hello", "t": 1.0}) + b'{"type":"sample","t":2.0}'
    stats = ReadStats()
    assert [r["type"] for r in read_all(data, stats)] == ["hello"]
    assert stats.truncated is True


def test_malformed_lines_are_counted_and_skipped():
    data = (
        encode({"type": "hello", "t": 1.0})
        + b"garbage\n"
        + b"{\"no_type\": 1}\n"
        + b"\xff\xff\n"
        + encode({"type": "sample", "t": 2.0})
    )
    stats = ReadStats()
    out = read_all(data, stats)
    assert [r["type"] for r in out] == ["hello", "sample"]
    assert stats.malformed == 3
    assert stats.records == 2
    assert stats.first_error is not None and stats.first_error.startswith("line 2:")
    assert [e.split(":")[0] for e in stats.errors] == ["line 2", "line 3", "line 4"]


def test_error_list_is_capped_but_count_is_not():
    data = b"x\n" * 50 + encode({"type": "sample", "t": 1.0})
    stats = ReadStats()
    assert len(read_all(data, stats)) == 1
    assert stats.malformed == 50
    assert len(stats.errors) == 20
    assert stats.first_error == stats.errors[0]


def test_blank_lines_are_ignored_silently():
    data = b"\n" + encode({"type": "hello", "t": 1.0}) + b"\n  \n" + encode({"type": "sample", "t": 2.0})
    stats = ReadStats()
    assert len(read_all(data, stats)) == 2
    assert stats.malformed == 0


def test_unknown_fields_and_types_pass_through_untouched():
    future = {"type": "quantum_state", "t": 9.0, "qubits": [1, 0], "x_new_field": {"deep": True}}
    sample = {"type": "sample", "t": 1.0, "seq": 1, "unknown_metric_bytes": 123}
    data = encode(future) + encode(sample)
    stats = ReadStats()
    assert read_all(data, stats) == [future, sample]
    assert stats.malformed == 0


def test_crlf_line_endings_are_accepted():
    data = b'{"type":"hello","t":1.0}\r\n{"type":"sample","t":2.0}\r\n'
    assert [r["type"] for r in read_all(data)] == ["hello", "sample"]


def test_oversized_line_is_skipped_and_reading_resumes(monkeypatch):
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 100)
    huge = b'{"type":"sample","t":1.0,"pad":"' + b"x" * 1000 + b'"}\n'
    data = encode({"type": "hello", "t": 0.0}) + huge + encode({"type": "sample", "t": 2.0, "seq": 2})
    stats = ReadStats()
    out = read_all(data, stats)
    assert [r["type"] for r in out] == ["hello", "sample"]
    assert out[1]["seq"] == 2
    assert stats.malformed == 1
    assert "too long" in stats.first_error
    assert stats.truncated is False


def test_line_exactly_at_the_limit_is_accepted(monkeypatch):
    line = encode({"type": "sample", "t": 1.0, "pad": "y" * 50})
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", len(line) - 1)  # limit excludes "\n"
    stats = ReadStats()
    assert len(read_all(line, stats)) == 1
    assert stats.malformed == 0


def test_oversized_last_line_without_newline_ends_cleanly(monkeypatch):
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 64)
    data = encode({"type": "hello", "t": 0.0}) + b"z" * 500
    stats = ReadStats()
    assert [r["type"] for r in read_all(data, stats)] == ["hello"]
    assert stats.malformed == 1


def test_real_limit_rejects_a_line_over_16_mib():
    huge = b'{"type":"sample","t":1.0,"pad":"' + b"x" * protocol.MAX_RECORD_LINE_BYTES + b'"}\n'
    data = huge + encode({"type": "sample", "t": 2.0, "seq": 2})
    stats = ReadStats()
    out = read_all(data, stats)
    assert [r.get("seq") for r in out] == [2]
    assert stats.malformed == 1


def test_iter_records_works_without_stats_and_on_empty_streams():
    assert read_all(b"") == []
    assert read_all(b"garbage\n") == []  # no stats object: still no exception


def test_iter_records_reads_from_a_file(tmp_path):
    path = tmp_path / "run.jsonl"
    records = [{"type": "hello", "t": 1.0}, {"type": "sample", "t": 2.0, "v": None}]
    path.write_bytes(b"".join(encode(r) for r in records))
    with open(path, "rb") as f:
        assert list(iter_records(f)) == records


@pytest.mark.parametrize("block", [7, 64, 1 << 20])
def test_iter_blocks_skips_what_iter_lines_skips(monkeypatch, block):
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 100)
    monkeypatch.setattr(protocol, "BLOCK_BYTES", block)
    lines = [
        encode({"type": "hello", "t": 0.0}),
        b'{"type":"sample","t":1.0,"pad":"' + b"x" * 1000 + b'"}\n',  # over the limit
        b"\n",
        b'{"type":"sample","pad":"' + b"y" * (100 - 26) + b'"}\n',  # exactly the limit
        b'{"type":"sample","pad":"' + b"y" * (101 - 26) + b'"}\n',  # one byte over
        encode({"type": "sample", "t": 2.0, "seq": 2}),
        b'{"type":"sample","t":3.0',  # truncated
    ]
    assert len(lines[3]) == 101 and len(lines[4]) == 102
    data = b"".join(lines)
    by_lines = ReadStats()
    expected = [line for _, line in protocol.iter_lines(io.BytesIO(data), by_lines)]
    by_blocks = ReadStats()
    got, skipped = [], 0
    for blk in protocol.iter_blocks(io.BytesIO(data), by_blocks):
        if blk is None:
            skipped += 1
        else:
            got += [line for line in blk.splitlines(keepends=True) if line.strip()]
    assert got == expected
    assert skipped == by_lines.malformed == 2
    assert by_blocks.truncated and by_lines.truncated


def test_stream_encoder_writes_what_encode_writes_and_reuses_equal_fields():
    enc = protocol.StreamEncoder()
    records = [
        {"type": "sample", "t": 1.5, "seq": 1, "devices": [{"id": 0, "bytes": 5}], "x": {"nan": float("nan")}},
        {"type": "sample", "t": 1.6, "seq": 2, "devices": [{"id": 0, "bytes": 5}], "x": {"nan": 1.0}},
        {"type": "sample", "t": 1.7, "seq": 3, "devices": [{"id": 0, "bytes": 6}], "x": {"nan": 1.0}, "é": "ü"},
        {"type": "sample", "t": -0.0, "seq": 10**30, "a": True, "b": None, "c": 1e300, "d": float("inf"), "e": False},
    ]
    for rec in records:
        assert enc.encode(rec) == protocol.encode(rec)
    # A value changed in place, handed over again as the same object, is encoded afresh.
    same = {"type": "sample", "t": 2.0, "d": {"a": 1}}
    assert enc.encode(same) == protocol.encode(same)
    same["d"]["a"] = 2
    assert enc.encode(same) == protocol.encode(same)
