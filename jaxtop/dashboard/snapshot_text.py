"""``jaxtop snapshot PID`` as text: every panel's figures, and the screens
behind them (who holds the memory, which lines make the transfers, the jit
ledger), for a bug report or a script's log.

Pure: frozen views in, text out (the CLI fetches them, this formats them).
Every string in the views came through the model, which made it terminal
safe.
"""

from __future__ import annotations

from jaxtop.advice import report_lines
from jaxtop.dashboard.ledger import LedgerView, describe_reason
from jaxtop.dashboard.ledger_views import LedgerNotes
from jaxtop.dashboard.transfer_sites import SCALAR_ADVICE, TransferSiteView
from jaxtop.dashboard.views import DISCONNECTED, EXITED, DeviceView, ProcessView, Snapshot
from jaxtop.wire.units import fmt_bytes, na

__all__ = ["snapshot_text"]

#: Seconds after which the text says when the live arrays were scanned.
STALE_S = 3.0
#: Rows of each list (sites, labels, host-read lines, jitted functions).
TOP = 5


def snapshot_text(snap: Snapshot, ledgers: dict[int, LedgerView] | None = None) -> str:
    """The whole snapshot as text.

    Args:
        snap: the model's snapshot.
        ledgers: each process's jit ledger by pid (the model keeps them
            apart from the snapshot); None or missing: no ledger section.
    """
    out: list[str] = []
    for p in snap.processes:
        out.extend(_process_lines(p))
        for dev in (d for d in snap.devices if d.pid == p.pid):
            out.extend(_device_lines(dev, p))
        out.extend(_holders_lines(p))
        out.extend(_transfer_sites_lines(p))
        ledger = (ledgers or {}).get(p.pid)
        if ledger is not None:
            out.extend(_ledger_lines(ledger))
        out.extend(_advice_lines(p))
    return "\n".join(out) + "\n"


def _advice_lines(p: ProcessView) -> list[str]:
    """The advisor's report, indented under the process (jaxtop advise's text)."""
    if p.advice is None:
        return ["  advice: n/a (the agent's history did not come in time)"]
    return ["  " + line for line in report_lines(p.advice)]


def _process_lines(p: ProcessView) -> list[str]:
    out = [f"{p.who}  {' '.join(p.argv) or '?'}"]
    uptime = na() if p.uptime_s is None else f"{p.uptime_s:.0f} s"
    out.append(f"  backend {p.backend or na('not started')}  jax {p.jax_version or na()}  state {p.state}  "
               f"seq {p.seq}  uptime {uptime}")
    host = p.process
    parts = host.rss_parts()
    out.append(f"  host RSS {fmt_bytes(host.rss_bytes)}{f' ({parts})' if parts else ''}  CPU {na() if host.cpu_percent is None else f'{host.cpu_percent:.1f}%'}"
               f"  threads {na() if host.threads is None else host.threads}")
    for d, t in p.transfers.items():
        # The larger of the guard log's sizes and the lines' (a cached call
        # logs no shape); "~" where the lines' argument sizes won.
        how = "~" if t.bytes_total_inferred else ""
        out.append(f"  {d} transfers {t.count_total}  bytes >= {how}{fmt_bytes(t.bytes_total)}")
    if p.capture.available is False:
        out.append(f"  transfers: {na(p.capture.na_reason)}")
    out.append(f"  compiles {p.compile.count_total}  failed donations {p.donation.failed_total}")
    agent = p.agent
    if agent is not None and agent.cpu_share is not None:
        line = f"  jaxtop's agent thread {agent.cpu_share:.2%} of a core"
        if agent.over_ceiling():
            line += (f", over its {agent.ceiling_share:.1%} ceiling: work that comes with each implicit transfer or "
                     f"client request does not shrink with sampling (JAXTOP_TRANSFER_SITES=0 stops tying transfers "
                     f"to lines)")
        if agent.stretched(p.interval_s):
            line += f", sampling every {agent.tick_s:.2g} s (asked {p.interval_s:.2g} s): at its CPU ceiling"
            if agent.ceiling_share:
                line += f" of {agent.ceiling_share:.1%}"
        out.append(line)
    return out


