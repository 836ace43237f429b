"""The pure renderables of jaxtop.widgets.render, drawn to plain strings."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from jaxtop.widgets import fmt
from jaxtop.widgets.render import (
    H_EIGHTHS, V_EIGHTHS, Gauge, LayersBar, MemoryMap, MiniBars, Series, Strip, Timeline, TimelineStack, fmt_bytes, fmt_duration, fmt_rate,
)
from jaxtop.wire import units

GiB, MiB = 2**30, 2**20
WIDTHS = (20, 40, 80, 200)


def _console(width: int) -> Console:
    return Console(width=width, record=True, color_system=None, legacy_windows=False, file=io.StringIO())


def render(renderable, width: int = 80) -> list[str]:
    """The lines a renderable prints at ``width`` columns."""
    console = _console(width)
    console.print(renderable)
    return console.export_text().splitlines()


def eighths(text: str) -> int:
    """Length of a horizontal bar in eighths of a cell."""
    return 8 * text.count("█") + sum(H_EIGHTHS.index(ch) for ch in text if ch in H_EIGHTHS[1:-1])


def layers(nvml=60 * GiB, pool=40 * GiB, in_use=12 * GiB, live=11 * GiB):
    nvml_layer = ("NVML used", nvml, "magenta", "CPU device" if nvml is None else None)
    return [nvml_layer, ("pool", pool, "blue"), ("in use", in_use, "green"), ("live arrays", live, "cyan")]


def spike_series(n: int = 10_000, at: int = 4321) -> Series:
    t = 1000.0 + np.arange(n, dtype=float)
    hi = np.full(n, 1.0 * GiB)
    hi[at] = 50.0 * GiB
    return Series("in use", t, hi.copy(), hi, "green", "fill")


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
        (12.3 * MiB, "12.3 MiB"), (123 * MiB, "123 MiB"), (1.02 * GiB, "1.02 GiB"), (80 * GiB, "80.0 GiB"),
        (999.7 * 1024, "0.976 MiB"),  # never "1e+03 KiB" or 4 digits of KiB
        (2**40, "1.00 TiB"), (-1536, "-1.50 KiB"), (np.int64(2048), "2.00 KiB"), (np.float32(3 * MiB), "3.00 MiB"),
        (None, "n/a"), (float("nan"), "n/a"),
    ],
)
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


@pytest.mark.parametrize(
    ("x", "unit", "text"),
    [
        (12.34, "", "12.3/s"), (5, "allocs", "5 allocs/s"), (0, "", "0/s"), (0.25, "", "0.25/s"), (1234, "", "1.23k/s"),
        (999.9, "", "1k/s"), (2.5e6, "", "2.5M/s"), (1536, "B", "1.50 KiB/s"), (None, "allocs", "n/a"), (float("nan"), "", "n/a"),
    ],
)
def test_fmt_rate(x, unit, text):
    assert fmt_rate(x, unit) == text


@pytest.mark.parametrize(
    ("s", "text"),
    [(0, "0s"), (59, "59s"), (59.9, "59s"), (184, "3m04s"), (2 * 3600 + 180, "2h03m"), (86400 + 4 * 3600 + 59, "1d04h"), (None, "n/a")],
)
def test_fmt_duration(s, text):
    assert fmt_duration(s) == text


# ---------------------------------------------------------------- every renderable, every width


def _all_renderables():
    t = np.linspace(0, 600, 601)
    v = np.abs(np.sin(t / 30)) * 8 * GiB
    bufs = [(0x7F00_0000_0000 + i * 3 * MiB, 2 * MiB) for i in range(50)]
    return {
        "layers": (LayersBar(layers(nvml=None), 80 * GiB), 5),
        "layers_no_limit": (LayersBar(layers(), None), 5),
        "timeline": (Timeline([Series("in use", t, v, v, "green", "fill"), Series("peak", t, v, v * 1.1, "red", "line")], 0, 600, 12, title="memory"), 12),
        "timeline_empty": (Timeline([], 0, 600, 6), 6),
        "timeline_rate": (Timeline([Series("h2d", t, t, t * 3, "cyan", "line")], 0, 600, 5, unit="/s"), 5),
        "gauge": (Gauge(0.42), 1),
        "gauge_na": (Gauge(None, reason="no allocator statistics on CPU (live_arrays source)"), 1),
        "map": (MemoryMap(bufs, rows=2), 3),
        "map_compressed": (MemoryMap(bufs + [(2**47 + i * MiB, MiB) for i in range(5)], rows=3), 4),
        "map_empty": (MemoryMap([]), 1),
        "minibars": (MiniBars([1.0, None, 3.0, 0.0] * 20), 1),
        "stack": (TimelineStack(_three_strips(t, v), 0, 600, 14), 14),
        "stack_short": (TimelineStack(_three_strips(t, v), 0, 600, 5), 5),
        "stack_na": (TimelineStack([Strip("memory", [Series("in use", t, v, v, "green", "fill")]), Strip("fragmentation", reason=CPU_REASON)], 0, 600, 8), 8),
        "map_unmapped": (MemoryMap(bufs, rows=1, count=60, total_hint=200 * MiB, unmapped={"not_ready": 4, "sharded": 6}), 2),
        "map_unmapped_2": (MemoryMap(bufs, rows=1, count=60, unmapped={"not_ready": 4, "sharded": 6}, caption_lines=2), 3),
        "map_no_addresses": (MemoryMap([], count=3, total_hint=MiB, unmapped={"not_ready": 3}), 1),
    }


CPU_REASON = "memory_stats() is None on cpu backend: the allocator reports no pool"


def _three_strips(t, v):
    ratio = np.clip(v / v.max(), 0, 1)
    return [Strip("memory", [Series("in use", t, v, v, "green", "fill")], unit="bytes", min_rows=3),
            Strip("", [Series("fragmentation", t, ratio, ratio, "yellow", "fill")], unit="%", y_max=1.0),
            Strip("transfers/s", [Series("h2d", t, t, t, "cyan", "fill")], unit="/s", min_rows=2)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(_all_renderables()))
def test_stays_inside_width_and_never_wraps(name, width):
    renderable, n_lines = _all_renderables()[name]
    lines = render(renderable, width)
    assert len(lines) == n_lines, lines  # a wrapped line would add one
    for line in lines:
        assert cell_len(line) <= width, line


@pytest.mark.parametrize("width", WIDTHS)
def test_explicit_width_is_an_upper_bound(width):
    unmapped = MemoryMap([(0, 10)], width=30, count=5, unmapped={"not_ready": 4})
    for renderable in (LayersBar(layers(), 80 * GiB, width=30), Gauge(0.5, width=30), MemoryMap([(0, 10)], width=30), MiniBars([1, 2], 30), unmapped):
        for line in render(renderable, width):
            assert cell_len(line) <= min(30, width)


# ---------------------------------------------------------------- LayersBar


def test_layers_bar_labels_sizes_percent_and_limit():
    lines = render(LayersBar(layers(), 80 * GiB), 80)
    assert [line[:12].strip() for line in lines[:4]] == ["NVML used", "pool", "in use", "live arrays"]
    assert "60.0 GiB" in lines[0] and "75%" in lines[0]
    assert "40.0 GiB" in lines[1] and "50%" in lines[1]
    assert "12.0 GiB" in lines[2] and "15%" in lines[2]
    assert lines[-1].strip() == "limit 80.0 GiB"


def test_layers_bar_is_scaled_to_the_limit_with_eighth_precision():
    lines = render(LayersBar([("full", 80, "red"), ("pool", 40, "blue"), ("in use", 12, "green"), ("tiny", 1e-6, "cyan")], 80), 80)
    full = eighths(lines[0])
    assert full >= 8 * 40  # a wide bar at 80 columns
    assert eighths(lines[1]) == round(full * 40 / 80)
    assert eighths(lines[2]) == round(full * 12 / 80)
    # A non-zero value never draws as an empty bar.
    assert eighths(lines[3]) == 1 and "▏" in lines[3]


def test_layers_bar_missing_value_is_na_with_reason_not_zero():
    lines = render(LayersBar(layers(nvml=None), 80 * GiB), 80)
    assert "n/a — CPU device" in lines[0]
    assert "0 B" not in lines[0] and "0%" not in lines[0] and eighths(lines[0]) == 0


def test_layers_bar_without_limit_scales_to_the_largest():
    lines = render(LayersBar(layers(), None), 80)
    assert "limit n/a" in lines[-1]
    assert "%" not in "".join(lines[:4])  # no percent of an unknown limit
    assert eighths(lines[0]) > 0 and "·" not in lines[0]  # the largest fills its bar


# ---------------------------------------------------------------- Timeline


def _plot_rows(lines: list[str]) -> list[str]:
    """The plot cells of each plot row (after the y-axis tick)."""
    return [line.split("┤", 1)[1] if "┤" in line else line.split("│", 1)[1] for line in lines[1:-1]]


@pytest.mark.parametrize("width", WIDTHS)
def test_timeline_keeps_a_single_spike_among_10000_points(width):
    series = spike_series()
    lines = render(Timeline([series], 1000.0, 1000.0 + 9999, height=10), width)
    rows = _plot_rows(lines)
    top = rows[0]
    # The spike is the maximum, so its column reaches the top row, alone.
    marked = [i for i, ch in enumerate(top) if ch != " "]
    # Drawn as the range the column's points span (░), not as a level held.
    assert len(marked) == 1 and top[marked[0]] == "░"
    # ...in the column its time falls in.
    assert marked[0] == int(4321 / 9999 * len(top))
    # The baseline of 1 GiB is drawn elsewhere (not lost either).
    assert all(ch != " " for ch in rows[-1])
    if width >= 40:
        assert lines[1].split("┤")[0].strip() == "50.0 GiB"


def test_timeline_y_labels_legend_and_x_axis():
    t = np.linspace(0, 600, 601)
    v = np.full_like(t, 8 * GiB)
    peak = Series("peak", t, v, v * 2, "red", "line")
    lines = render(Timeline([Series("in use", t, v, v, "green", "fill"), peak], 0, 600, height=7, title="memory"), 80)
    assert len(lines) == 7
    assert "memory" in lines[0] and "in use" in lines[0] and "peak" in lines[0]
    labels = [line.split("┤")[0].strip() for line in lines[1:-1] if "┤" in line]
    assert labels == ["16.0 GiB", "8.00 GiB", "0 B"]
    axis = lines[-1]
    assert axis.lstrip().startswith("└-10m") and "-5m" in axis and axis.endswith("now")
    # The peak line is a marker along the top row; the fill reaches half way.
    assert set(_plot_rows(lines)[0].strip()) == {"─"}
    assert "█" in _plot_rows(lines)[-1]


def test_timeline_columns_without_data_are_blank():
    t = np.concatenate([np.arange(0, 100.0), np.arange(200, 301.0)])
    v = np.full_like(t, 4 * GiB)
    lines = render(Timeline([Series("in use", t, v, v, "green", "fill"), Series("pool", t, v, v, "blue", "line")], 0, 300, height=6), 80)
    rows = _plot_rows(lines)
    width = len(rows[0])
    middle = slice(int(width * 0.4), int(width * 0.6))
    assert all(row[middle].strip() == "" for row in rows)  # the gap: nothing, not zero
    assert rows[-1][: int(width * 0.3)].count("█") == int(width * 0.3)


def test_timeline_holds_sparse_samples_instead_of_striping():
    # 1 sample per 10 s in a 60 s window at 200 columns: ~33 columns per sample.
    t = np.arange(0, 61.0, 10)
    v = np.full_like(t, 2 * GiB)
    rows = _plot_rows(render(Timeline([Series("in use", t, v, v, "green", "fill")], 0, 60, height=5), 200))
    assert " " not in rows[-1]


def test_timeline_ignores_nan_and_points_outside_the_window():
    t = np.arange(0, 100.0)
    hi = np.full_like(t, 1 * GiB)
    hi[10:20] = np.nan
    hi[0] = 99 * GiB  # before the window
    lines = render(Timeline([Series("x", t, hi, hi, "green", "fill")], 5, 99, height=5), 80)
    assert lines[1].split("┤")[0].strip() == "1.00 GiB"
    bottom = _plot_rows(lines)[-1]
    assert " " in bottom.strip()  # the NaN stretch is a gap


@pytest.mark.parametrize("series", [[], [Series("x", np.arange(5.0), np.full(5, np.nan), np.full(5, np.nan), "red", "line")]])
def test_timeline_without_data_says_so(series):
    lines = render(Timeline(series, 0, 60, height=7), 60)
    assert len(lines) == 7
    assert any(line.strip("│ ") == "no data" for line in lines)
    assert "GiB" not in "".join(lines) and "0 B" not in "".join(lines)


def test_timeline_other_units_use_plain_numbers():
    t = np.arange(0, 60.0)
    lines = render(Timeline([Series("h2d", t, t, t, "cyan", "line")], 0, 60, height=5, unit="/s"), 60)
    assert lines[1].split("┤")[0].strip() == "59/s"
    assert lines[-2].split("┤")[0].strip() == "0/s"
    assert "B" not in "".join(lines)


def test_series_kind_is_checked():
    with pytest.raises(ValueError):
        Series("x", np.zeros(1), np.zeros(1), np.zeros(1), "red", "bars")


# ---------------------------------------------------------------- Gauge


def _colors(renderable, width: int = 40) -> set[str]:
    console = _console(width)
    segments = console.render(renderable, console.options)
    return {seg.style.color.name for seg in segments if seg.style and seg.style.color}


@pytest.mark.parametrize(("value", "color"), [(0.1, "green"), (0.45, "yellow"), (0.9, "red")])
def test_gauge_percent_and_color(value, color):
    (line,) = render(Gauge(value), 40)
    assert line.startswith("fragmentation ") and line.endswith(f"{value:.0%}")
    assert _colors(Gauge(value)) == {color}
    full = eighths(line)
    track = line.count("·")
    assert abs(full / 8 / (full / 8 + track) - value) < 0.1


def test_gauge_none_is_dim_na_with_reason():
    (line,) = render(Gauge(None, reason="cuda_async reports no pool", label="frag"), 60)
    assert line == "frag n/a — cuda_async reports no pool"
    assert "%" not in line


# ---------------------------------------------------------------- TimelineStack


def _burst(t0: float, t1: float, step: float, at: float, low: float, high: float):
    """Samples every ``step`` s with ``high`` from ``at`` for 5 s, else ``low``."""
    t = np.arange(t0, t1 + step / 2, step)
    v = np.where((t >= at) & (t < at + 5), high, low)
    return t, v


def _strip_rows(lines: list[str]) -> dict[str, list[str]]:
    """Plot rows of each strip of a rendered stack, by the strip's legend line."""
    out: dict[str, list[str]] = {}
    for line in lines[:-1]:
        if "┤" in line or "│" in line:
            out[current].append(line)
        else:
            current, out[line] = line, []
    return out


