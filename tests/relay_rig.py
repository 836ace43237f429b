"""The stderr relay's test rig: a Relay (probes/_relay.py) writing into two
pipes a test reads back, guard lines as jaxlib writes them, and the reports
the relay makes of them. Shared by the relay's test modules; conftest's
``rig`` fixture makes Rigs and closes them.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from jaxtop.probes import _relay
from jaxtop.probes._relay import Relay

RELAY_PATH = Path(_relay.__file__)
TOKEN = b"c0ffee42"

GUARD_H2D = (
    b"W1202 18:34:30.919532    2146 guard_lib.cc:125] host-to-device transfer: "
    b"aval=ShapedArray(float32[1000,1000]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0), "
    b"memory_kind=device)\n"
)
GUARD_CACHED = b"W1202 18:34:30.920001    2146 guard_lib.cc:125] host-to-device transfer: \n"
GUARD_D2D = (
    b"W1202 19:10:03.642390    6082 guard_lib.cc:140] device-to-device transfer: "
    b"aval=ShapedArray(bfloat16[8]), sharding=SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device), "
    b"dst_sharding=SingleDeviceSharding(device=CpuDevice(id=1), memory_kind=device)\n"
)
GUARD_OLD = (
    b"W0611 09:01:02.000017   31337 external/xla/xla/python/transfer_guard_lib.cc:149] "
    b"device-to-host transfer: shape=(2,3), dtype=F32, device=cuda:0\n"
)
GUARD_TSL = (  # jaxlib before 0.7 logged through XLA/TSL, with this header
    b"2026-12-03 19:09:21.852989: W external/xla/xla/python/transfer_guard_lib.cc:108] "
    b"host-to-device transfer: aval=ShapedArray(float32[3]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))\n"
)
GUARD_TSL_TID = (  # ... and with TF_CPP_LOG_THREAD_ID, a thread id after the severity
    b"2026-12-03 19:09:21.900001: W    4242 external/xla/xla/python/transfer_guard_lib.cc:140] "
    b"device-to-device transfer: aval=ShapedArray(int8[2]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=1))\n"
)
OTHER_WARNING = b"W1202 18:34:31.000001    2146 cpu_client.cc:77] something else entirely\n"
OTHER_ERROR = b"E1202 18:34:31.000002    2146 cpu_client.cc:78] a real error\n"


def G(line: bytes, n: int = 1) -> bytes:
    """The relay's report of n guard lines with this line's message."""
    return b"G %d %s\n" % (n, line.split(b"] ", 1)[1].rstrip(b"\n"))


def marker(verb: str, arg: str, token: bytes = TOKEN) -> bytes:
    return b"\x00jaxtop:" + token + b":" + f"{verb} {arg}".encode() + b"\x00"


def reported_runs(payload: bytes) -> list[tuple[str, float]]:
    """A ``T`` report's runs (``dir,thread,HEX``) as ``(dir,thread, Unix time)`` per line."""
    out = []
    for run in payload.split():
        direction, thread, hexed = run.decode().split(",")
        raw = bytes.fromhex(hexed)
        out += [(f"{direction},{thread}", t) for t in struct.unpack(f"{len(raw) // 8}d", raw)]
    return out


def _time_of_day(t: float) -> str:
    lt = time.localtime(t)
    return f"{lt.tm_hour:02d}:{lt.tm_min:02d}:{round(t % 60, 6):09.6f}"


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


class Rig:
    """A Relay writing into two pipes that the test reads back."""

    def __init__(self, passed=()):
        self.out_r, self.out_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        for fd in (self.out_r, self.rep_r, self.rep_w):
            os.set_blocking(fd, False)  # rep_w as main() sets it
        self.relay = Relay(self.out_w, self.rep_w, TOKEN, set(passed))
        self._out = b""
        self._rep = b""

    def feed(self, *chunks: bytes) -> "Rig":
        for c in chunks:
            self.relay.feed(c)
        return self

    @property
    def out(self) -> bytes:
        self._out += _drain(self.out_r)
        return self._out

    @property
    def all_reports(self) -> bytes:
        self._rep += _drain(self.rep_r)
        return self._rep

    @property
    def reports(self) -> bytes:
        """The reports but the stamps (``T`` lines: tests/test_transfer_sites.py's)."""
        return b"".join(line for line in self.all_reports.splitlines(keepends=True) if not line.startswith(b"T "))

    @property
    def stamps(self) -> list[str]:
        """Each stamped line as ``dir,thread,HH:MM:SS.ffffff`` (its Unix time read back as local time)."""
        return [f"{head},{_time_of_day(t)}" for line in self.all_reports.splitlines() if line.startswith(b"T ")
                for head, t in reported_runs(line[2:])]

    def close(self):
        for fd in (self.out_r, self.out_w, self.rep_r, self.rep_w):
            try:
                os.close(fd)
            except OSError:
                pass
