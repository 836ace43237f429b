"""How often the agent may do its costly work: allowances of CPU and bytes.

The agent runs inside someone's training job, whose steps must not slow down
however many arrays and executables the job holds. Its cheap totals are read
every tick; each costly detail (the live-array scan, the buffer map) draws on
an allowance that fills at a fixed share of one core (or of bytes per second
for what goes on the wire) and pays for what the last run actually cost:

* In steady state a detail that costs ``c`` runs every ``c / share``
  seconds, so its average cost is ``share`` whatever the program holds.
* Quiet seconds are not saved up (``window_s`` is 0 by default): after a
  long pause, the process stopped by a debugger or SIGSTOP, the detail
  does not run back to back to spend what the pause earned. A rare burst
  (a checkpoint restored, 10,000 new arrays at once) is paid by waiting.
* Reading an array costs once, when a scan first sees it: 10,000 arrays
  made at start-up cost ~0.15 s, a price paid once, like jax's own warm-up,
  not out of the next minutes' share. So the first run is free (a program
  that already holds 50,000 arrays when the agent is injected), and the
  agent pays for the first :data:`READ_CREDIT_S` of reading arrays from a
  credit of its own (a program that makes its arrays after the agent
  started: an early scan finds none). Listing and comparing the arrays is
  always paid from the allowance: that is the steady cost.

:class:`SelfMeter` measures the agent thread's own CPU share over a window;
when the thread as a whole is over :data:`CPU_BUDGET` (many devices, many
clients), every allowance fills proportionally slower.

The ticks themselves have a cost no allowance pays for: waking ten times a
second, reading each probe's cheap totals, keeping the sample. On a small
VM the wake-up alone costs ~100 us of the thread's CPU (0.1 % of a core at
10 Hz; measured on a 2-core Firecracker VM), and a program making a
thousand implicit transfers a second adds reading, counting and tying them
to lines: the thread then reads ~0.5 % of a core at 10 Hz on that VM, more
on a TPU VM's gVisor sandbox, whose system calls cost more. So the thread's
share has a ceiling, :data:`CPU_CEILING`: while the share over the last
windows is above :data:`TICK_TARGET` of it, the tick interval stretches
until it is not (at most :data:`MAX_TICK_STRETCH` times the one asked for),
and it comes back as the share falls (:meth:`SelfMeter._stretch`). Samples stay exact: every counter is cumulative
and each sample says its own time; the agent's record says the interval it
runs at (``tick_s``) and why.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

#: Share of one core the whole agent thread aims to stay under: over it,
#: the costly details run less often.
CPU_BUDGET = 0.004
#: Share of one core the agent thread stays under whatever the program
#: does: over :data:`TICK_TARGET` of it, the ticks come less often.
CPU_CEILING = 0.005
#: The share the tick interval is stretched to reach when over the ceiling's
#: target: a margin below the ceiling for the window-to-window spread (the
#: share of runs of the same program spreads by about +-0.05 % of a core).
TICK_TARGET = 0.85
#: The tick interval never stretches beyond this many times the one asked
#: for (5 samples a second at the default 0.1 s). Not all of the agent's
#: cost comes with ticks: on a TPU v5e VM, an agent tying 1,000 transfers/s
#: to lines read 0.55 % of a core at 10 Hz and 0.46 % at ~5 Hz (minutes of
#: windows each), so stretching further would cost samples and save little.
MAX_TICK_STRETCH = 2.0
#: The stretch follows the median of this many windows (a minute), and
#: moves only once three are in: one window's share spreads, and a training
#: loop's cost is steady. On a TPU VM (gVisor) the thread clock is charged
#: 10 ms at a time, 0.1 % of a core over a window: an agent near 0.45 %
#: read 0.10 % to 0.87 % window by window there, and its start-up (the
#: TPU's initialisation, first compiles) filled two windows at 1.0-1.2 %.
TICK_WINDOWS = 6
#: Share of one core granted to the live-array scan (the exact totals).
SCAN_SHARE = 0.001
#: Share granted to deriving the detail (top buffers, address map, holes).
DETAIL_SHARE = 0.0004
#: Bytes per second the buffer maps may add to the stream (recordings keep
#: every map: 8 devices x 1,250 buffers are ~140 KB a map).
MAP_BYTES_PER_S = 1500.0
#: Seconds of share an allowance can save up.
WINDOW_S = 0.0
#: A CPU allowance charges the mean cost of this many recent runs. Thread
#: clocks can be coarse: under gVisor (a TPU VM's sandbox) it ticks in 10 ms
#: grains, so a 3 ms scan reads 0 or 10 ms. Charged as read, one 10 ms
#: reading bought a 10 s wait at 0.1 % of a core (37 s under pressure, seen
#: on a TPU); the mean of the readings is still the true cost on average,
#: so the share holds and no single reading stalls the detail.
SMOOTH_RUNS = 8
#: CPU seconds of reading arrays paid for apart, once (see above).
READ_CREDIT_S = 0.5
#: CPU seconds an allowance holds at start.
START_CPU_S = 0.0
#: Seconds over which the agent measures its own CPU share.
SELF_WINDOW_S = 10.0
#: Most the allowances are slowed when the agent is over its budget anyway.
MAX_PRESSURE = 8.0
#: A tick this late (seconds) asks whether the process was stopped...
SUSPEND_MIN_S = 1.0
#: ... which it was when all its threads together used less than this share
#: of one core since the last slow tick (a busy program starving the agent
#: of the GIL uses one core or more).
SUSPEND_CPU_SHARE = 0.25


class Allowance:
    """A budget that fills at ``share`` per second and pays for each run.

    Args:
        share: what one second of wall time earns (CPU seconds, or bytes).
        window_s: the most it saves up, in seconds of share.
        start: what it holds at first.
        smooth: each run is charged the mean cost of the last ``smooth``
            runs (1: as measured; see :data:`SMOOTH_RUNS`).
    """

    def __init__(self, share: float, window_s: float = WINDOW_S, start: float = 0.0, smooth: int = 1) -> None:
        self.share = float(share)
        self.cap = self.share * window_s
        self.held = float(start)
        self._t: float | None = None
        self.slowdown = 1.0  # set by SelfMeter: fills this much slower
        self.runs = 0
        self._recent: deque[float] = deque(maxlen=max(1, smooth))

    def _fill(self, mono: float) -> None:
        if self._t is not None and self.held < self.cap:
            self.held = min(self.cap, self.held + (mono - self._t) * self.share / self.slowdown)
        self._t = mono

    def ready(self, mono: float) -> bool:
        """True when the last run is paid for."""
        self._fill(mono)
        return self.held >= 0.0

    def spend(self, cost: float, mono: float) -> None:
        self._fill(mono)
        if self.runs:
            # The first run is free and stays out of the mean too: it reads
            # every array once, a cost the steady runs do not have.
            self._recent.append(cost)
            self.held -= sum(self._recent) / len(self._recent)
        self.runs += 1

    def shift(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds: they earn nothing."""
        if self._t is not None:
            self._t += gap

    def wait_s(self) -> float:
        """Seconds until :meth:`ready` (0 when it is)."""
        return max(0.0, -self.held) * self.slowdown / self.share if self.share > 0 else float("inf")


