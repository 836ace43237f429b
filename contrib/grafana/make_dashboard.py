"""Writes contrib/grafana/jaxtop.json, the Grafana dashboard over jaxtop's
Prometheus metrics: ``python contrib/grafana/make_dashboard.py``.

The dashboard is generated so that every panel filters the same way and
every expression is written once; tests/test_cluster.py runs each of them
on a real Prometheus scraping a real multi-process jax.distributed job.

A panel whose figure the backend may not have (an allocator's pool, limit
and fragmentation, NVML: none on CPU) says so instead of "No data": its
``noValue`` text is the reason, as jaxtop shows n/a everywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
#: The job's processes (every metric carries these labels).
SEL = 'job=~"$job", host=~"$host", process_index=~"$process_index"'
#: ... and a device's.
DEV = SEL + ', device=~"$device"'
NO_POOL = "n/a: this backend's allocator reports no pool (CPU: live arrays only)"
NO_LIMIT = "n/a: this backend's allocator reports no limit (CPU)"
NO_NVML = "n/a: no NVIDIA driver (NVML) on these hosts"


def variable(name: str, query: str, label: str | None = None, all_value: str = ".*") -> dict:
    return {
        "name": name, "label": label or name, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
        "includeAll": True, "multi": True, "allValue": all_value, "sort": 3,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def panel(title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 12, h: int = 8,
          kind: str = "timeseries", no_value: str | None = None, description: str = "") -> dict:
    defaults: dict = {"unit": unit}
    if no_value:
        defaults["noValue"] = no_value
    return {
        "title": title, "type": kind, "datasource": DS, "description": description,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}}
        if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"]}},
        "targets": [{"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
                    for i, (expr, legend) in enumerate(targets)],
    }


def dashboard() -> dict:
    panels = [
        # -- the job at a glance ------------------------------------------------------------
        panel("Sample age (s): how long since each process's last sample", [
            (f"time() - max by (job, host, pid, process_index) (jaxtop_sample_timestamp_seconds{{{SEL}}})",
             "{{host}} pid {{pid}} (process {{process_index}})")], "s", 0, 0, 8, 8, kind="stat",
            description="Above a few scrape intervals: the process stopped sending (exited, hung, or stopped)."),
        panel("Scrape targets up", [('sum by (job) (up{job=~"$scrape_job"})', "up"),
                                    ('count by (job) (up{job=~"$scrape_job"})', "targets")],
              "none", 8, 0, 4, 8, kind="stat",
              description="Prometheus's own up series of the scrape job (its job label is the scrape config's)."),
        panel("Device memory in use, per host", [
            (f"sum by (host) (jaxtop_device_bytes_in_use{{{DEV}}})", "{{host}}")], "bytes", 12, 0),
        panel("Top 10 devices by memory in use", [
            (f"topk(10, jaxtop_device_bytes_in_use{{{DEV}}})", "{{host}} pid {{pid}} device {{device}}")],
            "bytes", 0, 8),
        panel("Least headroom per host (limit - in use)", [
            (f"min by (host) (jaxtop_device_limit_bytes{{{DEV}}} - on(job, host, pid, device) "
             f"jaxtop_device_bytes_in_use{{{DEV}}})", "{{host}}")], "bytes", 12, 8, no_value=NO_LIMIT),
        # -- per device ---------------------------------------------------------------------
        panel("Device memory layers: pool >= in use >= live arrays, and the limit", [
            (f"jaxtop_device_pool_bytes{{{DEV}}}", "pool {{host}}/{{pid}}/{{device}}"),
            (f"jaxtop_device_bytes_in_use{{{DEV}}}", "in use {{host}}/{{pid}}/{{device}}"),
            (f"jaxtop_device_live_array_bytes{{{DEV}}}", "live arrays {{host}}/{{pid}}/{{device}}"),
            (f"jaxtop_device_limit_bytes{{{DEV}}}", "limit {{host}}/{{pid}}/{{device}}"),
        ], "bytes", 0, 16),
        panel("Peak bytes in use (CPU: the highest in use Prometheus saw)", [
            (f"jaxtop_device_peak_bytes_in_use{{{DEV}}} or max_over_time(jaxtop_device_bytes_in_use{{{DEV}}}[$__range])",
             "{{host}}/{{pid}}/{{device}}")], "bytes", 12, 16,
            description="The allocator's own peak where it keeps one (GPU, TPU); on CPU the largest scraped value."),
        panel("Fragmentation (BFC): 1 - largest free block / free bytes in the pool", [
            (f"jaxtop_device_fragmentation_ratio{{{DEV}}}", "{{host}}/{{pid}}/{{device}}")], "percentunit", 0, 24,
            no_value=NO_POOL),
        panel("GPU memory (NVML), per jax device", [
            (f"jaxtop_gpu_process_memory_bytes{{{SEL}}} * on(job, host, pid, gpu) group_left(device) "
             f"jaxtop_device_info{{{DEV}}}", "this process {{host}}/{{pid}}/{{device}}"),
            (f"jaxtop_gpu_memory_used_bytes{{{SEL}}} * on(job, host, pid, gpu) group_left(device) "
             f"jaxtop_device_info{{{DEV}}}", "all processes {{host}} gpu {{gpu}}"),
        ], "bytes", 12, 24, no_value=NO_NVML),
        # -- transfers, compiles, host ------------------------------------------------------
        panel("Implicit transfers per second", [
            (f"sum by (direction) (rate(jaxtop_transfers_total{{{SEL}}}[$__rate_interval]))", "job {{direction}}"),
            (f"sum by (host, direction) (rate(jaxtop_transfers_total{{{SEL}}}[$__rate_interval]))",
             "{{host}} {{direction}}"),
        ], "ops", 0, 32),
        panel("Implicit transfer bytes per second (a lower bound)", [
            (f"sum by (host, direction) (rate(jaxtop_transfer_known_bytes_total{{{SEL}}}[$__rate_interval]))",
             "{{host}} {{direction}}")], "Bps", 12, 32),
        panel("Compiles", [
            (f"sum by (host) (increase(jaxtop_compiles_total{{{SEL}}}[$__rate_interval]))", "compiles {{host}}"),
            (f"sum by (host) (increase(jaxtop_donation_failures_total{{{SEL}}}[$__rate_interval]))",
             "failed donations {{host}}"),
        ], "none", 0, 40),
        panel("Seconds compiling per second", [
            (f"sum by (host) (rate(jaxtop_compile_seconds_total{{{SEL}}}[$__rate_interval]))", "{{host}}")],
            "percentunit", 12, 40),
        panel("Host memory (RSS), per host", [
            (f"sum by (host) (jaxtop_process_resident_memory_bytes{{{SEL}}})", "{{host}}")], "bytes", 0, 48),
        panel("CPU: each process, and jaxtop's agent in it", [
            (f"jaxtop_process_cpu_ratio{{{SEL}}}", "process {{host}}/{{pid}}"),
            (f"rate(jaxtop_agent_cpu_seconds_total{{{SEL}}}[$__rate_interval])", "agent {{host}}/{{pid}}"),
        ], "percentunit", 12, 48),
    ]
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "where jaxtop's metrics are",
                      "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "9.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
        "title": "jaxtop: JAX memory and transfers",
        "uid": "jaxtop",
        "tags": ["jax", "jaxtop"],
        "schemaVersion": 38,
        "version": 2,
        "editable": True,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            variable("job", "label_values(jaxtop_sample_seq, job)"),
            variable("host", 'label_values(jaxtop_sample_seq{job=~"$job"}, host)'),
            variable("process_index", 'label_values(jaxtop_sample_seq{job=~"$job", host=~"$host"}, process_index)',
                     "process"),
            variable("device", f"label_values(jaxtop_device_bytes_in_use{{{SEL}}}, device)"),
            {**variable("scrape_job", "label_values(up, job)", "scrape job"), "includeAll": False, "multi": False,
             "current": {"selected": True, "text": "jaxtop", "value": "jaxtop"}},
        ]},
        "panels": panels,
    }


def main() -> None:
    path = Path(__file__).with_name("jaxtop.json")
    path.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
