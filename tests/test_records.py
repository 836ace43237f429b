"""The typed wire records (:mod:`jaxtop.wire.records`) held to what writes
them, what documents them and what their decoder promises.

Three checks, each able to fail on its own:

* **The streams against the types.** Every key a real agent writes (a run
  started here, the recordings under ``tests/fixtures/``, the TPU ones
  included) and every key of the synthetic stream
  (:mod:`jaxtop.testing.synthetic`) is a field of the struct that types its
  part. The agent cannot import msgspec, so it writes plain dicts: a key it
  adds or renames would otherwise be dropped by the decoder without a word
  and read n/a in some view. Parts typed as JSON (``Raw``, ``Any``) are
  their readers' business and are not walked.
* **docs/protocol.md against the types.** The fields its tables and lists
  name are the structs' fields, and, where the doc has a table for a part,
  every field of the struct has its row.
* **The decoder.** Its fast path (msgspec) and careful path (``json.loads``)
  agree on every line of the recordings; whatever a line holds, what comes
  out is a record whose strings a terminal cannot obey, whose fields have
  their types (or read n/a, noted in ``odd``), or a ``ProtocolError``.

Pure and fast (no Textual), but for one test marked ``slow`` that starts a
real agent the way tests/test_schema.py does. hypothesis is not installed in
this project's venv, so the hostile inputs are enumerated: every unsafe
character, in every encoding, at every kind of position.
"""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import re
import subprocess
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Union

import msgspec
import pytest

from jaxtop.testing import synthetic
from jaxtop.wire.protocol import ProtocolError
from jaxtop.wire.records import RECORD_TYPES, Backfill, Hello, Sample, Unknown, decode, from_dict, is_clean
from jaxtop.wire.records.core import ODD_KEY

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DOC = ROOT / "docs" / "protocol.md"

#: Every stream recorded by an agent that the fixtures hold: CPU, the demo's
#: worker, a synthetic GPU stream, and the recordings made on a TPU v5e.
RECORDINGS = sorted(FIXTURES.glob("*.jsonl")) + sorted((FIXTURES / "tpu").glob("*.jsonl.gz"))
#: An OOM census as the agent wrote it on a TPU (a record of its own).
CENSUS = FIXTURES / "tpu" / "oom-census.json"


# == introspecting the types ===================================================================

_UNIONS = (Union, types.UnionType)


def _members(tp: Any) -> list[Any]:
    """The types ``tp`` may hold: a union's members (None left out), each
    with ``Annotated`` metadata taken off."""
    out = list(typing.get_args(tp)) if typing.get_origin(tp) in _UNIONS else [tp]
    out = [typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in out]
    return [m for m in out if m is not type(None)]


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _structs_in(tp: Any) -> list[type]:
    """The struct classes a value of type ``tp`` may hold, at any depth
    (through unions, lists and dict values), outermost first."""
    out: list[type] = []

    def visit(t: Any) -> None:
        for m in _members(t):
            if _is_struct(m):
                if m not in out:
                    out.append(m)
                    for f in msgspec.structs.fields(m):
                        visit(f.type)
            elif typing.get_origin(m) in (list, tuple, dict):
                for arg in typing.get_args(m):
                    if arg is not Ellipsis:
                        visit(arg)

    visit(tp)
    return out


def _field_types(cls: type) -> dict[str, Any]:
    """A struct's fields as the wire names them, with their types."""
    return {f.encode_name: f.type for f in msgspec.structs.fields(cls)}


def _fields(cls: type) -> set[str]:
    """A struct's fields as the wire names them; a record's less those
    every record has (``t``, which the doc's rules describe once, and the
    decoder's own ``odd`` notes, which no stream can write)."""
    names = set(_field_types(cls))
    return names - {"t", ODD_KEY} if cls.__struct_config__.tag is not None else names


_PLANS: dict[int, tuple[Any, ...]] = {}


def _plan(tp: Any) -> tuple[Any, ...]:
    """How to walk a value of type ``tp``: ``(struct, item, value)``, the
    struct it may be (its fields and tag field), the type of its items if
    it may be a list, of its values if it may be a typed dict; each None
    where that shape holds no struct, so nothing there needs walking (a
    buffer map's thousands of pairs are not visited)."""
    plan = _PLANS.get(id(tp))
    if plan is None:
        struct = item = value = None
        for m in _members(tp):
            origin = typing.get_origin(m)
            if _is_struct(m) and struct is None:
                struct = (_field_types(m), m.__struct_config__.tag_field)  # tag: a record's "type", the class itself
            elif origin in (list, tuple) and _structs_in(typing.get_args(m)[0]):
                item = typing.get_args(m)[0]
            elif origin is dict and _structs_in(typing.get_args(m)[1]):
                value = typing.get_args(m)[1]
        plan = _PLANS[id(tp)] = (struct, item, value, tp)  # tp kept alive: its id stays its own
    return plan