@pytest.mark.parametrize("width", (40, 80, 200))
def test_stack_strips_share_one_time_axis(width):
    # Three quantities sampled at different rates, with y labels of different
    # widths ("4.00 GiB", "100%", "20/s"): a burst at t=300 must land in the
    # same column in all three.
    tm, mem = _burst(0, 600, 0.1, 300, 1 * GiB, 4 * GiB)
    tf, frag = _burst(0, 600, 1.0, 300, 0.1, 1.0)
    tt, rate = _burst(0, 600, 0.5, 300, 1.0, 20.0)
    strips = [Strip("memory", [Series("in use", tm, mem, mem, "green", "fill")], min_rows=3),
              Strip("", [Series("fragmentation", tf, frag, frag, "yellow", "fill")], unit="%", y_max=1.0),
              Strip("transfers/s", [Series("h2d", tt, rate, rate, "cyan", "fill")], unit="/s", min_rows=2)]
    lines = render(TimelineStack(strips, 0, 600, 12), width)
    assert len(lines) == 12
    rows = _strip_rows(lines)
    assert len(rows) == 3 and all(rows.values())
    # One label width: every tick at the same column...
    ticks = {line.index("┤") for strip in rows.values() for line in strip if "┤" in line}
    assert len(ticks) == 1
    # ...one x axis, at the bottom, starting under the ticks.
    assert sum("└" in line for line in lines) == 1 and lines[-1].index("└") == ticks.pop()
    assert lines[-1].endswith("now")
    # The top row of each strip holds only the burst: the same columns.
    # (A column the burst fills part of draws its range: ░.)
    burst_cols = [{i for i, ch in enumerate(strip[0]) if ch in "█░" and i > strip[0].index("┤")} for strip in rows.values()]
    assert burst_cols[0] and burst_cols[0] == burst_cols[1] == burst_cols[2]
    plot_w = len(lines[-1]) - lines[-1].index("└") - 1
    first = min(burst_cols[0]) - lines[-1].index("└") - 1
    assert first == int(300 / 600 * plot_w)


