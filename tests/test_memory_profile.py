"""The pprof decoder on hand-built bytes, and take_profile on real jax (CPU)."""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

from jaxtop.probes import memory_profile as mp

MIB = 1 << 20


# --------------------------------------------------------------------------
# A tiny protobuf encoder, for building test messages by hand
# --------------------------------------------------------------------------

def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 -> 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def f_varint(number: int, value: int) -> bytes:
    return key(number, 0) + varint(value)


def f_bytes(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def f_packed(number: int, values: list[int]) -> bytes:
    return f_bytes(number, b"".join(varint(v) for v in values))


def f_fixed64(number: int, value: int) -> bytes:
    return key(number, 1) + value.to_bytes(8, "little")


def f_fixed32(number: int, value: int) -> bytes:
    return key(number, 5) + value.to_bytes(4, "little")


def f_group(number: int, inner: bytes) -> bytes:
    return key(number, 3) + inner + key(number, 4)


def unknown_fields() -> bytes:
    """One unknown field of every wire type: a decoder must skip them all."""
    return (
        f_varint(90, 12345)
        + f_fixed64(91, 0xFFFF_FFFF_FFFF_FFFF)
        + f_bytes(92, b"\x08\x01junk")
        + f_fixed32(93, 0xDEADBEEF)
        + f_group(94, f_varint(1, 7) + f_group(2, f_bytes(3, b"x")))
    )


class ProfileBuilder:
    """Builds a pprof Profile the way jaxlib lays it out."""

    def __init__(self) -> None:
        self.strings = [""]
        self.functions: dict[tuple[str, str], int] = {}
        self.locations: dict[tuple[int, int], int] = {}
        self.body = b""

    def s(self, text: str) -> int:
        if text not in self.strings:
            self.strings.append(text)
        return self.strings.index(text)

    def loc(self, name: str, filename: str, line: int) -> int:
        fkey = (name, filename)
        if fkey not in self.functions:
            fid = len(self.functions) + 1
            self.functions[fkey] = fid
            self.body += f_bytes(5, f_varint(1, fid) + f_varint(2, self.s(name))
                                 + f_varint(3, self.s(name)) + f_varint(4, self.s(filename)))
        fid = self.functions[fkey]
        lkey = (fid, line)
        if lkey not in self.locations:
            lid = len(self.locations) + 1
            self.locations[lkey] = lid
            self.body += f_bytes(4, f_varint(1, lid) + f_bytes(4, f_varint(1, fid) + f_varint(2, line)))
        return self.locations[lkey]

    def sample(self, stack, count: int, nbytes: int, kind: str, device: str | None = None) -> None:
        """``stack``: [(name, file, line)], innermost first."""
        ids = [self.loc(*frame) for frame in stack]
        msg = f_packed(1, ids) + f_packed(2, [count, nbytes])
        msg += f_bytes(3, f_varint(1, self.s("kind")) + f_varint(2, self.s(kind)))
        if device is not None:
            msg += f_bytes(3, f_varint(1, self.s("device")) + f_varint(2, self.s(device)))
        self.body += f_bytes(2, msg)

    def build(self, gz: bool = True, strings_first: bool = False) -> bytes:
        types = (f_bytes(1, f_varint(1, self.s("allocations")) + f_varint(2, self.s("count")))
                 + f_bytes(1, f_varint(1, self.s("space")) + f_varint(2, self.s("bytes"))))
        table = b"".join(f_bytes(6, t.encode()) for t in self.strings)
        raw = (table + types + self.body) if strings_first else (types + self.body + table)
        raw += unknown_fields()
        return gzip.compress(raw) if gz else raw


JAX_DISPATCH = [
    ("__call__", "/venv/lib/python3.11/site-packages/jax/_src/interpreters/pxla.py", 1285),
    ("cache_miss", "/venv/lib/python3.11/site-packages/jax/_src/pjit.py", 250),
]
JNP_ONES = [("ones", "/venv/lib/python3.11/site-packages/jax/_src/numpy/array_creation.py", 98)]


# --------------------------------------------------------------------------
# Wire decoding
# --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**63 - 1, 2**64 - 1])
def test_varint_round_trip(value):
    encoded = varint(value)
    assert mp.read_varint(encoded + b"\x99", 0) == (value, len(encoded))


def test_varint_known_bytes_and_errors():
    assert mp.read_varint(b"\xac\x02", 0) == (300, 2)
    assert mp.read_varint(b"\x00\x96\x01", 1) == (150, 3)
    with pytest.raises(mp.ProfileDecodeError):
        mp.read_varint(b"\x80\x80", 0)  # truncated
    with pytest.raises(mp.ProfileDecodeError):
        mp.read_varint(b"\xff" * 11 + b"\x01", 0)  # longer than 10 bytes


def test_packed_varints():
    assert mp.packed_varints(b"") == []
    assert mp.packed_varints(b"\x01\xac\x02\x00\x80\x80\x80\x02") == [1, 300, 0, 4 * MIB]
    with pytest.raises(mp.ProfileDecodeError):
        mp.packed_varints(b"\x01\x80")


def test_iter_fields_skips_every_unknown_wire_type():
    msg = f_varint(1, 5) + unknown_fields() + f_bytes(2, b"abc") + f_packed(3, [7, 8])
    got = [(n, w, v if w == 0 else bytes(v)) for n, w, v in mp.iter_fields(msg)]
    # wire 0 and 2 unknowns are yielded (the caller ignores their numbers);
    # fixed64, fixed32 and groups never reach the caller.
    assert got == [
        (1, 0, 5),
        (90, 0, 12345),
        (92, 2, b"\x08\x01junk"),
        (2, 2, b"abc"),
        (3, 2, b"\x07\x08"),
    ]


@pytest.mark.parametrize("bad", [
    f_bytes(2, b"abc")[:-1],          # length past the end
    key(1, 1) + b"\x00" * 7,          # fixed64 cut short
    key(1, 5) + b"\x00" * 3,          # fixed32 cut short
    key(1, 3) + f_varint(2, 1),       # group never closed
    key(1, 3) + key(2, 4),            # group closed by the wrong number
    key(1, 6) + b"\x00",              # no such wire type
    key(1, 7) + b"\x00",
    b"\x00\x01",                      # field number 0
])
def test_iter_fields_rejects_malformed(bad):
    with pytest.raises(mp.ProfileDecodeError):
        list(mp.iter_fields(bad))


def test_repeated_fields_accept_unpacked_encoding():
    b = ProfileBuilder()
    lid = b.loc("train", "/home/u/train.py", 10)
    b.s("kind"), b.s("buffer")
    # Sample with location_id and value as one varint each, not packed.
    b.body += f_bytes(2, f_varint(1, lid) + f_varint(2, 2) + f_varint(2, 4096)
                      + f_bytes(3, f_varint(1, b.s("kind")) + f_varint(2, b.s("buffer"))))
    profile = mp.decode_profile(b.build(gz=False))
    (sample,) = profile.samples
    assert sample.location_ids == [lid]
    assert sample.values == [2, 4096]
    assert sample.labels == {"kind": "buffer"}


def test_decode_profile_fields_and_negative_int64():
    b = ProfileBuilder()
    b.sample([("f", "/a/b.py", 3)], 1, 10, "buffer", "cpu:0")
    b.body += f_bytes(2, f_packed(2, [1, -5]) + f_bytes(3, f_varint(1, b.s("n")) + f_varint(3, -2)))
    profile = mp.decode_profile(b.build(gz=False, strings_first=True))
    assert profile.sample_types == [("allocations", "count"), ("space", "bytes")]
    assert profile.functions == {1: ("f", "/a/b.py")}
    assert profile.locations == {1: [(1, 3)]}
    assert profile.samples[0].labels == {"kind": "buffer", "device": "cpu:0"}
    assert profile.samples[1].values == [1, -5]
    assert profile.samples[1].labels == {"n": -2}


# --------------------------------------------------------------------------
# Aggregation on a hand-built profile
# --------------------------------------------------------------------------

def hand_built_profile() -> bytes:
    b = ProfileBuilder()
    user_big = ("make_params", "/home/u/model.py", 42)
    user_loop = ("step", "/home/u/train.py", 17)
    main = ("<module>", "/home/u/train.py", 90)
    # 3 x 1 MiB params from jnp.ones inside make_params, on two devices.
    b.sample(JAX_DISPATCH + JNP_ONES + [user_big, main], 2, 2 * MIB, "buffer", "cuda:0")
    b.sample(JAX_DISPATCH + JNP_ONES + [user_big, main], 1, 1 * MIB, "buffer", "cuda:1")
    # Many small activations from step.
    b.sample(JAX_DISPATCH + [user_loop, main], 100, 100 * 1024, "buffer", "cuda:0")
    # Executable compiled from step: a code-size allocation with no device.
    b.sample([("backend_compile", "/venv/lib/python3.11/site-packages/jax/_src/compiler.py", 300)]
             + JAX_DISPATCH + [user_loop, main], 1, 5000, "executable")
    # Only library frames: the site falls back to the innermost frame.
    b.sample([("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>", 1)]
             + JAX_DISPATCH, 1, 64, "buffer", "cuda:0")
    # No stack at all.
    b.sample([], 1, 8, "buffer", "cuda:1")
    return b.build()


def test_summarize_totals_kinds_devices():
    summary = mp.summarize_profile(hand_built_profile())
    json.dumps(summary)  # JSON-serialisable
    assert summary["total_bytes"] == 3 * MIB + 100 * 1024 + 5000 + 64 + 8
    assert summary["total_allocations"] == 2 + 1 + 100 + 1 + 1 + 1
    assert summary["by_kind"] == {"buffer": 3 * MIB + 100 * 1024 + 64 + 8, "executable": 5000}
    assert summary["by_device"] == {"cuda:0": 2 * MIB + 100 * 1024 + 64, "cuda:1": MIB + 8}
    assert summary["sample_types"] == [["allocations", "count"], ["space", "bytes"]]


def test_summarize_sites_pick_innermost_user_frame():
    sites = mp.summarize_profile(hand_built_profile())["top_sites"]
    assert [s["site"] for s in sites] == [
        "make_params (model.py:42)",
        "step (train.py:17)",
        # only library frames: the innermost one
        "<frozen importlib._bootstrap> (<frozen importlib._bootstrap>:1)",
        "<no stack>",
    ]
    big, step, lib, empty = sites
    assert (big["bytes"], big["allocations"], big["kinds"]) == (3 * MIB, 3, {"buffer": 3})
    assert big["file"] == "/home/u/model.py"
    # The stack starts at the site and walks outwards.
    assert big["stack"] == ["make_params (model.py:42)", "<module> (train.py:90)"]
    # Buffers and the executable compiled from step group under step.
    assert (step["bytes"], step["allocations"]) == (100 * 1024 + 5000, 101)
    assert step["kinds"] == {"buffer": 100, "executable": 1}
    assert lib["stack"][1:] == ["__call__ (pxla.py:1285)", "cache_miss (pjit.py:250)"]
    assert empty == {"site": "<no stack>", "file": "", "bytes": 8, "allocations": 1,
                     "kinds": {"buffer": 1}, "stack": []}


def test_summarize_top_and_stack_depth():
    b = ProfileBuilder()
    deep = [(f"f{i}", "/home/u/deep.py", i) for i in range(20)]
    b.sample(deep, 1, 10, "buffer", "cpu:0")
    b.sample([("g", "/home/u/g.py", 1)], 1, 5, "buffer", "cpu:0")
    summary = mp.summarize_profile(b.build(), top=1)
    (site,) = summary["top_sites"]
    assert site["site"] == "f0 (deep.py:0)"
    assert len(site["stack"]) == mp.STACK_DEPTH
    assert site["stack"][-1] == "f7 (deep.py:7)"
    assert mp.summarize_profile(b.build(), top=0)["top_sites"] == []


def test_summarize_accepts_uncompressed_and_rejects_garbage():
    raw = hand_built_profile()
    assert mp.summarize_profile(gzip.decompress(raw)) == mp.summarize_profile(raw)
    with pytest.raises(mp.ProfileDecodeError):
        mp.summarize_profile(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(mp.ProfileDecodeError):
        mp.summarize_profile(gzip.compress(b"\xff\xff"))
    with pytest.raises(mp.ProfileDecodeError):  # no bytes sample type
        mp.summarize_profile(gzip.compress(f_bytes(6, b"")))


# --------------------------------------------------------------------------
# Real jax on CPU, in this process
# --------------------------------------------------------------------------

@pytest.fixture
def jax():
    return pytest.importorskip("jax")


def make_big_buffer():
    import jax.numpy as jnp

    return jnp.ones((MIB,), dtype=jnp.float32)  # 4 MiB


def test_take_profile_real(tmp_path, jax):
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        big = make_big_buffer()
        big.block_until_ready()
    out_dir = tmp_path / "profiles"  # does not exist yet
    result = mp.take_profile(out_dir, top=50, backend="cpu")
    assert "error" not in result, result
    json.dumps(result)

    path = result["path"]
    name = os.path.basename(path)
    assert os.path.dirname(path) == str(out_dir)
    assert name.startswith(f"jaxtop-memprof-{os.getpid()}-") and name.endswith(".prof")
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw[:2] == b"\x1f\x8b"
    gzip.decompress(raw)  # valid gzip, kept as jax wrote it

    assert result["sample_types"] == [["allocations", "count"], ["space", "bytes"]]
    assert result["total_bytes"] >= 4 * MIB
    assert result["by_kind"]["buffer"] >= 4 * MIB
    # The profile's device label: "cpu:0" (jax 0.10.2) or the client's "TFRT_CPU_0" (jax 0.4.30)
    assert max(result["by_device"].get(label, 0) for label in ("cpu:0", "TFRT_CPU_0")) >= 4 * MIB
    assert 0 <= result["seconds"] < 5
    ours = [s for s in result["top_sites"]
            if s["site"].startswith("make_big_buffer (test_memory_profile.py:")]
    assert ours, [s["site"] for s in result["top_sites"]]
    assert ours[0]["bytes"] >= 4 * MIB
    assert ours[0]["file"] == __file__
    assert ours[0]["stack"][1].startswith("test_take_profile_real (test_memory_profile.py:")
    del big

    # A second profile within the same second keeps both files.
    again = mp.take_profile(out_dir, backend="cpu")
    assert "error" not in again and again["path"] != path


def test_take_profile_errors_are_returned(tmp_path, monkeypatch, jax):
    jax.devices("cpu")  # backend exists
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad_dir = mp.take_profile(blocker / "sub", backend="cpu")
    assert set(bad_dir) == {"error"} and "cannot write profile" in bad_dir["error"]

    bad_backend = mp.take_profile(tmp_path, backend="no-such-backend")
    assert set(bad_backend) == {"error"} and "\n" not in bad_backend["error"]

    monkeypatch.setattr(jax.profiler, "device_memory_profile", lambda backend=None: b"\x1f\x8bnot gzip")
    garbage = mp.take_profile(tmp_path / "g")
    assert "cannot decode profile" in garbage["error"]

    monkeypatch.delattr(jax.profiler, "device_memory_profile")
    assert "has no jax.profiler.device_memory_profile" in mp.take_profile(tmp_path)["error"]


def test_take_profile_does_not_create_a_backend(tmp_path, monkeypatch, jax):
    monkeypatch.setattr(mp, "_backend_initialised", lambda: False)
    assert "no jax backend" in mp.take_profile(tmp_path)["error"]
    monkeypatch.delitem(sys.modules, "jax")
    assert mp.take_profile(tmp_path) == {"error": "jax is not imported in this process"}
    assert list(tmp_path.iterdir()) == []
