"""Prometheus metrics from an agent's stream (prometheus-client).

Served by the agent itself (``jaxtop run --prometheus PORT``,
``jaxtop.instrument(prometheus_port=PORT)``, ``JAXTOP_PROMETHEUS_PORT``) or
re-exported by ``jaxtop log PID --prometheus PORT``. Both feed a
:class:`StreamState` with the records they see; the collector turns the
latest sample into metrics when Prometheus scrapes, so a scrape costs the
agent nothing between scrapes. Names and labels: docs/cluster.md.

A value the sample does not have (n/a, e.g. fragmentation on CPU) is left
out, never exported as 0.

Who can read the metrics: the endpoint binds loopback (127.0.0.1) unless
told otherwise, and loopback is open to **every local user** of the machine,
not only to the program's owner (unlike the agent's socket, which is 0600 in
a 0700 directory). They see what the metrics say: device memory, transfer and
compile counts, RSS, CPU, the pid and host. To restrict them, bind an
address only the intended scraper reaches (``--prometheus-addr`` /
``prometheus_addr``), and filter the port with a firewall (e.g. an
``iptables -m owner --uid-owner`` rule on ``OUTPUT`` for loopback, or a rule
admitting only the scraper's address on a non-loopback bind); or leave the
endpoint off and re-export with ``jaxtop log PID --prometheus PORT`` from a
process and place of your choosing.

What any peer can cost the program is bounded: the server serves at most
:data:`MAX_CONNECTIONS` connections at once (one thread each) and closes
extra connections as soon as it accepts them; it answers at most
:data:`SCRAPES_PER_S` requests a second on average; every read and write
times out after :data:`SOCKET_TIMEOUT_S`. So it never holds more than
``MAX_CONNECTIONS + 2`` file descriptors and ``MAX_CONNECTIONS + 1`` threads,
however many connections are opened. A peer can at worst keep the metrics
from other scrapers (by holding the connections), never the program's own
descriptors or threads.
"""

from __future__ import annotations

import errno
import http.server
import socket
import socketserver
import threading
import time
from typing import Any, Iterator

from jaxtop.wire import protocol, schema

INSTALL_HINT = "prometheus-client is not installed: pip install 'jaxtop[prometheus]' (or prometheus-client)"
DEFAULT_ADDR = "127.0.0.1"

#: Connections served at once; more are closed as soon as accepted.
MAX_CONNECTIONS = 8
#: Seconds any one read or write on a connection may take before it is closed.
SOCKET_TIMEOUT_S = 5.0
#: Requests answered per second on average (bursts of SCRAPE_BURST); more are
#: closed unanswered. Prometheus scrapes every few seconds at most.
SCRAPES_PER_S = 10.0
SCRAPE_BURST = 20

_DEVICE_GAUGES = tuple(
    # (metric, sample key, help): the help is the sample's own (jaxtop.wire.schema)
    (metric, key, schema.figure(schema.DEVICE, key).help) for metric, key in (
        ("jaxtop_device_bytes_in_use", "bytes_in_use"),
        ("jaxtop_device_peak_bytes_in_use", "peak_bytes_in_use"),
        ("jaxtop_device_pool_bytes", "pool_bytes"),
        ("jaxtop_device_limit_bytes", "bytes_limit"),
        ("jaxtop_device_largest_free_block_bytes", "largest_free_block_bytes"),
        ("jaxtop_device_fragmentation_ratio", "fragmentation"),
    ))


