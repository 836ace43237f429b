"""docs/protocol.md held to the typed wire records (:mod:`jaxtop.wire.records`):
the fields its tables and lists name are the structs' fields, and, where the
doc has a table for a part, every field of the struct has its row. Renaming
a field on either side fails here."""

from __future__ import annotations

import itertools
import re
from typing import Callable

import pytest

from jaxtop.wire.records import RECORD_TYPES, Backfill, Hello, Sample
from test_records import DOC, _field_types, _fields, _probe_parts, _structs_in

# == 2. docs/protocol.md against the types ====================================================

_SPAN = re.compile(r"`([^`]+)`")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
#: A key of a ``{...}`` span: after its opening brace, a comma or a
#: bracket, quoted or not, maybe marked optional (``note?``), and followed
#: by what ends a key (``:``, ``,``, ``}``, ``]``) -- so a value (``true``)
#: or prose (``{core label: ...}``) is not taken for one.
_BRACE_KEY = re.compile(r'(?:^|[{,\[])\s*"?([A-Za-z_]\w*)"?\??(?=\s*[:,}\]])')
_JSON_WORDS = {"true", "false", "null"}


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _section(heading: str) -> str:
    """The text under the heading that starts with ``heading`` (``### `hello```),
    up to the next heading of its level or above."""
    lines = _doc().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"docs/protocol.md has {len(starts)} headings {heading!r}"
    level = len(heading) - len(heading.lstrip("#"))
    out = []
    for line in lines[starts[0] + 1:]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes:hashes + 1] == " ":
            break
        out.append(line)
    return "\n".join(out)


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _rows(text: str) -> dict[str, str]:
    """The first table of ``text``: each name in a row's first cell (one
    or more backticked names) with the row's last cell, its meaning."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))
    assert len(table) > 2, "no table"
    out: dict[str, str] = {}
    for line in table[2:]:  # past the header and its rule
        cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])  # "str \| null" is one cell
        for name in _names(cells[0]):
            assert name not in out, f"{name} has two rows"
            out[name] = cells[-1]
    return out


def _names(text: str) -> set[str]:
    """The backticked names of ``text`` (``rss_bytes``), JSON's words left out."""
    return {s for s in _SPAN.findall(text) if _IDENTIFIER.fullmatch(s)} - _JSON_WORDS


def _keys(text: str) -> set[str]:
    """The keys of the backticked objects of ``text`` (``{available, reason}``)."""
    return {k for s in _SPAN.findall(text) if s.startswith("{") for k in _BRACE_KEY.findall(s)}


