"""AgentConnection against real sockets: a socketpair, or a Unix socket at
our own pid's path in a private socket directory."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
import tracemalloc

import pytest

from jaxtop.wire import client, protocol


@pytest.fixture
def pair():
    ours, peer = socket.socketpair()
    agent = client.AgentConnection(ours)
    yield agent, peer
    agent.close()
    peer.close()


def feed(peer: socket.socket, *pieces: bytes, pause_s: float = 0.02, close: bool = True) -> threading.Thread:
    """Send ``pieces`` from a thread, pausing between them so they arrive as separate reads."""

    def run() -> None:
        for piece in pieces:
            peer.sendall(piece)
            time.sleep(pause_s)
        if close:
            peer.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def collect(lines, within_s: float = 5.0) -> list[bytes]:
    """Read ``lines`` to their end in a thread; fail, not hang, if that takes over ``within_s``."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(lines), daemon=True)
    reader.start()
    reader.join(within_s)
    assert not reader.is_alive(), f"reading did not end within {within_s} s"
    return got


def test_lines_split_across_reads_are_reassembled(pair):
    agent, peer = pair
    a, b, c = b'{"type":"hello","t":1}\n', b"\n", b'{"type":"sample","t":2,"pad":"' + b"x" * 300 + b'"}\n'
    stream = a + b + c
    feed(peer, stream[:5], stream[5:23], stream[23:24], stream[24:100], stream[100:])
    agent.RECV_BYTES = 7  # many reads per line, and reads that end mid-line
    assert collect(agent.lines(poll_s=1.0)) == [a, b, c]


def test_a_batch_holds_the_whole_lines_of_one_read(pair):
    agent, peer = pair
    feed(peer, b"one\ntwo\nthr", b"ee\n")
    assert collect(agent.batches(poll_s=1.0)) == [[b"one\n", b"two\n"], [b"three\n"]]


@pytest.mark.parametrize("recv_bytes", [16, 1 << 16], ids=["over many reads", "within one read"])
def test_an_oversized_line_is_skipped_and_reported_and_the_next_arrives(pair, monkeypatch, recv_bytes):
    agent, peer = pair
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 64)
    at_limit = b"a" * 64 + b"\n"  # the limit excludes the newline
    over = b"b" * 65 + b"\n"
    huge = b"c" * 1000 + b"\n"
    feed(peer, b"first\n" + at_limit + over + huge + b"last\n")
    agent.RECV_BYTES = recv_bytes
    reported = []
    got = collect(agent.lines(poll_s=1.0, on_oversized=lambda: reported.append(True)))
    assert got == [b"first\n", at_limit, b"last\n"]
    assert len(reported) == 2 and agent.oversized_lines == 2