def _device_lines(dev: DeviceView, proc: ProcessView) -> list[str]:
    """A device's figures; the live arrays' age where their scan is not
    this moment's, and the memory no live array holds."""
    frag = na(dev.fragmentation_reason) if dev.fragmentation is None else f"{dev.fragmentation:.1%}"
    live = f"live arrays {fmt_bytes(dev.live_bytes)}"
    if dev.live_held and dev.live_age_s is not None and dev.live_age_s >= STALE_S:
        live += f" (scanned {dev.live_age_s:.1f} s ago; {dev.live_held})"
    elif dev.live_age_s is not None and dev.live_age_s >= STALE_S:
        live += f" (scanned {dev.live_age_s:.1f} s ago)"
    lines = [f"  {dev.label:<8} in use {fmt_bytes(dev.bytes_in_use)}  pool {fmt_bytes(dev.pool_bytes)}  "
             f"limit {fmt_bytes(dev.bytes_limit)}  peak {fmt_bytes(dev.peak_bytes_in_use)}  "
             f"{live}  fragmentation {frag}"]
    if dev.unheld_bytes is not None:
        text = f"           not in arrays {'≈' if not dev.unheld_exact else ''}{fmt_bytes(dev.unheld_bytes)}"
        text += " (in use that no live array holds: on an accelerator, work queued ahead by async dispatch)"
        if dev.scan_in_use_differs:
            text += f"; of {fmt_bytes(dev.in_use_at_scan_bytes)} in use at the scan"
        if dev.not_ready_count:
            text += f"; {dev.not_ready_count} arrays still computing ({fmt_bytes(dev.not_ready_bytes)})"
        queue = proc.accelerator.hlo_queue_size if proc.accelerator is not None else None
        if queue is not None:
            text += f"; {queue} programs in the TPU runtime's queue"
        call = proc.largest_call
        if call is not None:
            text += f"; one {call.name} call holds {fmt_bytes(call.call_held_bytes)}"
        lines.append(text)
    return lines


def _holders_lines(p: ProcessView) -> list[str]:
    """Who holds the memory (the last profile), leak suspects first; the
    labelled pytrees; the lines that read device arrays on the host."""
    h = p.holders
    if h is None or h.empty:
        return []
    out = []
    if h.t is not None:
        age = f", {p.holders.last_t - h.t:.0f} s before the last sample" if h.last_t and h.t else ""
        out.append(f"  holders (memory profile #{h.seq}{age}): {fmt_bytes(h.bytes)} in {h.count} buffers, "
                   f"{h.sites_total} sites")
        sites = sorted(h.sites, key=lambda s: (not s.suspect, -s.bytes))
        for s in sites[:TOP]:
            grow = ""
            if s.growth is not None and s.growth.bytes_per_min:
                grow = f"  +{fmt_bytes(s.growth.bytes_per_min)}/min for {s.growth.for_s:.0f} s"
            flag = "  LEAK SUSPECT" if s.suspect else ""
            out.append(f"    {fmt_bytes(s.bytes):>10}  {s.count:>6} arrays  {s.site} in {s.function}{grow}{flag}")
        if not h.suspects:
            out.append("    no leak suspect")
    elif h.reason or h.error:
        out.append(f"  holders: {na(h.error or h.reason)}")
    if h.labels:
        out.append(f"  labelled pytrees ({len(h.labels)}):")
        for lab in sorted(h.labels, key=lambda x: -x.bytes)[:TOP]:
            out.append(f"    {fmt_bytes(lab.bytes):>10}  {lab.alive}/{lab.arrays} arrays alive  {lab.name}")
    if h.syncs_available:
        out.append(f"  host reads {h.syncs_total} in {h.syncs_sites_total} lines"
                   + (f" ({h.syncs_uncounted})" if h.syncs_uncounted else ""))
        for s in sorted(h.syncs, key=lambda x: -x.count)[:TOP]:
            out.append(f"    {s.count:>8}  {s.site} in {s.function}")
    elif h.syncs_available is False and h.syncs_reason:
        out.append(f"  host reads: {na(h.syncs_reason)}")
    return out