def test_stack_na_strip_says_why_instead_of_a_flat_zero():
    t = np.arange(0, 60.0)
    strips = [Strip("memory", [Series("in use", t, t * MiB, t * MiB, "green", "fill")], min_rows=3), Strip("fragmentation", reason=CPU_REASON),
              Strip("transfers/s", [Series("h2d", t, t, t, "cyan", "fill")], unit="/s")]
    lines = render(TimelineStack(strips, 0, 60, 12), 120)
    assert f"fragmentation n/a — {CPU_REASON}" in lines
    assert "0%" not in "".join(lines)
    # Narrow: the reason wraps over the lines it needs, whole.
    narrow = render(TimelineStack(strips, 0, 60, 14), 40)
    start = next(i for i, line in enumerate(narrow) if line.startswith("fragmentation n/a"))
    wrapped = " ".join(line.strip() for line in narrow[start : start + 3])
    assert wrapped.startswith(f"fragmentation n/a — {CPU_REASON}")


def test_stack_drops_optional_strips_first_then_from_the_bottom():
    t = np.arange(0, 60.0)
    s = Series("x", t, t, t, "green", "fill")
    strips = [Strip("memory", [s], min_rows=3, weight=4), Strip("fragmentation", [s], unit="%", y_max=100.0), Strip("free", [s], optional=True),
              Strip("transfers/s", [s], unit="/s", min_rows=2, weight=2), Strip("bytes/s", [s], optional=True)]

    def shown(height: int, width: int = 80) -> list[str]:
        lines = render(TimelineStack(strips, 0, 60, height), width)
        assert len(lines) == height
        return [line.split()[0] for line in lines[:-1] if line and "┤" not in line and "│" not in line]

    assert shown(40) == ["memory", "fragmentation", "free", "transfers/s", "bytes/s"]
    assert shown(14) == ["memory", "fragmentation", "free", "transfers/s", "bytes/s"]  # each its min_rows
    assert shown(12) == ["memory", "fragmentation", "free", "transfers/s"]
    assert shown(10) == ["memory", "fragmentation", "transfers/s"]
    assert shown(5) == ["memory", "fragmentation"]


