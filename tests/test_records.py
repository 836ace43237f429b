"""The typed wire records (:mod:`jaxtop.wire.records`) held to what writes
them, what documents them and what their decoder promises.

The streams against the types (docs/protocol.md against them:
tests/test_records_doc.py; the decoder's promises:
tests/test_records_decoder.py):

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
import json
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
from jaxtop.wire.records import RECORD_TYPES, Sample, Unknown, decode
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


def test_the_agent_sides_figure_declarations_name_fields_of_the_types():
    """jaxtop.wire.schema declares the figures (key, unit, help) for the
    stdlib side (the agent's Prometheus exposition, the CSV columns); the
    record types declare the same parts for the dashboard's side. A figure
    the schema names must be a field of its part's type, or one side reads
    n/a where the other reads a number."""
    from jaxtop.wire import records, schema

    for figures, cls in ((schema.DEVICE, records.Device), (schema.LIVE_ARRAYS, records.LiveArrays),
                         (schema.TRANSFER, records.Transfer), (schema.PROCESS, records.Process),
                         (schema.COMPILE, records.Compile), (schema.DONATION, records.Donation)):
        missing = set(schema.keys(figures)) - set(cls.__struct_fields__)
        assert not missing, (cls.__name__, missing)
    assert set(schema.DEVICE_PARTS) <= set(records.Device.__struct_fields__)
    assert set(schema.LIVE_ARRAYS_PARTS) <= set(records.LiveArrays.__struct_fields__)
    assert set(schema.SAMPLE_FIELDS) - {"type"} <= set(records.Sample.__struct_fields__)