def _rate(value: float | None, ended: bool) -> str:
    return "–" if ended else (na() if value is None else f"{value:.3g}/s")


def _site_line(s: TransferSiteView, ended: bool) -> str:
    nbytes = na() if s.bytes_total is None else fmt_bytes(s.bytes_total)
    args = s.args_text() or "args not seen"
    return (f"    {s.direction} {s.count_total:>8,}  {_rate(s.count_per_s, ended):>8}  bytes>= {nbytes:>9}  "
            f"{s.where} in {s.function}: {s.callee}  {args}")


def _transfer_sites_lines(p: ProcessView) -> list[str]:
    """Which lines make the implicit transfers: the busiest array lines,
    the Python scalars apart, the transfers not tied to a line."""
    v = p.transfer_sites
    if v is None:
        return []
    ended = p.state in (EXITED, DISCONNECTED)
    out = [f"  transfer sites: {v.sites_total} lines, {v.unattributed_total} unattributed"
           + (f", {v.pending} waiting for their call" if v.pending else "")
           + " (~: arguments read from a call at that line, inferred)"]
    for s in v.arrays[:TOP]:
        out.append(_site_line(s, ended))
    if len(v.arrays) > TOP or v.sites_total > len(v.sites):
        out.append(f"    … {len(v.arrays) - min(TOP, len(v.arrays)) + v.sites_total - len(v.sites)} more lines")
    summary = v.scalar_summary()
    if summary is not None:
        rate = f"×{summary.count_total:,}" if ended or summary.count_per_s is None else f"{summary.count_per_s:.3g}/s"
        site = summary.busiest
        about = f"{summary.names or site.callee} in {site.callee}, {site.where}" if site is not None else ""
        lines = f"{summary.lines} line{'' if summary.lines == 1 else 's'}"
        out.append(f"    Python scalars {rate} at {lines} ({about}): {SCALAR_ADVICE}")
        for s in v.scalars[:TOP]:
            out.append(_site_line(s, ended))
    if v.unattributed_total:
        by_dir = ", ".join(f"{d} {n}" for d, n in sorted(v.unattributed.items()) if n)
        out.append(f"    unattributed {v.unattributed_total} ({by_dir}), never guessed:")
        for reason, n in sorted(v.unattributed_reasons.items(), key=lambda kv: -kv[1])[:TOP]:
            out.append(f"      {n:>8}  {reason}")
    return out


def _ledger_lines(v: LedgerView) -> list[str]:
    """The jit ledger: live executables, the flag if any, the functions that
    hold the most, with their recompiles and the newest reason."""
    if not v.available:
        return [f"  jit ledger: {na(v.reason)}"]
    out = [f"  jit ledger: {v.live_count} live executables, code {fmt_bytes(v.code_bytes)}, "
           f"{v.compiles_total} compiles" + ("" if v.complete else " (joined mid-run: partial until the next full table)")]
    flag = LedgerNotes.of(v).leak_message
    if flag:
        out.append(f"    FLAGGED: {flag}")
    ranked = sorted(v.functions, key=lambda f: -(f.total_bytes or 0))
    for f in ranked[:TOP]:
        kind = "op" if f.eager else "jit"
        recompiles = "" if f.recompiles is None else f", {f.recompiles} recompiles"
        line = (f"    {fmt_bytes(f.total_bytes):>10}  {f.name} ({kind}, {f.compiles} compiles{recompiles}, "
                f"temp {fmt_bytes(f.temp_bytes)})")
        if f.call_site:
            line += f"  at {f.call_site}"
        out.append(line)
        if f.reasons and f.recompiles:
            out.append(f"      last recompile: {describe_reason(f.reasons[0])}")
    return out