def untyped_keys(value: Any, tp: Any, where: str, out: collections.Counter) -> None:
    """Count in ``out`` each key of ``value`` that its type ``tp`` does not
    name, by its path (``sample.devices[].live_arrays.foo``).

    Only the parts typed as structs are walked, through lists and typed
    dicts; a part typed ``Raw`` or ``Any`` is JSON its readers take apart.
    A value of the wrong shape is the decoder's business (it reads n/a and
    is noted), not this walk's: it is left alone.
    """
    struct, item_type, value_type, _ = _plan(tp)
    if struct is not None and value.__class__ is dict:
        fields, tag = struct
        for key, item in value.items():
            if key in fields:
                untyped_keys(item, fields[key], f"{where}.{key}", out)
            elif key != tag:
                out[f"{where}.{key}"] += 1
    elif item_type is not None and value.__class__ is list:
        for item in value:
            untyped_keys(item, item_type, f"{where}[]", out)
    elif value_type is not None and value.__class__ is dict:
        for item in value.values():  # the keys are data (device ids, metric names), not fields
            untyped_keys(item, value_type, f"{where}.*", out)


def untyped_keys_of(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Every key that ``records`` write and their types do not name, with
    how many times; a record ``type`` that has no class is one too."""
    out: collections.Counter = collections.Counter()
    for record in records:
        cls = RECORD_TYPES.get(record.get("type"))
        if cls is None:
            out[f"{record.get('type')!r}: a record type with no class"] += 1
        else:
            untyped_keys(record, cls, str(record["type"]), out)
    return dict(out)


def _lines(path: Path) -> list[bytes]:
    """A recording's non-blank lines (plain or gzip-compressed)."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return [line for line in f.read().splitlines() if line.strip()]


def _synthetic_records() -> list[dict[str, Any]]:
    """The synthetic GPU stream: a hello and samples, maps included."""
    return [synthetic.hello(7, 8, 0.0), *synthetic.samples(7, 8, 0.0, 40, 0.1, map_every=5)]


# == 1. the streams against the types ===========================================================

def test_the_walk_names_each_key_the_types_lack_by_its_path():
    # The check below is only as good as this walk: keys at every depth,
    # through lists and typed dicts, are found; Raw parts are not walked.
    record = {
        "type": "sample", "t": 1.0, "seq": 1, "new_part": 1,
        "devices": [{"id": 0, "live_arrays": {"bytes": 1, "new_figure": 2, "top": [{"nbytes": 1, "new": 0}]}},
                    {"id": 1, "live_arrays": {"new_figure": 3}}],
        "transfers": {"h2d": {"count": 1, "new_count": 0}},
        "nvml": {"devices": [{"index": 0, "new_reading": 1}]},
        "demo": {"anything": {"goes": 1}},  # Raw: its readers' keys
    }
    found = untyped_keys_of([record, {"type": "no_such_record", "t": 1.0}])
    assert found == {
        "sample.new_part": 1,
        "sample.devices[].live_arrays.new_figure": 2,
        "sample.devices[].live_arrays.top[].new": 1,
        "sample.transfers.h2d.new_count": 1,
        "sample.nvml.devices[].new_reading": 1,
        "'no_such_record': a record type with no class": 1,
    }


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_key_of_a_recording_is_a_typed_field(path):
    records = [json.loads(line) for line in _lines(path)]
    assert records and records[0]["type"] == "hello"
    assert untyped_keys_of(records) == {}


def test_every_key_of_an_oom_census_is_a_typed_field_and_reaches_its_reader():
    census = json.loads(CENSUS.read_text())
    assert census["type"] == "oom_census"
    assert untyped_keys_of([census]) == {}
    record = decode(json.dumps(census).encode())
    assert record.odd == ()
    # Each part the agent wrote is there to read (none fell to n/a).
    names = {f.encode_name: f.name for f in msgspec.structs.fields(type(record))}
    for key, value in census.items():
        if key != "type":
            assert (getattr(record, names[key]) is None) == (value is None), key


def test_every_key_of_the_synthetic_stream_is_a_typed_field():
    records = _synthetic_records()
    assert any("map" in (d.get("live_arrays") or {}) for r in records for d in r.get("devices", []))
    assert untyped_keys_of(records) == {}


#: The sample's struct-typed parts that no probe fills: ``agent`` is the
#: agent loop's own, ``oom_census`` a census inside a sample (recordings of
#: earlier agents; the census probe fills no field).
NOT_PROBES = {"agent", "oom_census"}


def _probe_parts() -> list[str]:
    """The sample's parts that a probe fills and that are typed as structs:
    each may be ``{"error": ...}`` on a sample where its probe raised
    (jaxtop.agent.probe_list)."""
    return [name for name, tp in _field_types(Sample).items()
            if name not in NOT_PROBES and any(_is_struct(m) for m in _members(tp))]


@pytest.mark.parametrize("part", _probe_parts())
def test_a_probes_error_is_kept_in_the_part_it_fills(part):
    record = decode(json.dumps({"type": "sample", "t": 1.0, "seq": 1, part: {"error": "ValueError: boom"}}))
    assert record.odd == ()
    assert getattr(record, part).error == "ValueError: boom"


def test_a_probes_error_where_a_list_belongs_reads_n_a_and_is_noted():
    # The devices probe fails the same way, but its part is a list: the
    # decoder cannot keep the message there, so the field reads n/a and
    # the dashboard says why once (the doc's rule names devices too).
    record = decode(b'{"type":"sample","t":1.0,"seq":1,"devices":{"error":"ValueError: boom"}}')
    assert record.devices is None
    assert [(o.where, o.should) for o in record.odd] == [("devices", "an array")]


#: A program run under the agent that makes it write every record it can on
#: a CPU: the live stream (--log) and, over the socket, the greeting a
#: client gets (hello with its history, the present, backfill, the coarse
#: level, history_end), the answers to requests, and a fatal error.
AGENT_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys, time
    import jaxtop
    out = sys.argv[1]
    jaxtop.instrument(interval_s=0.05, slow_interval_s=0.1, log_path=os.path.join(out, "run.jsonl"))
    import jax, jax.numpy as jnp, numpy as np
    f = jax.jit(lambda x: x * 2, donate_argnums=0)
    x = f(jnp.arange(1000.0))
    float(x[0])                                   # a host sync
    params = {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)}
    jaxtop.label("params", params)                # labels
    g = jax.jit(lambda a, b: a + b)
    for i in range(20):                           # recompiles, implicit transfers and their lines
        float(g(np.ones(i + 1), 1.0).sum())
    time.sleep(1.0)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(os.path.join(os.environ["JAXTOP_SOCKET_DIR"], f"{os.getpid()}.sock"))
    for request in ({"type": "ping", "id": 1}, {"type": "command", "name": "ping", "id": 2},
                    {"type": "command", "name": "no_such_command", "id": 3},
                    {"type": "command", "name": "memory_profile", "args": {"directory": "relative"}, "id": 4}):
        sock.sendall(json.dumps(request).encode() + b"\\n")
    sock.settimeout(0.2)
    data = b""

    def read_for(seconds):
        global data
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                continue
            if not chunk:
                return
            data += chunk

    read_for(1.5)
    sock.sendall(b"not json\\n")                  # a fatal error record, then the agent closes
    read_for(1.0)
    with open(os.path.join(out, "socket.jsonl"), "wb") as fh:
        fh.write(data)
""")


@pytest.mark.slow
def test_a_real_agents_records_have_only_typed_keys_and_decode_clean(child_env, tmp_path):
    result = subprocess.run([sys.executable, "-c", AGENT_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                            env=child_env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = _lines(tmp_path / "run.jsonl") + _lines(tmp_path / "socket.jsonl")
    records = [json.loads(line) for line in lines]
    # The run wrote what this test means to check: else it checks nothing.
    kinds = {r["type"] for r in records}
    assert {"hello", "backend", "sample", "backfill", "history", "history_end", "pong", "reply", "error",
            "exit"} <= kinds, kinds
    parts = {key for r in records if r["type"] in ("sample", "backfill") for key in r}
    assert {"devices", "transfers", "process", "compile", "donation", "agent", "transfer_capture", "jit", "labels",
            "host_syncs", "transfer_sites", "final", "present"} <= parts, parts
    assert any("history" in r for r in records if r["type"] == "hello")

    assert untyped_keys_of(records) == {}
    # And every value has its declared type: nothing read n/a.
    for line in lines:
        record = decode(line)
        assert not isinstance(record, Unknown), line[:200]
        assert record.odd == (), (record.odd, line[:200])


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
