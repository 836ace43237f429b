"""What one client may cost the program, and the meters that hold it to it.

The agent's clients are served on the agent thread and never block: sockets
are non-blocking, and whatever a peer does costs the program bounded memory,
file descriptors and CPU:

* at most :data:`MAX_CLIENTS` connections, and none while the process is
  within :data:`FD_RESERVE` descriptors of its ``RLIMIT_NOFILE``
  (:func:`fd_shortage`); extra connections get an ``error`` line and are
  closed at once; accepting (and refusing) is rate limited
  (:data:`ACCEPTS_PER_S`), so connecting and leaving in a loop costs little;
* output is a queue of references to the agent's encoded lines, shared by
  every client, and the history sent on connecting is a range of indices
  into one shared history and references to its coarse records: a client
  never holds a copy of either (a coarse record is decompressed when it is
  its turn to be sent, one at a time). Live samples beyond
  :data:`MAX_CLIENT_BUFFER_BYTES` queued are dropped and counted;
* requests are read at most :data:`REQUESTS_PER_S` a second per client (and
  :data:`TOTAL_REQUESTS_PER_S` for all), and not at all while a client has
  :data:`MAX_CLIENT_REPLY_BYTES` of replies it has not read: the rest waits
  in the kernel and the sender blocks;
* commands are answered within a budget of the agent thread's CPU
  (:class:`CpuBudget`): :data:`CLIENT_COMMAND_CPU_SHARE` of a core per
  client and :data:`COMMAND_CPU_SHARE` for all clients together, whatever
  the command. A request past either gets a short ``rate limited`` error
  that says when to retry; a reply over :data:`MAX_REPLY_BYTES` is refused
  with an error; the commands in :data:`CACHED_COMMANDS` (reads with no side
  effect) are answered from the last reply for a moment;
* bad input, or any failure while serving one client, closes that client
  only.

Some limits can be set through the environment (``JAXTOP_MAX_CLIENTS``,
``JAXTOP_FD_RESERVE``, ``JAXTOP_CLIENT_BUFFER_BYTES``), read once at import.
"""

from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not POSIX: no limit to read, and no Unix socket either
    resource = None  # type: ignore[assignment]


def _env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name``; ``default`` when unset or not a number."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


#: Connections served at once. A dashboard, a recorder and a few ``jaxtop
#: ls`` need a handful; past this, connections are refused with an error.
MAX_CLIENTS = _env_int("JAXTOP_MAX_CLIENTS", 64)
#: File descriptors always left to the program: no client is accepted while
#: the process has more than ``RLIMIT_NOFILE - FD_RESERVE`` open (the reserve
#: is at most a quarter of a small limit).
FD_RESERVE = _env_int("JAXTOP_FD_RESERVE", 128)
#: Queued bytes per client before live samples are dropped for it.
MAX_CLIENT_BUFFER_BYTES = _env_int("JAXTOP_CLIENT_BUFFER_BYTES", 16 * 1024 * 1024)
#: A client's own unread replies (and notices) after which its requests are
#: no longer read, until it reads: replies are the one output that is not
#: shared, so this bounds what a client that never reads can cost.
MAX_CLIENT_REPLY_BYTES = 256 * 1024
#: Requests read per second from one client (a bucket of REQUEST_BURST).
REQUESTS_PER_S = 10.0
REQUEST_BURST = 20
#: Requests read per second from all clients together.
TOTAL_REQUESTS_PER_S = 100.0
TOTAL_REQUEST_BURST = 100
#: A client that ran out of budget is read again once it has this many
#: requests' worth: one wake-up per batch, not one per request.
REQUEST_BATCH = 10
#: Agent-thread CPU that one client's commands may use, as a share of one
#: core on average: what a command cost (its handler and the encoding of its
#: reply, measured with the thread's CPU clock) is taken from the client's
#: bucket, which holds at most CLIENT_COMMAND_CPU_BURST_S. A command runs
#: while the bucket is above zero, so one dearer than the burst still runs
#: once; the bucket then owes at most one burst (a wait of burst / share).
CLIENT_COMMAND_CPU_SHARE = 0.01
CLIENT_COMMAND_CPU_BURST_S = 0.1
#: The same for the commands of all clients together: a flood from many
#: clients costs the program at most this share of a core on average. A
#: connection that has asked little lately (half its own burst or more left)
#: may draw on a reserve of half this burst beyond it, so that a flood from
#: other connections does not lock it out.
COMMAND_CPU_SHARE = 0.03
COMMAND_CPU_BURST_S = 0.3
#: The largest reply to a command, in bytes of JSON: a larger result is
#: answered with an error (replies are the client's own output, not shared).
MAX_REPLY_BYTES = 8 * 1024 * 1024
#: Commands whose reply is kept and served again to an identical request
#: (same name and arguments, any client) for this many seconds: reads that
#: change nothing and cost a pass over the program's state.
CACHED_COMMANDS = {"jit_ledger": 1.0}
#: Connections accepted or refused per second (a bucket of ACCEPT_BURST).
ACCEPTS_PER_S = 50.0
ACCEPT_BURST = 64
#: Connections' worth of budget the listener waits for once it ran out.
ACCEPT_BATCH = 10
#: How long the listener rests after accept() failed for want of resources.
ACCEPT_PAUSE_S = 1.0
#: Bytes read from a client at a time.
RECV_BYTES = 65536
#: Bytes handed to one sendmsg(), in at most MAX_IOV pieces.
SEND_CHUNK_BYTES = 256 * 1024
#: Pieces handed to one sendmsg() at most.
MAX_IOV = 512