def test_stack_shares_spare_rows_by_weight():
    t = np.arange(0, 60.0)
    s = Series("x", t, t, t, "green", "fill")
    lines = render(TimelineStack([Strip("a", [s], weight=3), Strip("b", [s], weight=1)], 0, 60, 13), 80)
    rows = _strip_rows(lines)
    # 12 lines: a legend and a row each, then the 8 spare rows 3:1.
    assert [len(r) for r in rows.values()] == [7, 3]


def test_stack_legend_drops_note_then_spacing_then_title():
    t = np.arange(0, 60.0)
    series = [Series(n, t, t, t, "green", "line") for n in ("in use", "peak", "pool", "NVML")]
    strip = Strip("memory", series, note="1.34k allocs/s")
    assert render(TimelineStack([strip], 0, 60, 4), 80)[0] == "memory  ─ in use  ─ peak  ─ pool  ─ NVML  1.34k allocs/s"
    assert render(TimelineStack([strip], 0, 60, 4), 50)[0] == "memory  ─ in use  ─ peak  ─ pool  ─ NVML"
    assert render(TimelineStack([strip], 0, 60, 4), 37)[0] == "memory ─ in use ─ peak ─ pool ─ NVML"
    assert render(TimelineStack([strip], 0, 60, 4), 30)[0] == "─ in use ─ peak ─ pool ─ NVML"


