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

What any peer can cost the program is bounded
(:mod:`jaxtop.wire.prometheus_server`): one thread, at most
:data:`MAX_CONNECTIONS` connections held at once (so never more than
``MAX_CONNECTIONS + 2`` file descriptors, however many connections are
opened), paced passes that bound its share of the GIL whatever the request
rate, one deadline of :data:`SOCKET_TIMEOUT_S` for each whole exchange,
bounded request heads, and an exposition rendered at most once a second
and served from a cache. A scrape is answered on the pass that accepts it,
so peers holding connections open do not keep it out.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.parse
from typing import Any, Iterator

from jaxtop.wire import http_deadline, protocol, schema
from jaxtop.wire.prometheus_server import (  # noqa: F401  (re-exported: the limits are documented here)
    CONTENT_TYPE, MAX_CONNECTIONS, SOCKET_TIMEOUT_S, MetricsServer, bind_address,
)
from jaxtop.wire.timeline import nvml_map

#: A URL fit to print (its password replaced): the push notice names the gateway.
redact = http_deadline.redact

INSTALL_HINT = "prometheus-client is not installed: pip install 'jaxtop[prometheus]' (or prometheus-client)"
DEFAULT_ADDR = "127.0.0.1"

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


#: Labels every metric carries: which run, which machine, which process.
PROCESS_LABELS = ["job", "host", "pid", "process_index", "process_count"]


def job_name(text: str | None) -> str | None:
    """A ``job`` label value as given (``--job``, ``$JAXTOP_JOB``), kept
    printable and at most 200 characters; None when empty."""
    if not text:
        return None
    clean = "".join(c if c.isprintable() else "_" for c in str(text)).strip()[:200]
    return clean or None