def _count_open_fds() -> int | None:
    """Open file descriptors of this process, or None when it cannot tell."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # listdir's own descriptor
        except FileNotFoundError:
            continue
        except OSError:
            return 1 << 30  # EMFILE, most likely: as good as full
    return None


def fd_shortage(newest_fd: int) -> str | None:
    """Why one more client would eat into the program's descriptors, or None.

    Args:
        newest_fd: the descriptor just accepted. The kernel hands out the
            lowest free number, so every lower one is open: a cheap lower
            bound on the count.
    """
    if resource is None:
        return None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    reserve = max(1, min(FD_RESERVE, soft // 4))
    ceiling = soft - reserve
    open_fds = newest_fd + 1
    if open_fds <= ceiling:
        counted = _count_open_fds()
        if counted is not None:
            open_fds = max(open_fds, counted)
    if open_fds <= ceiling:
        return None
    return (f"refused: the process has {open_fds} of its {soft} file descriptors open; "
            f"the agent leaves the last {reserve} to the program")


class TokenBucket:
    """``rate`` events a second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self._t = now

    def _refill(self, now: float) -> None:
        if now > self._t:
            self.tokens = min(self.burst, self.tokens + (now - self._t) * self.rate)
        self._t = now

    def ready(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0

    def wait_s(self, now: float, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens (at most the burst) are there."""
        self._refill(now)
        n = min(float(n), self.burst)
        return 0.0 if self.tokens >= n else (n - self.tokens) / self.rate


class CpuBudget(TokenBucket):
    """Seconds of CPU: ``share`` of a core on average, at most ``burst_s`` at once.

    A :class:`TokenBucket` whose tokens are seconds, refilled at ``share``
    a second; unlike plain tokens, work is charged after it ran, by what it
    cost: the budget allows work while it is above zero (or, drawing on its
    reserve, above minus half a burst) and owes at most one burst.
    """

    def __init__(self, share: float, burst_s: float, now: float) -> None:
        super().__init__(share, burst_s, now)

    share = property(lambda self: self.rate)
    burst_s = property(lambda self: self.burst)
    seconds = property(lambda self: self.tokens)

    def _floor(self, reserve: bool) -> float:
        return -0.5 * self.burst_s if reserve else 0.0

    def level(self, now: float) -> float:
        """Seconds left now (negative: owed)."""
        self._refill(now)
        return self.tokens

    def allows(self, now: float, reserve: bool = False) -> bool:
        return self.level(now) > self._floor(reserve)

    def charge(self, now: float, cpu_s: float) -> None:
        self._refill(now)
        self.tokens = max(-self.burst, self.tokens - max(0.0, cpu_s))

    def retry_s(self, now: float, reserve: bool = False) -> float:
        """Seconds until work is allowed again (0 when it is now)."""
        floor = self._floor(reserve)
        level = self.level(now)
        return 0.0 if level > floor else (floor - level) / self.share + 0.001