def test_stack_ratio_strip_is_in_percent_of_a_fixed_scale():
    t = np.arange(0, 60.0)
    v = np.full_like(t, 0.25)
    lines = render(TimelineStack([Strip("", [Series("fragmentation", t, v, v, "yellow", "fill")], unit="%", y_max=1.0)], 0, 60, 6), 60)
    labels = [line.split("┤")[0].strip() for line in lines if "┤" in line]
    assert labels == ["100%", "50%", "0%"]  # not scaled up to 25 %
    assert _strip_rows(lines)["█ fragmentation"][-1].count("█") > 40


# ---------------------------------------------------------------- MiniBars


def test_minibars_levels_none_and_zero():
    (line,) = render(MiniBars([0.0, 1.0, None, 8.0, 4.0, float("nan")], 6), 40)
    assert line == "▁▁ █▄ "
    assert line[3] == V_EIGHTHS[8] and line[4] == V_EIGHTHS[4]


def test_minibars_keeps_newest_and_right_aligns():
    (line,) = render(MiniBars(list(range(1, 21)), 8), 40)
    assert len(line) == 8 and line[-1] == "█"  # the newest, largest value
    (short,) = render(MiniBars([5.0, 5.0], 6), 40)
    assert short == "    ██"


def test_minibars_fixed_width_in_a_table():
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_row("h2d", MiniBars([1, 2, 3], width=12))
    (line,) = render(table, 80)
    assert line.rstrip() == "h2d " + " " * 9 + "▃▅█"