class StreamState:
    """The latest records of one agent stream. Written by one thread, read
    by the scraping thread; each field is replaced whole, never mutated."""

    def __init__(self, job: str | None = None) -> None:
        self.job = job_name(job)  # a re-exporter's --job, over the agent's
        self.hello: dict[str, Any] = {}
        self.devices: dict[int, dict[str, Any]] = {}  # id -> description (process_index, platform)
        self.distributed: dict[str, Any] = {}  # process_index, process_count, coordinator
        self.sample: dict[str, Any] | None = None
        self.agent: dict[str, Any] = {}  # the agent's own counters (in a sample once a second)
        self.backend: dict[str, Any] = {}  # the backend record (jax is imported by then)

    def update(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == protocol.SAMPLE:
            self.sample = record
            if isinstance(record.get("agent"), dict):
                self.agent = record["agent"]
        elif kind in (protocol.HELLO, protocol.BACKEND):
            if kind == protocol.HELLO:
                self.hello = record
            else:
                self.backend = record
            described = {d.get("id"): d for d in record.get("devices") or [] if isinstance(d, dict)}
            if described:
                self.devices = described
            if isinstance(record.get("distributed"), dict) and record["distributed"]:
                self.distributed = record["distributed"]

    def versions(self) -> dict[str, str]:
        """jax, jaxlib, jaxtop and Python versions (the newest record's that names them)."""
        out = {}
        for record in (self.hello, self.backend):
            got = record.get("versions") if isinstance(record.get("versions"), dict) else {}
            out.update({k: str(v) for k, v in got.items() if k in ("jax", "jaxlib", "jaxtop", "python") and v})
        return out

    def identity(self, host: str | None = None) -> list[str]:
        """The values of :data:`PROCESS_LABELS` for this stream.

        ``host`` is the agent's own (its hello), whoever serves the metrics:
        a re-exporter on another machine does not move the process. ``job``
        is the one the agent was given, else ``jax-COORDINATOR`` for a
        jax.distributed job (every process of it names the same coordinator),
        else the program's name. ``pid`` is the agent's pid: inside a
        container, the pid in the container's namespace (the host and the
        start time tell two such processes apart).
        """
        hello = self.hello
        dist = self.distributed
        job = self.job or job_name(hello.get("job"))
        if job is None and dist.get("coordinator"):
            job = f"jax-{dist['coordinator']}"
        if job is None:
            argv = hello.get("argv") if isinstance(hello.get("argv"), list) else []
            name = os.path.basename(str(argv[0])) if argv else ""
            job = (name[:-3] if name.endswith(".py") else name) or "python"
        index = dist.get("process_index")
        if index is None:
            index = next((d["process_index"] for d in self.devices.values() if "process_index" in d), 0)
        return [job, str(hello.get("host") or host or socket.gethostname()), str(hello.get("pid", "")), str(index),
                str(dist.get("process_count", 1))]


def make_registry(state: StreamState, host: str | None = None) -> Any:
    """A prometheus-client registry whose only collector reads ``state``.

    Args:
        state: the stream's latest records.
        host: the ``host`` label when the stream's hello names none (an old agent).
    """
    from prometheus_client import CollectorRegistry

    class Collector:
        def collect(self) -> Iterator[Any]:
            yield from collect(state, host)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return registry


def collect(state: StreamState, host: str | None = None) -> Iterator[Any]:
    """The metric families of ``state``'s latest sample (none before one)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    sample = state.sample
    if sample is None:
        return
    proc_labels = list(PROCESS_LABELS)
    base = state.identity(host)

    info = GaugeMetricFamily("jaxtop_sample_seq", "Sequence number of the sample these values come from.",
                             labels=proc_labels)
    info.add_metric(base, sample.get("seq") or 0)
    yield info
    ts = GaugeMetricFamily("jaxtop_sample_timestamp_seconds", "Unix time of that sample.", labels=proc_labels)
    ts.add_metric(base, sample.get("t") or 0)
    yield ts
    versions = state.versions()
    names = sorted(versions)
    vinfo = GaugeMetricFamily("jaxtop_versions_info", "1, labelled with the versions of jax, jaxlib, jaxtop and Python.",
                              labels=proc_labels + names)
    vinfo.add_metric(base + [versions[n] for n in names], 1)
    yield vinfo

    dev_labels = ["device", "platform"] + proc_labels
    families = {name: GaugeMetricFamily(name, text, labels=dev_labels) for name, _, text in _DEVICE_GAUGES}
    live = GaugeMetricFamily("jaxtop_device_live_array_bytes", schema.figure(schema.LIVE_ARRAYS, "bytes").help,
                             labels=dev_labels)
    # The join between jax's devices and NVML's GPUs (and the device kind):
    # jaxtop_gpu_* * on(job, host, pid, gpu) group_left(device) jaxtop_device_info
    dinfo = GaugeMetricFamily("jaxtop_device_info", "1 for each device: its kind and NVML index (gpu; empty without NVML).",
                              labels=dev_labels + ["kind", "gpu"])
    nvml_of = nvml_map(state.hello)
    for dev in sample.get("devices") or []:
        if not isinstance(dev, dict):
            continue
        described = state.devices.get(dev.get("id"), {})
        labels = [str(dev.get("id")), str(dev.get("platform") or described.get("platform") or "")] + base
        for name, key, _ in _DEVICE_GAUGES:
            value = dev.get(key)
            if protocol.is_number(value):
                families[name].add_metric(labels, value)
        la = (dev.get("live_arrays") or {}).get("bytes")
        if protocol.is_number(la):
            live.add_metric(labels, la)
        gpu = nvml_of.get(dev.get("id"))
        dinfo.add_metric(labels + [str(described.get("kind") or ""), "" if gpu is None else str(gpu)], 1)
    yield from families.values()
    yield live
    yield dinfo

    tr = sample.get("transfers") or {}
    dir_labels = ["direction"] + proc_labels
    count = CounterMetricFamily("jaxtop_transfers", schema.figure(schema.TRANSFER, "count_total").help,
                                labels=dir_labels)
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
    agent = state.agent
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
        _one(GaugeMetricFamily, "jaxtop_process_start_time_seconds", "Unix time the process started.",
             proc_labels, base, proc.get("started_t") if protocol.is_number(proc.get("started_t"))
             else state.hello.get("started_t")),
        _one(CounterMetricFamily, "jaxtop_agent_cpu_seconds", "CPU seconds jaxtop's agent thread used.",
             proc_labels, base, agent.get("thread_cpu_s_total")),
    ):
        if family is not None:
            yield family
    nvml = sample.get("nvml") or {}
    if nvml.get("available"):
        gpu_labels = ["gpu"] + proc_labels
        used = GaugeMetricFamily("jaxtop_gpu_memory_used_bytes", "NVML: memory used on the GPU (all processes).",
                                 labels=gpu_labels)
        mine = GaugeMetricFamily("jaxtop_gpu_process_memory_bytes", "NVML: this process's memory on the GPU.",
                                 labels=gpu_labels)
        for g in nvml.get("devices") or []:
            if not isinstance(g, dict):
                continue
            labels = [str(g.get("index"))] + base
            if protocol.is_number(g.get("memory_used_bytes")):
                used.add_metric(labels, g["memory_used_bytes"])
            if protocol.is_number(g.get("process_memory_bytes")):
                mine.add_metric(labels, g["process_memory_bytes"])
        yield used
        yield mine


def _one(cls: Any, name: str, text: str, labels: list[str], values: list[str], value: Any) -> Any:
    """A one-sample metric family, or None when the value is missing (n/a)."""
    if not protocol.is_number(value):
        return None
    family = cls(name, text, labels=labels)
    family.add_metric(values, value)
    return family


def serve(state: StreamState, port: int, addr: str = DEFAULT_ADDR) -> MetricsServer:
    """Start the HTTP endpoint (a daemon thread); returns the server.

    Stop it with ``server.shutdown()`` then ``server.server_close()``. What
    a peer can cost the program is bounded (:mod:`jaxtop.wire.prometheus_server`).

    Raises:
        ImportError: prometheus-client is missing (message says how to install).
        OSError: the port cannot be bound.
    """
    try:
        from prometheus_client import generate_latest
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    registry = make_registry(state)
    family, sockaddr = bind_address(addr, port)
    # The state's records are replaced whole, never changed in place: the
    # same objects mean the same exposition, and a scrape reuses it.
    server = MetricsServer((sockaddr[0], port), family, render=lambda: generate_latest(registry),
                           state_key=lambda: (state.sample, state.hello, state.backend, state.job),
                           max_connections=MAX_CONNECTIONS, timeout_s=SOCKET_TIMEOUT_S)
    server.start()
    return server


#: Seconds a push at exit may take in all, whatever the gateway does (the
#: program is exiting and waits that long at most).
PUSH_TIMEOUT_S = 2.0


def push(state: StreamState, url: str, timeout_s: float = PUSH_TIMEOUT_S) -> None:
    """Push ``state``'s metrics to a Prometheus Pushgateway (or anything that
    takes its API: ``PUT URL/metrics/job/JOB/host/HOST/pid/PID``), replacing
    what this process pushed before. A process that ends before a scrape
    (a CI job) is seen all the same: Prometheus scrapes the gateway, with
    ``honor_labels: true`` (docs/cluster.md).

    The whole push (name lookup, connect, send, the gateway's answer) ends
    within ``timeout_s``, however slowly the gateway answers. A
    ``user:password@`` in the URL is sent as basic authentication.

    Raises:
        ImportError: prometheus-client is missing.
        OSError: the gateway cannot be reached, refused the metrics or did
            not answer in time (the message never holds the URL's password).
    """
    try:
        from prometheus_client import generate_latest
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    job, host, pid = state.identity()[:3]
    base = url if "://" in url else f"http://{url}"
    path = "/metrics" + "".join(f"/{k}/{v}" for k, v in (
        _grouping("job", job), _grouping("host", host), _grouping("pid", pid)))
    try:
        parts = urllib.parse.urlsplit(base)
        target = urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + path, query="", fragment=""))
    except ValueError as exc:
        raise OSError(f"not a URL: {exc}") from None
    answer = http_deadline.request("PUT", target, timeout_s, body=generate_latest(make_registry(state)),
                                   headers={"Content-Type": CONTENT_TYPE.decode()}, max_bytes=4096, truncate=True)
    if not 200 <= answer.status < 300:
        # The gateway's own words, for the notice: one line, printable only.
        words = " ".join(answer.body.decode("utf-8", "replace").split())
        said = "".join(c if c.isprintable() else "?" for c in words)[:200]
        raise OSError(f"the gateway answered {answer.status} {answer.reason}" + (f": {said}" if said else ""))


def _grouping(name: str, value: str) -> tuple[str, str]:
    """A Pushgateway grouping-key path element: a value with a ``/`` (or an
    empty one) goes base64-encoded, as the gateway's API asks."""
    if not value:
        return f"{name}@base64", "="
    if "/" in value:
        return f"{name}@base64", base64.urlsafe_b64encode(value.encode()).decode()
    return name, urllib.parse.quote(value, safe="")
