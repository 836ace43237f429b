"""The dashboard over Prometheus: every process of a job, on every host,
read from Prometheus's HTTP query API (``jaxtop attach --prometheus URL``).

Each agent exports its latest sample's figures (``jaxtop.wire.prometheus``);
this source asks Prometheus for all of them in one instant query per poll
(``{__name__=~"jaxtop_.+", job=~"JOB"}``) and turns the series of each
process back into the records the dashboard reads from a live agent: a
``hello`` naming its host, pid, devices and NVML join, then one ``sample``
per scrape that Prometheus took (a new ``jaxtop_sample_seq``). On start,
the last minutes come from one range query, so the timelines are drawn at
once. Nothing is invented: a figure Prometheus does not have (the shape
table, buffer maps, holders, the jit ledger are never exported; pool,
limit and fragmentation not on CPU) is absent from the record and reads
n/a, with the reason where the panel has one.

Processes are told apart by ``(job, host, pid)``: two processes in two
containers may both be pid 1. The model keys them by a number of its own;
the screen shows their host and pid from their hello.

What a server can cost the dashboard is bounded, whether it is hostile or
just serves a very large job: each query ends within :data:`TIMEOUT_S` in
all (a server that drips its answer is cut off), an answer is read to
:data:`MAX_ANSWER_BYTES` at most (past it, a clear error), JSON nested too
deep for the parser is an error, not a crash, and only the first
:data:`MAX_PROCESSES` processes and :data:`MAX_DEVICES` devices are kept
(every one kept costs the model its history, a few MB): the rest are
dropped while the answer is parsed, and a notice says how many.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

from jaxtop.dashboard.sources.base import Source
from jaxtop.wire import http_deadline, protocol
from jaxtop.wire.records import from_dict

__all__ = ["Admission", "AnswerTooLargeError", "PrometheusError", "PrometheusSource", "Series", "group",
           "parse_answer", "records_for"]

#: How often Prometheus is asked (its scrapes come every few seconds at most).
DEFAULT_POLL_S = 2.0
#: History fetched on start (one range query).
DEFAULT_BACKFILL_S = 600.0
#: Seconds one query may take in all: connect, send, and every byte of the answer.
TIMEOUT_S = 10.0
#: Bytes one answer may have. A 64-host job's instant answer is ~2 MB; its
#: backfill is kept under this by its step (:data:`MAX_BACKFILL_POINTS`).
MAX_ANSWER_BYTES = 64 << 20
#: Processes kept (the first seen); each costs the model ~3.4 MB of history.
MAX_PROCESSES = 256
#: Devices kept over all processes (64 hosts x 8); each costs ~3.1 MB of history.
MAX_DEVICES = 512
#: Devices (and NVML GPUs) kept per process.
MAX_DEVICES_PER_PROCESS = 64
#: Series kept per process (~15, and ~8 more per device).
MAX_SERIES_PER_PROCESS = 1_000
#: Series kept from one answer, all processes together.
MAX_SERIES = 200_000
#: Points kept per series (Prometheus's own limit for a range query).
MAX_POINTS_PER_SERIES = 11_000
#: Points the backfill asks for, all series together: its step grows with the job.
MAX_BACKFILL_POINTS = 1_000_000
#: Characters kept of a label name or value, and labels kept per series.
MAX_LABEL_CHARS = 512
MAX_LABELS = 64
#: Keys of the model for processes over Prometheus (kept apart from real pids).
KEY_BASE = 1_000_000_000

Series = tuple[dict[str, str], list[tuple[float, float]]]  # labels, [(t, value)]
PROCESS = ("job", "host", "pid")

_DEVICE = {
    "jaxtop_device_bytes_in_use": "bytes_in_use", "jaxtop_device_peak_bytes_in_use": "peak_bytes_in_use",
    "jaxtop_device_pool_bytes": "pool_bytes", "jaxtop_device_limit_bytes": "bytes_limit",
    "jaxtop_device_largest_free_block_bytes": "largest_free_block_bytes",
    "jaxtop_device_fragmentation_ratio": "fragmentation",
}
NOT_EXPORTED = "not exported to Prometheus"


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or answered with an error."""


class AnswerTooLargeError(PrometheusError):
    """An answer over :data:`MAX_ANSWER_BYTES`: asking again gets the same."""


