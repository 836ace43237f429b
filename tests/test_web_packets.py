"""Pure: the web driver's packets reach textual-serve whole, from two threads.

Textual's web driver writes each packet (``P``/``D``/``M``, a 4-byte size,
the payload) with a bare ``os.write`` from the app's thread and from its
input thread (file chunks). Here ``os.write`` takes at most 1,000 bytes a
call and yields between calls, as a pipe that is nearly full does: without
:func:`whole_packet_writes` the stream cannot be read back into packets.
"""

from __future__ import annotations

import os
import threading
import time
from functools import partial


from jaxtop.dashboard import web


class Driver:
    """What whole_packet_writes needs of Textual's WebDriver: ``fileno`` and ``_write``."""

    def __init__(self, fd: int) -> None:
        self.fileno = fd
        self._write = partial(os.write, fd)  # as textual.drivers.web_driver does

    def packet(self, kind: bytes, payload: bytes) -> None:
        self._write(kind + len(payload).to_bytes(4, "big") + payload)


def _stream(patch: bool, monkeypatch) -> list[tuple[bytes, bytes]]:
    real_write = os.write

    def slow_write(fd, data):  # a nearly full pipe: part of the data, then the other thread may run
        n = real_write(fd, bytes(data[:1000]))
        time.sleep(0)
        return n

    monkeypatch.setattr(os, "write", slow_write)
    path = f"/tmp/jaxtop-packets-{os.getpid()}-{patch}"
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    try:
        driver = Driver(fd)
        if patch:
            web.whole_packet_writes(driver)
            web.whole_packet_writes(driver)  # idempotent
        chunk = bytes(range(256)) * 64  # a 16 KiB file chunk
        screen = b"\x1b[2J" * 1500  # a 6 KiB screen update
        threads = [threading.Thread(target=lambda: [driver.packet(b"P", chunk) for _ in range(20)]),
                   threading.Thread(target=lambda: [driver.packet(b"D", screen) for _ in range(20)])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    monkeypatch.setattr(os, "write", real_write)
    data = open(path, "rb").read()
    os.unlink(path)
    packets, at = [], 0
    while at < len(data):
        kind, size = data[at:at + 1], int.from_bytes(data[at + 1:at + 5], "big")
        packets.append((kind, data[at + 5:at + 5 + size]))
        at += 5 + size
    return packets, chunk, screen


def test_each_packet_arrives_whole_and_readable(monkeypatch):
    packets, chunk, screen = _stream(True, monkeypatch)
    assert sorted(k for k, _ in packets) == [b"D"] * 20 + [b"P"] * 20
    assert all(p == (chunk if k == b"P" else screen) for k, p in packets)


def test_without_it_the_stream_breaks(monkeypatch):
    """The failure this guards against, shown: the same writes, unpatched."""
    packets, chunk, screen = _stream(False, monkeypatch)
    assert not (len(packets) == 40 and all(p == (chunk if k == b"P" else screen) for k, p in packets))


def test_a_driver_it_does_not_know_is_left_alone():
    class Other:
        pass

    other = Other()
    web.whole_packet_writes(other)
    web.whole_packet_writes(None)
    assert not hasattr(other, "_write")