# ---------------------------------------------------------------- hostile values

HUGE, NAN, INF = 10**4000, float("nan"), float("inf")  # HUGE: beyond any float, as a hostile recording may hold
HOSTILE = {"huge": HUGE, "-huge": -HUGE, "huger": 10**5000, "nan": NAN, "inf": INF, "-inf": -INF, "None": None, "-5": -5, "1e308": 1e308}


@pytest.mark.parametrize("x", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_formatter_takes_any_number(x):
    texts = [fmt_bytes(x), fmt_rate(x), fmt_rate(x, "B"), fmt_rate(x, "allocs"), fmt_duration(x), fmt.ago(x), fmt.si3(x),
             fmt.fmt_count(x), fmt.pct(x)] + [fmt.axis_value(x, unit) for unit in ("bytes", "%", "/s", "", "GB")]
    assert all(len(text) <= 16 for text in texts), texts
    assert set(texts) == {"n/a"} or not (x is None or x != x)


@pytest.mark.parametrize("x", [*HOSTILE.values(), 1.0], ids=[*HOSTILE, "1.0"])
def test_every_renderable_takes_any_number(x):
    t, v = [0, 1, 2, 3, HUGE], [1, HUGE, NAN, -HUGE, 1e308]
    series = [Series("a", t, v, v, "green", "fill"), Series("b", np.array(t, dtype=object), v, v, "red", "line")]
    bufs = [(HUGE, HUGE), (0, 10), (NAN, 5), (5, INF), (None, 3), (-HUGE, 7), (20, -HUGE), (40, 1e308), (2**70, 1)]
    strips = [Strip("m", series, y_max=x, weight=x), Strip("r", series, unit="%", y_max=x, weight=HUGE), Strip("n", reason="x")]
    drawn = [
        (LayersBar([(f"L{i}", y, "red") for i, y in enumerate(HOSTILE.values())], x), len(HOSTILE) + 1), (Gauge(x), 1),
        (MemoryMap(bufs, count=x, total_hint=x, unmapped={"not_ready": x, "sharded": x, "last_address": x}), 3),
        (MemoryMap([(0, 10)], count=x, total_hint=x), 3), (MemoryMap([], count=x, total_hint=x, unmapped={"not_ready": x}), 1),
        (MiniBars([x, 1, None, 0, x] * 3), 1), (TimelineStack(strips, 0, 3, 10), 10),
    ] + [(Timeline(series, *window, 6, unit="%"), 6) for window in ((0, x), (x, 3), (-HUGE, HUGE))]
    for renderable, n_lines in drawn:
        for width in (20, 80):
            lines = render(renderable, width)
            assert len(lines) == n_lines and all(cell_len(line) <= width for line in lines), lines


def test_a_huge_integer_reads_as_the_largest_value_with_the_one_byte_formatter():
    assert fmt_bytes is units.fmt_bytes
    assert [fmt_bytes(-HUGE), fmt_rate(HUGE), fmt_rate(HUGE, "B"), fmt_duration(HUGE)] == ["->999 EiB", ">999T/s", ">999 EiB/s", ">99999d"]
    assert render(LayersBar([("x", HUGE, "red")], HUGE), 40)[0] == "x " + "█" * 23 + "  >999 EiB 100%"
    assert render(Gauge(HUGE), 30) == ["fragmentation " + "█" * 10 + " >999%"]
    assert render(MiniBars([HUGE, 1, 0], 10), 40) == ["       █▁▁"]
    assert render(MemoryMap([(0, HUGE)], rows=1), 60) == ["█" * 60, "1 buffer, >999 EiB used of >999 EiB span (0% gaps)"]


@pytest.mark.parametrize("argv, shown", [
    (["/usr/bin/python3.11", "-m", "jaxtop", "run", "/home/u/train.py", "--lr", "3"], "train.py --lr 3"),
    (["/venv/bin/jaxtop", "run", "-m", "pkg.train"], "-m pkg.train"), (["/home/u/train.py"], "train.py"), ([], "?"),
])
def test_short_command_drops_interpreter_and_wrapper(argv, shown):
    from jaxtop.widgets.panels import short_command

    assert short_command(argv) == shown