def test_an_endless_line_is_read_in_bounded_memory(pair, monkeypatch):
    agent, peer = pair
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 64 * 1024)
    payload = b"x" * (8 << 20)  # allocated before tracing: only the reader's memory counts
    tracemalloc.start()
    try:
        feed(peer, payload, b"\nafter\n", pause_s=0)
        got = collect(agent.lines(poll_s=1.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [b"after\n"] and agent.oversized_lines == 1
    assert peak < 1 << 20  # a few reads and the limit, not the 8 MiB line


def test_commands_carry_increasing_ids(pair):
    agent, peer = pair
    ids = [agent.send_command("detach"), agent.send_command("snapshot", {"n": 1})]
    peer.settimeout(2)
    stream = peer.makefile("rb")
    requests = [json.loads(stream.readline()) for _ in ids]
    assert ids == [1, 2]
    assert [(r["type"], r["name"], r["args"], r["id"]) for r in requests] == [
        ("command", "detach", {}, 1), ("command", "snapshot", {"n": 1}, 2)]


def test_commands_from_many_threads_arrive_whole_with_distinct_ids(pair):
    agent, peer = pair
    # Larger than the socket buffer, so each send blocks part way: without
    # the lock, another thread's request would land inside it.
    pad = "y" * (512 << 10)
    threads = [threading.Thread(target=lambda: [agent.send_command("x", {"pad": pad}) for _ in range(5)])
               for _ in range(4)]
    received = io.BytesIO()

    def drain() -> None:
        peer.settimeout(5)
        while received.getvalue().count(b"\n") < 20:
            received.write(peer.recv(1 << 16))

    drainer = threading.Thread(target=drain)
    drainer.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drainer.join()
    ids = [protocol.decode(line)["id"] for line in received.getvalue().splitlines()]
    assert sorted(ids) == list(range(1, 21))


def test_a_closed_peer_ends_iteration_without_its_unfinished_line(pair):
    agent, peer = pair
    peer.sendall(b"whole\npart")
    peer.close()
    assert collect(agent.lines(poll_s=5.0), within_s=2.0) == [b"whole\n"]


def test_the_stop_hook_ends_a_blocked_read_in_bounded_time(pair):
    agent, _peer = pair
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert collect(agent.lines(should_stop=stop.is_set, poll_s=0.05), within_s=2.0) == []
    assert time.monotonic() - started > 0.25


def test_shutdown_from_another_thread_ends_a_read(pair):
    agent, _peer = pair
    threading.Timer(0.2, agent.shutdown).start()
    assert collect(agent.lines(poll_s=30.0), within_s=5.0) == []


class Listener:
    """A Unix socket at our own pid's path: sends ``lines``, then closes."""

    def __init__(self, sockdir, lines: list[bytes]) -> None:
        self.path = str(sockdir / f"{os.getpid()}.sock")
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(1)
        self.received = b""
        self.thread = threading.Thread(target=self.serve, args=(lines,), daemon=True)
        self.thread.start()

    def serve(self, lines: list[bytes]) -> None:
        conn, _ = self.server.accept()
        with conn:
            for line in lines:
                conn.sendall(line)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(2)
            while chunk := conn.recv(4096):
                self.received += chunk
        self.server.close()


def test_open_connects_to_a_listening_agent_and_talks_both_ways(sockdir):
    hello = protocol.encode({"type": "hello", "t": 1.0, "argv": ["train.py"]})
    listener = Listener(sockdir, [hello])
    with client.AgentConnection.open(os.getpid()) as agent:
        assert agent.send_command("detach") == 1
        assert collect(agent.lines(poll_s=1.0)) == [hello]
    listener.thread.join(5)
    assert protocol.decode(listener.received)["name"] == "detach"


def test_open_removes_a_stale_socket_and_says_so(sockdir):
    path = sockdir / f"{os.getpid()}.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # bound but never listening: connections are refused
    dead.close()
    with pytest.raises(client.AgentNotFound, match="stale socket"):
        client.AgentConnection.open(os.getpid())
    assert not path.exists()


def test_open_without_a_socket_says_how_to_start_an_agent(sockdir):
    with pytest.raises(client.AgentNotFound, match="no jaxtop agent"):
        client.AgentConnection.open(os.getpid())


def test_record_writes_whole_lines_byte_for_byte(sockdir, monkeypatch):
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 200)
    good = [protocol.encode({"type": "hello", "t": 1.0}), b"{not json\n", protocol.encode({"type": "sample", "t": 2.0})]
    Listener(sockdir, [good[0], good[1], b"z" * 500 + b"\n", good[2], b'{"type":"sample","t":3'])
    out, decoded = io.BytesIO(), []
    assert client.record(os.getpid(), out, on_record=decoded.append) == 3
    assert out.getvalue() == b"".join(good)
    assert [r["type"] for r in decoded] == ["hello", "sample"]


def test_list_agents_reads_the_hello(sockdir):
    Listener(sockdir, [protocol.encode({"type": "hello", "t": 1.0, "argv": ["train.py", "--x"], "started_t": 5.0})])
    [info] = client.list_agents()
    assert (info.pid, info.argv, info.started_t) == (os.getpid(), ["train.py", "--x"], 5.0)