def selector(job: str | None) -> str:
    """The series of ``job`` (a regular expression; every job when None)."""
    job_part = "" if job is None else f', job=~"{_escape(job)}"'
    return f'{{__name__=~"jaxtop_.+"{job_part}}}'


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


class Admission:
    """Which processes and devices are kept, for a whole session: the first
    :data:`MAX_PROCESSES` processes seen and, within them, the first devices
    up to the caps. A process kept stays kept (the screen does not change
    its set between polls); one over the cap is counted, not kept.

    Args:
        max_processes: see :data:`MAX_PROCESSES`.
        max_devices: see :data:`MAX_DEVICES`.
    """

    def __init__(self, max_processes: int | None = None, max_devices: int | None = None) -> None:
        self.max_processes = MAX_PROCESSES if max_processes is None else max_processes
        self.max_devices = MAX_DEVICES if max_devices is None else max_devices
        self._kept: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._devices = 0
        self._series = 0
        #: Series in the last answer, kept or not (what a backfill would bring).
        self.series_seen = 0
        #: Processes of the last answer that were not kept (hashes, at most 100,000).
        self.left_out: set[int] = set()

    def begin(self) -> None:
        """A new answer: the per-answer counts start again."""
        self.series_seen = self._series = 0
        self.left_out = set()
        for entry in self._kept.values():
            entry["series"] = 0

    def keep(self, labels: dict[str, str]) -> bool:
        """Whether a series with ``labels`` is kept (and count it)."""
        self.series_seen += 1
        process = (labels.get("job", ""), labels.get("host", ""), labels.get("pid", ""))
        entry = self._kept.get(process)
        if entry is None:
            if len(self._kept) >= self.max_processes:
                if len(self.left_out) < 100_000:
                    self.left_out.add(hash(process))
                return False
            entry = self._kept[process] = {"series": 0, "device": set(), "gpu": set()}
        if entry["series"] >= MAX_SERIES_PER_PROCESS or self._series >= MAX_SERIES:
            return False
        new = [(name, labels[name]) for name in ("device", "gpu") if name in labels and labels[name] not in entry[name]]
        for name, _ in new:
            if len(entry[name]) >= MAX_DEVICES_PER_PROCESS or (name == "device" and self._devices >= self.max_devices):
                return False
        for name, ident in new:
            entry[name].add(ident)
            self._devices += name == "device"
        entry["series"] += 1
        self._series += 1
        return True


class _Kept(tuple):
    """A series the parser kept: ``(labels, values)``, told apart from any
    list or dict of the answer itself."""