def _unparenthesised(text: str) -> str:
    """``text`` without its parenthesised asides, where the doc quotes
    names of other parts (``hello.started_t``, ``ru_maxrss``)."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def _terms(text: str) -> set[str]:
    """The names a list in prose defines: each run of backticked names
    followed by a colon (``scan_interval_s``, ``scan_cpu_s``: ...)."""
    runs = re.findall(r"((?:`\w+`(?:,\s*)?)+):", _unparenthesised(text))
    return {name for run in runs for name in _names(run)}


def _part(cls: type, name: str) -> type:
    """The struct that types the part ``name`` of ``cls`` (through lists)."""
    structs = _structs_in(_field_types(cls)[name])
    assert structs, f"{cls.__name__}.{name} holds no struct"
    return structs[0]


#: The doc's rules say once that a probe's part may be ``{"error": ...}``
#: (test_the_rules_say_a_probe_part_may_be_its_error); the parts do not
#: repeat it.
PROBE_ERROR = {"error"}


def test_the_helpers_read_the_doc_as_written():
    # What the checks below rely on, on text shaped like the doc's.
    assert _keys("`{available: true, devices: [{index, name, uuid, jax_id}]}` or `{available: false, reason}`") == {
        "available", "devices", "index", "name", "uuid", "jax_id", "reason"}
    assert _keys("`{available, guard, note?, reason?}`; `{core label: programs waiting}`") == {
        "available", "guard", "note", "reason"}
    assert _names("`rss_bytes`, `null`, `hello.started_t`, `{a, b}`") == {"rss_bytes"}
    assert _unparenthesised("`a` (b (`c`) d), `e`") == "`a` , `e`"
    assert _terms("x: `a`: one; `b`, `c`: two (`d`: no); `e` is not") == {"a", "b", "c"}
    assert _rows("| field | type | meaning |\n|---|---|---|\n| `a`, `b` | str \\| null | m |\n") == {"a": " m ",
                                                                                                   "b": " m "}


def test_the_rules_say_a_probe_part_may_be_its_error():
    rules = _section("# jaxtop wire format").split("## Where the stream comes from")[0]
    rule = next(item for item in rules.split("\n* ") if '`{"error": "…"}`' in item)
    assert set(_probe_parts()) | {"devices"} <= _names(rule)
    for part in _probe_parts():
        assert "error" in _field_types(_part(Sample, part)), part


def test_the_hello_table_has_a_row_for_each_field_of_hello():
    assert set(_rows(_section("### `hello`"))) == _fields(Hello)


def test_the_sample_table_has_a_row_for_each_field_of_sample():
    assert set(_rows(_section("### `sample`"))) == _fields(Sample)
    # A backfill is a kept sample, "otherwise the same bytes".
    assert _fields(Backfill) == _fields(Sample)


@pytest.mark.parametrize("heading,cls", [("### `hello`", Hello), ("### `sample`", Sample)])
def test_the_objects_a_row_spells_out_are_its_parts_fields(heading, cls):
    # `history`: `{present_first: true, backfill_s, ...}`, `devices`: one
    # `{id, platform, kind, process_index}` per device... A row naming one
    # struct names all of its fields; one reaching several (nvml and its
    # GPUs) names only some of them, none that is not a field.
    checked = 0
    for name, meaning in _rows(_section(heading)).items():
        keys = _keys(meaning)
        structs = _structs_in(_field_types(cls)[name])
        if not keys or not structs:
            continue
        known = set().union(*(_field_types(s) for s in structs))
        assert keys <= known, (name, keys - known)
        if len(structs) == 1:
            assert keys == known - PROBE_ERROR, (name, (known - PROBE_ERROR) - keys)
        checked += 1
    assert checked >= (4 if cls is Hello else 0)


def test_the_agent_row_defines_each_field_of_agent():
    meaning = _rows(_section("### `sample`"))["agent"]
    assert _terms(meaning) == _fields(_part(Sample, "agent"))


def test_the_devices_table_has_a_row_for_each_field_of_a_device():
    assert set(_rows(_section("#### `devices[]`"))) == _fields(_part(Sample, "devices"))


#: Names the ``live_arrays`` row quotes that are not its fields, each for a
#: reason the row gives. Kept exact: a name that leaves the row leaves here.
LIVE_ARRAYS_QUOTES = {
    "bytes_in_use",  # the device's own figure, which in_use_bytes is compared with
    "last_address",  # in recordings of earlier agents only
    "not_ready", "sharded",  # the keys of unmapped
}


def test_the_live_arrays_row_names_each_field_of_live_arrays():
    meaning = _rows(_section("#### `devices[]`"))["live_arrays"]
    live = _part(_part(Sample, "devices"), "live_arrays")
    named = _names(_unparenthesised(meaning)) | _keys(_unparenthesised(meaning))
    assert LIVE_ARRAYS_QUOTES <= named
    assert named - LIVE_ARRAYS_QUOTES == _fields(live)
    # `top` (the 10 largest buffers: `nbytes, dtype, shape, ptr`)
    top = re.search(r"the 10 largest buffers: `([^`]*)`", meaning)
    assert top is not None
    assert {n.strip() for n in top.group(1).split(",")} == _fields(_part(live, "top"))


def test_the_transfers_section_names_each_field_of_transfers():
    text = _section("#### `transfers`")
    transfers = _part(Sample, "transfers")
    directions = _names(_unparenthesised(_paragraphs(text)[0]))
    shapes = next(p for p in _paragraphs(text) if p.startswith("`top_shapes`"))
    assert directions | _names(shapes) == _fields(transfers) - PROBE_ERROR
    assert _keys(shapes) == _fields(_part(transfers, "top_shapes"))
    for direction in directions:
        assert set(_rows(text)) == _fields(_part(transfers, direction))


@pytest.mark.parametrize("part", ["process", "compile", "donation"])
def test_a_prose_part_names_each_of_its_fields(part):
    # "`rss_bytes`, `vms_bytes`, `cpu_percent` (100 = one core, ...), ...
    # On error: `{available: false, reason}`": asides quote other parts.
    text = _unparenthesised(_paragraphs(_section(f"#### `{part}`"))[0])
    assert _names(text) | _keys(text) == _fields(_part(Sample, part)) - PROBE_ERROR


def test_the_nvml_section_and_hello_name_each_field_of_nvml_and_its_gpus():
    # The sample's readings in its own section, the names and the reason
    # (samples leave nvml out when it is n/a) in hello's row.
    text = _section("#### `nvml`")
    named = _names(text) | _keys(text) | _keys(_rows(_section("### `hello`"))["nvml"])
    nvml = _part(Sample, "nvml")
    assert named == (_fields(nvml) | _fields(_part(nvml, "devices"))) - PROBE_ERROR


def test_the_accelerator_table_has_a_row_for_each_field_of_accelerator():
    rows = _rows(_section("#### `accelerator`"))
    accelerator = _part(Sample, "accelerator")
    assert set(rows) == _fields(accelerator) - PROBE_ERROR
    metrics = _structs_in(_field_types(accelerator)["metrics"])
    if metrics:  # typed metric by metric: the row names each of them
        assert _names(rows["metrics"]) == _fields(metrics[0])


def _history_end_text() -> str:
    return re.search(r"`history_end`: (`\{[^`]*\}`)", _section("### History on connecting")).group(1)


#: Where the doc lists each other record's fields, by the record's type.
OTHER_RECORDS: dict[str, Callable[[], str]] = {
    "backend": lambda: _unparenthesised(_section("### `backend`").split("Fields:")[1]),
    "dropped": lambda: _paragraphs(_section("### `dropped`"))[0].split(":")[0],
    "error": lambda: _paragraphs(_section("### `error`"))[0].split(":")[0],
    "exit": lambda: _paragraphs(_section("### `exit`"))[0].split(":")[0],
    "history_end": _history_end_text,
    "history": lambda: "".join(f"`{name}`" for name in _rows(_section("#### `history`"))),
}


@pytest.mark.parametrize("kind", list(OTHER_RECORDS))
def test_the_other_records_are_documented_field_by_field(kind):
    doc = OTHER_RECORDS[kind]()
    assert _names(doc) | _keys(doc) == _fields(RECORD_TYPES[kind])