class StreamState:
    """The latest records of one agent stream. Written by one thread, read
    by the scraping thread; each field is replaced whole, never mutated."""

    def __init__(self) -> None:
        self.hello: dict[str, Any] = {}
        self.devices: dict[int, dict[str, Any]] = {}  # id -> description (process_index, platform)
        self.sample: dict[str, Any] | None = None

    def update(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == protocol.SAMPLE:
            self.sample = record
        elif kind in (protocol.HELLO, protocol.BACKEND):
            if kind == protocol.HELLO:
                self.hello = record
            described = {d.get("id"): d for d in record.get("devices") or [] if isinstance(d, dict)}
            if described:
                self.devices = described


def make_registry(state: StreamState, host: str | None = None) -> Any:
    """A prometheus-client registry whose only collector reads ``state``."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    host = host or socket.gethostname()

    class Collector:
        def collect(self) -> Iterator[Any]:
            sample = state.sample
            pid = str(state.hello.get("pid", ""))
            if sample is None:
                return
            proc_labels = ["host", "pid", "process_index"]
            index = _process_index(state)
            base = [host, pid, index]

            info = GaugeMetricFamily("jaxtop_sample_seq", "Sequence number of the sample these values come from.",
                                     labels=proc_labels)
            info.add_metric(base, sample.get("seq") or 0)
            yield info
            ts = GaugeMetricFamily("jaxtop_sample_timestamp_seconds", "Unix time of that sample.", labels=proc_labels)
            ts.add_metric(base, sample.get("t") or 0)
            yield ts

            dev_labels = ["device", "platform", "host", "pid", "process_index"]
            families = {name: GaugeMetricFamily(name, text, labels=dev_labels) for name, _, text in _DEVICE_GAUGES}
            live = GaugeMetricFamily("jaxtop_device_live_array_bytes", "Bytes of live jax.Arrays on the device (slow-cadence scan).",
                                     labels=dev_labels)
            for dev in sample.get("devices") or []:
                described = state.devices.get(dev.get("id"), {})
                labels = [str(dev.get("id")), str(dev.get("platform") or described.get("platform") or ""), host, pid,
                          str(described.get("process_index", index))]
                for name, key, _ in _DEVICE_GAUGES:
                    value = dev.get(key)
                    if isinstance(value, (int, float)):
                        families[name].add_metric(labels, value)
                la = (dev.get("live_arrays") or {}).get("bytes")
                if isinstance(la, (int, float)):
                    live.add_metric(labels, la)
            yield from families.values()
            yield live

            tr = sample.get("transfers") or {}
            dir_labels = ["direction", "host", "pid", "process_index"]
            count = CounterMetricFamily("jaxtop_transfers", "Implicit transfers seen by the transfer guard.", labels=dir_labels)
            known = CounterMetricFamily("jaxtop_transfer_known_bytes",
                                        "Bytes of implicit transfers whose size was logged (a lower bound).", labels=dir_labels)
            for d in protocol.DIRECTIONS:
                x = tr.get(d)
                if isinstance(x, dict) and isinstance(x.get("count_total"), int):
                    count.add_metric([d] + base, x["count_total"])
                    known.add_metric([d] + base, x.get("bytes_known_total") or 0)
            yield count
            yield known

            comp = sample.get("compile") or {}
            don = sample.get("donation") or {}
            proc = sample.get("process") or {}
            cpu = proc.get("cpu_percent")
            for family in (
                _one(CounterMetricFamily, "jaxtop_compiles", "XLA compilations (jax.monitoring).",
                     proc_labels, base, comp.get("count_total")),
                _one(CounterMetricFamily, "jaxtop_compile_seconds", "Seconds spent compiling.",
                     proc_labels, base, comp.get("seconds_total")),
                _one(CounterMetricFamily, "jaxtop_donation_failures", "'Some donated buffers were not usable' warnings.",
                     proc_labels, base, don.get("failed_total")),
                _one(GaugeMetricFamily, "jaxtop_process_resident_memory_bytes", "Resident set size of the process.",
                     proc_labels, base, proc.get("rss_bytes")),
                _one(GaugeMetricFamily, "jaxtop_process_cpu_ratio", "CPU use of the process (1 = one full core).",
                     proc_labels, base, cpu / 100.0 if protocol.is_number(cpu) else None),
            ):
                if family is not None:
                    yield family
            nvml = sample.get("nvml") or {}
            if nvml.get("available"):
                gpu_labels = ["gpu", "host", "pid", "process_index"]
                used = GaugeMetricFamily("jaxtop_gpu_memory_used_bytes", "NVML: memory used on the GPU (all processes).",
                                         labels=gpu_labels)
                mine = GaugeMetricFamily("jaxtop_gpu_process_memory_bytes", "NVML: this process's memory on the GPU.",
                                         labels=gpu_labels)
                for g in nvml.get("devices") or []:
                    labels = [str(g.get("index")), host, pid, index]
                    if isinstance(g.get("memory_used_bytes"), (int, float)):
                        used.add_metric(labels, g["memory_used_bytes"])
                    if isinstance(g.get("process_memory_bytes"), (int, float)):
                        mine.add_metric(labels, g["process_memory_bytes"])
                yield used
                yield mine

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return registry


def _one(cls: Any, name: str, text: str, labels: list[str], values: list[str], value: Any) -> Any:
    """A one-sample metric family, or None when the value is missing (n/a)."""
    if not protocol.is_number(value):
        return None
    family = cls(name, text, labels=labels)
    family.add_metric(values, value)
    return family


def _process_index(state: StreamState) -> str:
    for d in state.devices.values():
        if "process_index" in d:
            return str(d["process_index"])
    return "0"


class MetricsServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """An HTTP server with bounded connections, threads and time.

    Args:
        address: ``(host, port)`` to bind.
        handler: the request handler class.
        family: the address family of ``host``.
    """

    daemon_threads = True
    block_on_close = False  # and so keeps no list of its threads either
    request_queue_size = 16

    def __init__(self, address: tuple[str, int], handler: Any, family: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._tokens = float(SCRAPE_BURST)
        self._tokens_t = time.monotonic()
        super().__init__(address, handler)

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # The connection stays queued and the listener readable:
                # rest (on this server's own thread) rather than spin.
                time.sleep(0.1)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Within the request budget? (Runs on the serving thread only.)"""
        now = time.monotonic()
        self._tokens = min(float(SCRAPE_BURST), self._tokens + (now - self._tokens_t) * SCRAPES_PER_S)
        self._tokens_t = now
        if self._tokens < 1.0:
            return False  # closed unanswered
        self._tokens -= 1.0
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: closed at once
            return
        try:
            request.settimeout(SOCKET_TIMEOUT_S)
            super().process_request(request, client_address)  # starts its thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that misbehaves is no news for the program's stderr."""


def serve(state: StreamState, port: int, addr: str = DEFAULT_ADDR) -> MetricsServer:
    """Start the HTTP endpoint (a daemon thread); returns the server.

    Stop it with ``server.shutdown()`` then ``server.server_close()``.

    Raises:
        ImportError: prometheus-client is missing (message says how to install).
        OSError: the port cannot be bound.
    """
    try:
        from prometheus_client.exposition import MetricsHandler
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    # The address decides the family (an IPv6 address needs AF_INET6).
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server = MetricsServer((sockaddr[0], port), MetricsHandler.factory(make_registry(state)), family)
    thread = threading.Thread(target=server.serve_forever, name="jaxtop-prometheus", daemon=True)
    thread.start()
    return server