def parse_answer(payload: bytes, admission: Admission | None = None) -> list[Series]:
    """The series of a query API answer (vector or matrix), those over the
    caps left out as they are parsed (:class:`Admission`).

    Raises:
        PrometheusError: not a successful answer of the query API (also
            JSON nested too deep to parse).
    """
    admission = admission or Admission()
    admission.begin()

    def series_of(obj: dict[str, Any]) -> Any:
        # Called for every JSON object as soon as it is parsed, innermost
        # first: a series is turned into a compact tuple, or dropped at once
        # (with its points) when over the caps, so an answer for thousands
        # of processes never stands in memory as dicts and lists.
        metric = obj.get("metric")
        if not isinstance(metric, dict):
            return obj
        labels = {str(k)[:MAX_LABEL_CHARS]: str(v)[:MAX_LABEL_CHARS] for k, v in list(metric.items())[:MAX_LABELS]}
        if not admission.keep(labels):
            return None
        points = obj.get("values") if "values" in obj else ([obj["value"]] if "value" in obj else [])
        values = []
        for point in points[-MAX_POINTS_PER_SERIES:] if isinstance(points, list) else ():
            try:
                values.append((float(point[0]), float(point[1])))
            except (TypeError, ValueError, IndexError, KeyError):
                continue
        return _Kept((labels, values))

    try:
        answer = json.loads(payload, object_hook=series_of)
    except RecursionError:
        raise PrometheusError("not a Prometheus answer: JSON nested too deeply") from None
    except ValueError as exc:
        raise PrometheusError(f"not a Prometheus answer: {exc}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise PrometheusError(f"Prometheus answered: {str(error)[:500] if error else 'not a success'}")
    data = answer.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    return [item for item in result if isinstance(item, _Kept)] if isinstance(result, list) else []


def group(series: Iterable[Series]) -> dict[tuple[str, str, str], list[Series]]:
    """Series by process: ``(job, host, pid)``."""
    out: dict[tuple[str, str, str], list[Series]] = {}
    for labels, values in series:
        out.setdefault(tuple(labels.get(k, "") for k in PROCESS), []).append((labels, values))
    return out


def hello_for(process: tuple[str, str, str], series: list[Series], interval_s: float) -> dict[str, Any]:
    """A hello for one process, from its labels (devices, NVML join, started)."""
    job, host, pid = process
    devices: dict[str, dict[str, Any]] = {}
    gpus = []
    index, count, started = "0", "1", None
    versions: dict[str, Any] = {}
    for labels, values in series:
        index, count = labels.get("process_index", index), labels.get("process_count", count)
        name = labels.get("__name__")
        if "device" in labels and name in _DEVICE or name in ("jaxtop_device_info", "jaxtop_device_live_array_bytes"):
            d = devices.setdefault(labels["device"], {"id": _int(labels["device"]), "platform": labels.get("platform", "")})
            if name == "jaxtop_device_info":
                d["kind"] = labels.get("kind") or d["platform"]
                if labels.get("gpu"):
                    gpus.append({"index": _int(labels["gpu"]), "jax_id": d["id"]})
        elif name == "jaxtop_process_start_time_seconds" and values:
            started = values[-1][1]
        elif name == "jaxtop_versions_info":
            versions = {k: labels[k] for k in ("jax", "jaxlib", "jaxtop", "python") if labels.get(k)}
    described = [dict(d, process_index=_int(index)) for d in sorted(devices.values(), key=lambda d: str(d["id"]))]
    return {
        "type": protocol.HELLO, "t": time.time(), "protocol": protocol.PROTOCOL_VERSION, "pid": _int(pid),
        "host": host, "job": job, "argv": [f"[{job}: process {index} of {count}]"], "started_t": started,
        "versions": versions,
        "detail_na": "buffer maps, shapes, holders and the jit ledger are not exported to Prometheus "
                     "(jaxtop attach PID on the process's host has them)",
        "backend": described[0]["platform"] if described else None, "devices": described,
        "interval_s": interval_s, "source": "prometheus",
        "distributed": {"process_index": _int(index), "process_count": _int(count)},
        "nvml": {"available": True, "devices": gpus} if gpus else {"available": False, "reason": NOT_EXPORTED},
        "transfer_capture": {"available": True},
    }


def records_for(series: list[Series], previous: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The samples of one process, one per distinct ``jaxtop_sample_seq``
    value in ``series`` (a range query gives many, an instant query one).

    Args:
        series: the process's series.
        previous: the counters of the last sample made before (for the
            per-interval counts), updated in place.
    """
    previous = previous if previous is not None else {}
    seqs = next((v for labels, v in series if labels.get("__name__") == "jaxtop_sample_seq"), [])
    if not seqs:
        return []
    by_t: dict[float, dict[tuple, float]] = {}
    platforms: dict[str, str] = {}  # device -> platform, from the labels
    for labels, values in series:
        if labels.get("device") and labels.get("platform"):
            platforms[labels["device"]] = labels["platform"]
        key = (labels.get("__name__", ""), labels.get("device", ""), labels.get("direction", ""), labels.get("gpu", ""))
        for t, v in values:
            by_t.setdefault(t, {})[key] = v
    out = []
    last_seq = None
    for t, seq in seqs:
        if seq == last_seq or not math.isfinite(seq):
            continue  # the same sample scraped again (or not a sequence number)
        last_seq = seq
        out.append(_sample(by_t.get(t, {}), int(seq), previous, platforms))
    return out


def _sample(at: dict[tuple, float], seq: int, previous: dict[str, float], platforms: dict[str, str]) -> dict[str, Any]:
    def get(name: str, device: str = "", direction: str = "", gpu: str = "") -> float | None:
        return at.get((name, device, direction, gpu))

    t = get("jaxtop_sample_timestamp_seconds") or time.time()
    devices = sorted({k[1] for k in at if k[1] and (k[0] in _DEVICE or k[0] == "jaxtop_device_live_array_bytes")},
                     key=lambda s: (len(s), s))
    devs = []
    for device in devices:
        d: dict[str, Any] = {"id": _int(device), "platform": platforms.get(device, "")}
        for name, key in _DEVICE.items():
            value = get(name, device)
            if value is not None:
                d[key] = _num(value)
        if "fragmentation" not in d:
            d["fragmentation"] = None
            d["fragmentation_reason"] = f"{NOT_EXPORTED} (the allocator reports no pool, e.g. on CPU)"
        live = get("jaxtop_device_live_array_bytes", device)
        if live is not None:
            d["live_arrays"] = {"bytes": _num(live)}
        d["source"] = "memory_stats" if "pool_bytes" in d or "bytes_limit" in d else "live_arrays"
        devs.append(d)
    rec: dict[str, Any] = {"type": protocol.SAMPLE, "t": t, "seq": seq, "devices": devs}
    transfers: dict[str, Any] = {}
    for direction in protocol.DIRECTIONS:
        total = get("jaxtop_transfers_total", direction=direction)
        if total is None:
            continue
        known = get("jaxtop_transfer_known_bytes_total", direction=direction) or 0.0
        transfers[direction] = {
            "count_total": _num(total), "bytes_known_total": _num(known),
            "count": _delta(previous, f"t:{direction}", total), "bytes_known": _delta(previous, f"b:{direction}", known),
        }
    if transfers:
        rec["transfers"] = transfers
    else:
        rec["transfer_capture"] = {"available": False, "reason": f"transfers {NOT_EXPORTED} by this process"}
    rss, cpu = get("jaxtop_process_resident_memory_bytes"), get("jaxtop_process_cpu_ratio")
    rec["process"] = {"rss_bytes": _num(rss), "cpu_percent": None if cpu is None else cpu * 100.0}
    compiles = get("jaxtop_compiles_total")
    if compiles is not None:
        rec["compile"] = {"count_total": _num(compiles), "count": _delta(previous, "c", compiles),
                          "seconds_total": get("jaxtop_compile_seconds_total")}
    failed = get("jaxtop_donation_failures_total")
    if failed is not None:
        rec["donation"] = {"failed_total": _num(failed), "failed": _delta(previous, "d", failed)}
    gpus = sorted({k[3] for k in at if k[3] and k[0].startswith("jaxtop_gpu_")})
    if gpus:
        rec["nvml"] = {"available": True, "t": t, "devices": [
            {"index": _int(g), "memory_used_bytes": _num(get("jaxtop_gpu_memory_used_bytes", gpu=g)),
             "process_memory_bytes": _num(get("jaxtop_gpu_process_memory_bytes", gpu=g))} for g in gpus]}
    return rec


def _delta(previous: dict[str, float], key: str, total: float) -> int:
    """The increase of a counter since the last sample (0 for the first, or after a restart)."""
    last = previous.get(key)
    previous[key] = total
    if last is None or not math.isfinite(total - last) or total < last:
        return 0
    return int(total - last)


def _num(value: float | None) -> int | float | None:
    """A figure as the agent wrote it (whole numbers as int); None for a
    value that is no figure (NaN, infinity)."""
    if value is None or not math.isfinite(value):
        return None
    return int(value) if float(value).is_integer() else value


def _int(text: Any) -> Any:
    try:
        return int(text)
    except (TypeError, ValueError):
        return text


class PrometheusSource(Source):
    """Every process of a job, read from a Prometheus server.

    Args:
        url: the server (``http://host:9090``; ``http://user:password@host:9090``
            for basic authentication, the password never shown).
        job: the job's name, a regular expression (every job when None).
        poll_s: seconds between two queries.
        backfill_s: history fetched on start.
        fetch: ``fetch(url) -> bytes`` (tests stand in for HTTP here).
    """

    kind = "prometheus"

    def __init__(self, url: str, job: str | None = None, poll_s: float = DEFAULT_POLL_S,
                 backfill_s: float = DEFAULT_BACKFILL_S, fetch: Callable[[str], bytes] | None = None) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.job = job
        self.poll_s = poll_s
        self.backfill_s = backfill_s
        self._fetch = fetch or _http_get
        self._keys: dict[tuple[str, str, str], int] = {}
        self._previous: dict[int, dict[str, float]] = {}
        self._last_seq: dict[int, int] = {}
        self._admission = Admission()
        self._left_out_said = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # the last failure, for the screen
        #: Processes the last answer had beyond those kept (0 when all are).
        self.left_out = 0

    @property
    def pids(self) -> list[int]:
        return sorted(self._keys.values())

    def query(self, path: str, **params: Any) -> list[Series]:
        """One query API call; raises PrometheusError."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            series = parse_answer(self._fetch(url), self._admission)
        except PrometheusError:
            raise
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"cannot query {http_deadline.redact(self.url)}: {exc}") from None
        self.left_out = len(self._admission.left_out)
        return series

    def check(self) -> int:
        """Ask once: how many processes the job has, at most
        :data:`MAX_PROCESSES` (raises PrometheusError)."""
        return len(group(self.query("query", query=selector(self.job))))

    def start(self, model: Any, on_update: Callable[[], None]) -> None:
        super().start(model, on_update)
        self._thread = threading.Thread(target=self._run, name="jaxtop-prometheus-source", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def backfill_step_s(self) -> float:
        """The backfill's step: the poll interval, or longer when the job's
        series (as the last instant answer counted them) would bring more
        than :data:`MAX_BACKFILL_POINTS` points."""
        spread = self.backfill_s * self._admission.series_seen / MAX_BACKFILL_POINTS
        return max(1.0, self.poll_s, math.ceil(spread))

    def poll(self, backfill: bool = False) -> int:
        """Ask Prometheus once and feed what is new; returns the samples fed."""
        now = time.time()
        if backfill and self.backfill_s > 0:
            series = self.query("query_range", query=selector(self.job), start=f"{now - self.backfill_s:.3f}",
                                end=f"{now:.3f}", step=f"{self.backfill_step_s():g}")
        else:
            series = self.query("query", query=selector(self.job), time=f"{now:.3f}")
        if self.left_out and not self._left_out_said:
            self._left_out_said = True
            self.model.add_notice(
                f"Prometheus has {self.left_out}{'+' if self.left_out >= 100_000 else ''} more processes than the "
                f"{self._admission.max_processes} shown (narrow them with --job)")
        fed = 0
        for process, items in sorted(group(series).items()):
            key = self._keys.get(process)
            if key is None:
                key = self._keys[process] = KEY_BASE + len(self._keys)
                self.model.feed(key, from_dict(hello_for(process, items, self.poll_s)))
            # The scrape's figures as the wire's records, through the one
            # decoder (its labels are anyone's text: made safe there).
            records = [from_dict(r) for r in records_for(items, self._previous.setdefault(key, {}))
                       if r["seq"] != self._last_seq.get(key)]
            if records:
                self._last_seq[key] = records[-1].seq
                fed += self.model.feed_many(key, records)
        return fed

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                if self.poll(backfill=first):
                    self.on_update()
                first = False
                self.error = None
            except AnswerTooLargeError as exc:
                self.error = str(exc)
                if first:  # the same again would fail the same: on with the present
                    first = False
                    self.model.add_notice(f"no history fetched: {exc}")
            except PrometheusError as exc:
                self.error = str(exc)
            except Exception as exc:  # the reader thread must not die quietly
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self.poll_s)

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        return "not over Prometheus: commands need the agent's socket (jaxtop attach PID on its host)"

    def save(self, path: str) -> list[str]:
        return []


def _http_get(url: str) -> bytes:
    """The body of a GET of ``url``, within :data:`TIMEOUT_S` in all and
    :data:`MAX_ANSWER_BYTES`.

    Raises:
        AnswerTooLargeError: the answer is over the cap.
        PrometheusError: an HTTP error that is not the query API's own.
        OSError: the server could not be asked or did not answer in time.
    """
    try:
        answer = http_deadline.request("GET", url, TIMEOUT_S, headers={"Accept": "application/json"},
                                       max_bytes=MAX_ANSWER_BYTES)
    except http_deadline.AnswerTooLarge:
        raise AnswerTooLargeError(f"Prometheus answered more than {MAX_ANSWER_BYTES >> 20} MiB: narrow the query "
                                  "with --job") from None
    if answer.status < 300 or answer.body.lstrip()[:1] == b"{":
        return answer.body  # the query API's errors are JSON: parse_answer says what it said
    raise PrometheusError(f"HTTP {answer.status} from {http_deadline.redact(url.split('?')[0])}")