class SelfMeter:
    """The agent thread's CPU share over the last :data:`SELF_WINDOW_S`,
    the slowdown it sets on allowances while over :data:`CPU_BUDGET`, and
    the tick stretch that keeps it under :data:`CPU_CEILING`."""

    def __init__(self, budget: float = CPU_BUDGET, window_s: float = SELF_WINDOW_S,
                 ceiling: float = CPU_CEILING) -> None:
        self.budget = budget
        self.window_s = window_s
        self.ceiling = ceiling
        self.share: float | None = None
        self.pressure = 1.0
        #: The tick interval is this many times the one asked for (1: as asked).
        self.tick_stretch = 1.0
        self._windows = 0
        # Each window's share scaled to the interval asked for (share x stretch).
        self._unit_shares: deque[float] = deque(maxlen=TICK_WINDOWS)
        self._start: tuple[float, float] | None = None  # (monotonic, thread CPU)

    def shift(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds: not idle ones."""
        if self._start is not None:
            self._start = (self._start[0] + gap, self._start[1])

    def update(self, mono: float, thread_cpu: float, allowances: tuple[Allowance, ...]) -> None:
        if self._start is None:
            self._start = (mono, thread_cpu)
            return
        t0, cpu0 = self._start
        if mono - t0 < self.window_s:
            return
        self.share = (thread_cpu - cpu0) / (mono - t0)
        self.pressure = min(MAX_PRESSURE, max(1.0, self.pressure * self.share / self.budget))
        for allowance in allowances:
            allowance.slowdown = self.pressure
        self.tick_stretch = self._stretch(self.share)
        self._start = (mono, thread_cpu)

    def _stretch(self, share: float) -> float:
        """The tick stretch for the next window.

        A window's share at stretch ``s`` is ``A/s + B``: ``A`` what the
        ticks cost at the interval asked for, ``B`` what does not come with
        ticks (a thousand transfers a second to read and tie). ``share x s``
        (``A + B s``) is taken as the cost at the interval asked for, its
        median over the last :data:`TICK_WINDOWS` windows (the lower of the
        middle two when even) divided by the target is the next stretch:
        repeated, it settles where the share is the target (``s = A / (target - B)``), from above or below, or at
        :data:`MAX_TICK_STRETCH`. It moves only when the share it predicts
        at the present stretch is over the target or a fifth under it (runs
        of one program spread that much), and only once three windows are
        in after the first: the first ones hold the program's start-up
        (imports, the accelerator's initialisation, first compiles, every
        array read once): the first is left out, the median sets a second
        aside."""
        stretch = self.tick_stretch
        self._windows += 1
        if self._windows == 1:
            return stretch
        self._unit_shares.append(share * stretch)
        if len(self._unit_shares) < 3:
            return stretch
        unit = statistics.median_low(self._unit_shares)
        target = self.ceiling * TICK_TARGET
        predicted = unit / stretch
        if predicted > target or (stretch > 1.0 and predicted < 0.8 * target):
            stretch = unit / target
        return min(MAX_TICK_STRETCH, max(1.0, stretch))


class StopDetector:
    """Was the process stopped (SIGSTOP, Ctrl-Z, a debugger, a checkpoint)
    when a tick comes late, rather than busy?

    A stopped process changed nothing meanwhile: every costly detail's next
    run then moves on by the stop, as if those seconds had not passed, so
    what the agent shows is still the present and a process thawed for a
    moment does not pay for every pass that fell due while it was frozen.
    A process whose threads kept running (the agent starved of the GIL by a
    busy program) used :data:`SUSPEND_CPU_SHARE` of a core or more since the
    last slow tick, and is not moved.
    """

    def __init__(self) -> None:
        self._mark: tuple[float, float] | None = None  # (monotonic, process CPU) at the last slow tick
        self.suspended_s = 0.0  # wall time the process spent stopped, as far as could be told

    def slow_tick(self, mono: float) -> None:
        """Note the process's CPU clock at a slow tick."""
        self._mark = (mono, time.process_time())

    def stopped_for(self, now: float, late: float) -> float:
        """A tick ``late`` seconds late at ``now`` (monotonic): the seconds
        the process was stopped (``late``), or 0 when it was busy."""
        mark = self._mark
        if mark is None:
            return 0.0
        elapsed = now - mark[0]
        try:
            used = time.process_time() - mark[1]
        except OSError:
            return 0.0
        if elapsed <= 0 or used > SUSPEND_CPU_SHARE * elapsed:
            return 0.0
        self.suspended_s += late
        self._mark = (mark[0] + late, mark[1])
        return late
