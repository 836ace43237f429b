"""Lines that move data or dispatch work every step: placement (host values
fed to jitted calls), batching (one call or array per item), jit (jax ops run
one by one), host syncs (device values read on the host), and the transfer
guard that would have caught the implicit copies.

Their evidence is the agent's ``transfer_sites`` (every implicit transfer
tied to its line, with what the call passed) and ``host_syncs`` (every host
read tied to its line), as running totals over the window: a line counts
when its total rose in most slices of the window, the last ones included.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

from jaxtop.advice.detectors.base import Found, Window, bytes_per_s, comprehension, per_s, short
from jaxtop.advice.evidence import TransferLine
from jaxtop.advice.series import Steady
from jaxtop.advice.types import INFERRED, MEASURED, Advice, NotJudged
from jaxtop.wire.units import fmt_bytes

__all__ = ["Flow", "batching", "flows", "guard", "host_sync", "jit_ops", "placement"]

#: The least rate a steady line must keep to be advised on (a step a second
#: still makes its copy every step).
MIN_RATE = 0.2
#: A line called this many times for each call of another steady line (the
#: step) makes one call per item: batching.
ITEMS_PER_STEP = 4
#: jax ops that make an array from a host value (jnp.asarray, jnp.zeros):
#: set-up, not per-step work that jit would fuse.
CREATION_OPS = ("convert_element_type", "broadcast_in_dim", "iota")
#: Host reads at least this share of the step's calls are read every step
#: (or so); fewer are the loss read every few steps: advice already taken.
EVERY_STEP = 0.5
#: A copy at most this large, made several times per step, is one item of
#: a batch.
SMALL_ITEM = 16 << 10
#: Memory profiles a site of small arrays must be listed in, with as many.
PROFILES_SEEN = 2
#: A comprehension's site of at least this many arrays of at most
#: SMALL_ARRAY bytes each: arrays made one by one that could be one.
MANY_ARRAYS = 8
SMALL_ARRAY = 4096
#: Lines from a line of eager op calls within which the ops jax compiled for
#: eager dispatch are counted as the same code's.
OPS_NEAR = 6


@dataclass(frozen=True)
class Flow:
    """A steady line of implicit host-to-device copies into a jitted call."""

    line: TransferLine
    count: Steady  # transfers
    calls: Steady  # the calls that made them
    bytes: Steady | None  # None: some size unknown
    per_item: float | None  # calls per call of the step line (batching), if one
    step: TransferLine | None  # that step line

    @property
    def batching(self) -> bool:
        """One call per item: made from a comprehension, or small copies
        made several times per call of the step. (A large copy made more
        often than another line is the step itself, the other line being
        run every few steps: an evaluation, a loss read.)"""
        if comprehension(self.line.function):
            return True
        if self.per_item is None or self.per_item < ITEMS_PER_STEP:
            return False
        each = self.bytes.rise / self.count.rise if self.bytes is not None and self.count.rise else None
        return each is not None and each <= SMALL_ITEM


def _steady(w: Window, line: TransferLine) -> tuple[Steady, Steady, Steady | None] | None:
    count = line.count.over(w.start, w.end)
    if not count.steady or count.per_s < MIN_RATE:
        return None
    calls = line.calls.over(w.start, w.end) if line.calls.times else count
    size = line.bytes.over(w.start, w.end) if line.bytes.times else None
    return count, calls, size


def flows(w: Window) -> list[Flow]:
    """The steady lines of implicit h2d copies into jitted functions (not
    jax ops run eagerly), busiest first, each with its calls per step where
    another steady line sets the step. Worked out once per evaluation."""
    cached = w.memo.get("flows")
    if cached is None:
        cached = w.memo["flows"] = _flows(w)
    return cached


def _flows(w: Window) -> list[Flow]:
    found = []
    for line in w.ev.transfers.values():
        if line.direction != "h2d" or line.op:
            continue
        steady = _steady(w, line)
        if steady is not None:
            found.append((line, *steady))
    # The step: the least busy steady line feeding another jitted
    # function; a line called k times for each of its calls runs once per
    # item. (Host reads are no measure of the step: a loss read every tenth
    # step is the advice already taken.)
    steps = sorted(((calls.per_s, id(line), line) for line, _, calls, _ in found if not comprehension(line.function)),
                   key=lambda x: x[0])
    out = []
    for line, count, calls, size in found:
        # The least busy steady line of another callee: the first of them
        # in rate order (a line or two of the same callee may come first).
        found_step = next(((rate, other) for rate, _, other in steps if other is not line and other.callee != line.callee),
                          None)
        per_item, step = None, None
        if found_step is not None:
            rate, step = found_step
            per_item = calls.per_s / rate if rate > 0 else None
        out.append(Flow(line, count, calls, size, per_item, step))
    out.sort(key=lambda f: -f.count.per_s)
    return out


#: Arrays named in one placement fix.
MAX_PUT = 3


def _args(line: TransferLine) -> tuple[str, list[str], list[str]]:
    """What the line's calls copy (``NumPy float32[64,256] batch``), and the
    names of its array and of its Python scalar arguments."""
    site = line.latest
    args = (site.args if site is not None else None) or []
    parts, arrays, scalars = [], [], []
    for a in args:
        kind = a.kind or "value"
        name = a.name or "(unnamed)"
        parts.append(f"{kind} {a.shape or '?'} `{name}`")
        (scalars if "scalar" in kind else arrays).append(name)
    return ", ".join(parts) or "values the agent did not describe", arrays, scalars


def _same(line: TransferLine, names: list[str]) -> dict[str, bool]:
    """Of ``names``, those the agent compared between two calls it read:
    True where the value was the same at both (the same array object with
    the same contents, the same scalar), False where it was another."""
    site = line.latest
    return {a.name: a.same for a in (site.args if site is not None else None) or ()
            if a.name in names and a.same is not None}


def _score_rate(rate: float, weight: float = 1.0) -> float:
    """A rate's expected gain as a share: 100/s reads 0.5."""
    return weight * rate / (rate + 100.0)


def placement(w: Window) -> Found:
    if w.no_sites:
        return [NotJudged("placement", w.no_sites)]
    out: Found = []
    for flow in flows(w):
        if flow.batching:
            continue
        line = flow.line
        what, arrays, scalars = _args(line)
        rate = flow.count.per_s
        # The agent sizes a line's bytes from the arguments a call passed
        # (inferred: a call of other shapes moves other bytes), hence "~".
        moved = f" (~{bytes_per_s(flow.bytes.per_s)})" if flow.bytes is not None and flow.bytes.rise > 0 else ""
        # The count is measured, the bytes are not: a line whose calls pass
        # arrays of several shapes in turn (a train set, then a test set) is
        # sized by the calls read (MNIST's evaluation read 26.6 MiB/s for ~16.8).
        sized = " (bytes sized by the mean of the last calls read: calls of other shapes move other bytes)" if moved else ""
        fixes, seen = [], []
        same = _same(line, arrays + scalars)
        constant = [n for n in arrays if same.get(n) is True]
        fresh = [n for n in arrays if same.get(n) is False]
        if constant:
            names = ", ".join(f"`{n}`" for n in constant)
            fixes.append(f"{constant[0]} = jax.device_put({constant[0]}) once, before the loop: it is the same value "
                         f"every call")
            seen.append(f"{names}: the same array (object and contents) at two calls read")
        if fresh:
            seen.append(", ".join(f"`{n}`" for n in fresh) + ": new data at each call read")
        rest = [n for n in arrays if n not in constant]
        split = _split_args(w, line)
        if rest:
            # Every array the calls copy, in one put (jax's spmd example
            # copies x and y: a fix that named x alone left y's copies).
            put = rest[:MAX_PUT]
            lhs = ", ".join(put)
            rhs = lhs if len(put) == 1 else f"({lhs})"
            sharded = [n for n in put if n in split]
            where = f"{rhs}, {_SHARDED}" if sharded else rhs
            unsure = [n for n in put if n not in fresh]
            fixes.append(f"{lhs} = jax.device_put({where}) one step ahead of the call (prefetch the next batch while "
                         f"this step runs)" + ("" if not unsure else f"; if `{unsure[0]}` is the same array every call, "
                                                                     f"jax.device_put it once before the loop"))
            if sharded:
                axes = "its first axis is" if len(sharded) == 1 else "their first axes are"
                fixes.append(f"{axes} one slice a device ({len(w.ev.devices)} devices): a plain "
                             f"jax.device_put({sharded[0]}) puts it whole on one device, and each call then copies "
                             f"the slices device to device")
        fixed = [n for n in scalars if same.get(n) is True]
        moving = [n for n in scalars if n not in fixed]
        if fixed:
            fixes.append(", ".join(f"`{n}`" for n in fixed) + " is the same value at each call read: "
                         "jnp.asarray it once before the loop")
        if moving:
            names = ", ".join(f"`{n}`" for n in moving)
            changes = " (it changes every call)" if any(same.get(n) is False for n in moving) else ""
            fixes.append(f"keep {names} on the device{changes}: a jnp array carried in the step's state and updated "
                         f"inside `{line.callee}` (static_argnums would recompile for each new value)")
        compared = f"; {'; '.join(seen)}" if seen else ""
        out.append(Advice(
            strategy="placement", file=line.file, line=line.line, function=line.function, jitted=line.callee,
            title=(f"put what `{line.callee}` is fed on the device once, before the loop" if constant and not rest
                   and not moving else f"put what `{line.callee}` is fed on the device ahead of the call"),
            evidence=f"{per_s(rate)} implicit host-to-device copies{moved} of {what} at {short(line.file, line.line)} "
                     f"into `{line.callee}` {w.over()}{compared}{sized}",
            gain=f"-{per_s(rate)} implicit transfers on the call path{moved}",
            fix="; ".join(fixes) or f"jax.device_put the arguments of `{line.callee}` before the call",
            basis=MEASURED, window_s=w.span_s, score=_score_rate(rate)))
    out += _device_to_device(w)
    return out


#: A batch split along its first axis, a slice a device: what a pmap (or a
#: jit over a one-axis mesh) takes without copying.
_SHARDED = "NamedSharding(Mesh(jax.devices(), ('d',)), P('d'))"
_LEADING = re.compile(r"\[(\d+)[,\]]")


def _split_args(w: Window, line: TransferLine) -> set[str]:
    """The line's array arguments whose first axis is as long as the process
    has devices (more than one): a batch meant to be split, a slice a device."""
    n = len(w.ev.devices)
    site = line.latest
    if n < 2 or site is None:
        return set()
    out = set()
    for a in site.args or ():
        m = _LEADING.search(a.shape or "")
        if m and int(m.group(1)) == n and a.name and "scalar" not in (a.kind or ""):
            out.add(a.name)
    return out


def _device_to_device(w: Window) -> Found:
    """Steady implicit device-to-device copies into a jitted function: an
    argument put whole on one device (a plain jax.device_put) that the call
    runs split across the devices, or on another device."""
    out: Found = []
    for line in w.ev.transfers.values():
        # An op too: pmap splits an argument across its devices with one of
        # jax's own (`_multi_slice`), and that is the copy to avoid.
        if line.direction != "d2d":
            continue
        steady = _steady(w, line)
        if steady is None:
            continue
        rate = steady[0].per_s
        what, arrays, _ = _args(line)
        name = arrays[0] if arrays and not line.op else "the argument"
        into = (f"by jax's `{line.callee}` (an argument split across the devices by copying)" if line.op
                else f"into `{line.callee}`")
        out.append(Advice(
            strategy="placement", file=line.file, line=line.line, function=line.function, jitted=line.callee,
            title=f"put what the call at {short(line.file, line.line)} is fed where it runs: it is copied device "
                  f"to device",
            evidence=f"{per_s(rate)} implicit device-to-device copies at {short(line.file, line.line)} {into} "
                     f"{w.over()}" + ("" if line.op else f", of {what}"),
            gain=f"-{per_s(rate)} device-to-device copies on the call path",
            fix=f"put {name} with the sharding the call runs with, ahead of it: for a batch split along its first "
                f"axis (pmap, or jit over a mesh) jax.device_put(x, {_SHARDED}), not jax.device_put(x) alone, "
                f"which puts it whole on one device",
            basis=MEASURED, window_s=w.span_s, score=_score_rate(rate, 0.8)))
    return out


def batching(w: Window) -> Found:
    if w.no_sites:
        return [NotJudged("batching", w.no_sites)]
    out: Found = []
    seen: set[tuple[str, int]] = set()
    for flow in flows(w):
        if not flow.batching:
            continue
        line = flow.line
        what, arrays, _ = _args(line)
        calls = flow.calls.per_s
        each = fmt_bytes(flow.bytes.rise / flow.count.rise) if flow.bytes is not None and flow.count.rise else "?"
        if flow.per_item is not None and flow.per_item >= ITEMS_PER_STEP and flow.step is not None:
            per = f", {flow.per_item:.0f} for each call of `{flow.step.callee}` at {short(flow.step.file, flow.step.line)}"
            gain = f"-{per_s(calls * (1 - 1 / flow.per_item))} dispatches and copies (one call per step, not {flow.per_item:.0f})"
        else:
            per = " from a comprehension (one call per item)"
            gain = f"up to -{per_s(calls)} dispatches and copies: one call per batch instead of one per item"
        seen.add((line.file, line.line))
        out.append(Advice(
            strategy="batching", file=line.file, line=line.line, function=line.function, jitted=line.callee,
            title=f"call `{line.callee}` once on the stacked items, not once per item",
            evidence=f"{per_s(calls)} calls of `{line.callee}` at {short(line.file, line.line)}, each copying {what} "
                     f"({each} a copy){per} {w.over()}",
            gain=gain,
            fix=f"xs = jax.device_put(np.stack(items)); {line.callee}(xs) with `{line.callee}` written for a batch "
                f"(or jax.vmap of it), one call where there were one per item",
            basis=MEASURED, window_s=w.span_s, score=_score_rate(calls)))
    out += _many_small_arrays(w, seen)
    return out


def _many_small_arrays(w: Window, seen: set[tuple[str, int]]) -> Found:
    """Arrays made one by one in a comprehension (a ``device_put`` per item):
    the memory profiles list many small buffers at its line, profile after
    profile. Explicit transfers are not logged by jax's guard, so this is
    the one trace they leave: inferred."""
    profiles = list(w.ev.profiles)[-4:]
    if len(profiles) < PROFILES_SEEN:
        return []
    counts: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    for p in profiles:
        for site in p.sites or ():
            if site.file is None or site.line is None or site.library or not comprehension(site.function):
                continue
            n, b = site.count or 0, site.bytes or 0
            if n >= MANY_ARRAYS and b / n <= SMALL_ARRAY:
                counts.setdefault((site.file, int(site.line)), []).append((int(n), int(b), site.function or ""))
    out: Found = []
    for (file, line), rows in counts.items():
        if len(rows) < PROFILES_SEEN or (file, line) in seen:
            continue
        n, b, function = rows[-1]
        out.append(Advice(
            strategy="batching", file=file, line=line, function=function, jitted=None,
            title="make the items one array: one device_put, one buffer",
            evidence=f"{n} arrays of {fmt_bytes(b / n)} each live from {short(file, line)} (made one by one in a "
                     f"comprehension) in {len(rows)} of the last {len(profiles)} memory profiles",
            gain=f"{n - 1} fewer buffers and transfers each time the line runs ({n} -> 1)",
            fix="xs = jax.device_put(np.stack(items)) once, and index xs[i] where the items were used",
            basis=INFERRED, window_s=w.span_s, score=0.05 + 0.1 * min(1.0, n / 64)))
    return out


def jit_ops(w: Window) -> Found:
    """jax ops run one by one outside jit, every step: seen where they take
    a host value (a Python scalar), as each such op's implicit transfer is
    tied to its line; ops on device arrays alone leave no per-call trace."""
    if w.no_sites:
        return [NotJudged("jit", w.no_sites)]
    groups: dict[tuple[str, str], list[tuple[TransferLine, Steady]]] = {}
    for line in w.ev.transfers.values():
        if line.direction != "h2d" or not line.op or line.callee.startswith(CREATION_OPS):
            continue
        steady = _steady(w, line)
        if steady is None:
            continue
        groups.setdefault((line.file, line.function), []).append((line, steady[1]))
    ledger = w.ledger
    # The ops jax compiled for eager dispatch, by the line and function that
    # first ran each (the ledger's executables): ops on device arrays alone
    # show there, once per shape.
    # The listed executables name the function; the functions' rows (every
    # op, the largest executables only are listed) name only the line.
    eager_at: dict[tuple[str, int, str | None], set[str]] = {}
    for ex in (ledger.executables if ledger is not None else ()):
        if ex.eager and ex.call_site and ex.name:
            path, _, num = ex.call_site.rpartition(":")
            if num.isdigit():
                eager_at.setdefault((path, int(num), ex.call_fn or ""), set()).add(ex.name.removeprefix("jit_"))
    for fn in (ledger.functions if ledger is not None else ()):
        if fn.eager and fn.call_site:
            path, _, num = fn.call_site.rpartition(":")
            op = fn.name.removeprefix("jit_")
            if num.isdigit() and not op.startswith(CREATION_OPS):
                eager_at.setdefault((path, int(num), None), set()).add(op)
    out: Found = []
    for (file, function), lines in groups.items():
        lines.sort(key=lambda x: x[0].line)
        rate = sum(calls.per_s for _, calls in lines)
        # Ops compiled near the group's lines, in the same function where the
        # ledger names it: the ops of device arrays alone, which no transfer shows.
        near = [ln.line for ln, _ in lines]
        here: dict[int, set[str]] = {}
        for (f, n, fn), names in eager_at.items():
            if f == file and (fn is None or fn == function) and min(abs(n - m) for m in near) <= OPS_NEAR:
                here.setdefault(n, set()).update(names)
        numbers = sorted({ln.line for ln, _ in lines} | set(here))
        ops = sorted({ln.callee.removesuffix(" (op)") for ln, _ in lines} | {op for names in here.values() for op in names})
        first = lines[0][0]
        where = f"{short(file)}:{numbers[0]}" + (f"-{numbers[-1]}" if len(numbers) > 1 else "")
        if function == "<module>":
            fix = "move these per-step ops into the jitted step (or one jitted helper), so they run as one XLA program"
            title = "run the loop's per-step ops inside jit"
        else:
            base = function.rsplit(".", 1)[-1]
            fix = f"{base} = jax.jit({base})  # one XLA program: one dispatch a call instead of one per op"
            title = f"jax.jit `{base}`: its ops run one by one"
        out.append(Advice(
            strategy="jit", file=file, line=first.line, function=function, jitted=None, title=title,
            evidence=f"{per_s(rate)} eager op calls taking a host value at {where} in `{function}` {w.over()} "
                     f"(ops run eagerly there: {', '.join(ops[:8])}{', …' if len(ops) > 8 else ''})",
            gain=f"-{per_s(rate)} dispatches at least (only ops given a host value are counted), and one output "
                 f"buffer per op",
            fix=fix, basis=MEASURED, window_s=w.span_s, score=_score_rate(rate, 0.9)))
    return out


def host_sync(w: Window) -> Found:
    syncs = w.ev.syncs_field
    out: Found = []
    if w.too_short:
        return [NotJudged("host_sync", w.too_short)]
    if syncs is None:
        out.append(NotJudged("host_sync", "the agent sent no host_syncs field (an older agent): host reads are "
                             "judged from jax's guard lines alone"))
    elif syncs.available is False:
        out.append(NotJudged("host_sync", f"host reads are not counted: {syncs.reason or 'the agent gave no reason'}"))
    # The step: the busiest steady line feeding a jitted function (not one
    # item of a batch). A read once every few of its calls is the fix
    # already made (the loss read every N steps), not a read per step.
    # Without such a line the step's rate is unknown (a program that puts
    # every batch on the device ahead has none): a steady read is then not
    # judged, for it may be the loss read every hundred steps.
    steps = [f.calls.per_s for f in flows(w) if not f.batching]
    step_rate = max(steps) if steps else None
    reads: list[tuple[str, int, str, float, str]] = []
    covered: set[tuple[str, int]] = set()
    for sync in w.ev.syncs.values():
        s = sync.count.over(w.start, w.end)
        if not s.steady or s.per_s < MIN_RATE:
            continue
        covered.add((sync.file, sync.line))
        kinds = sync.latest.kinds if sync.latest is not None else None
        how = ", ".join(f"{k}" for k in sorted(kinds or {}, key=lambda k: -(kinds or {}).get(k, 0))) or "read"
        reads.append((sync.file, sync.line, sync.function, s.per_s, how))
    for line in w.ev.transfers.values():
        if line.direction != "d2h" or (line.file, line.line) in covered:
            continue
        steady = _steady(w, line)
        if steady is None:
            continue
        how = line.callee.removeprefix("host read (").removesuffix(")") if line.callee.startswith("host read") \
            else line.callee
        reads.append((line.file, line.line, line.function, steady[1].per_s, how))
    if reads and step_rate is None:
        file, line_no, _, rate, _ = max(reads, key=lambda r: r[3])
        out.append(NotJudged("host_sync", f"{len(reads)} line(s) read device values steadily ({per_s(rate)} at "
                             f"{short(file, line_no)}), but whether that is every step cannot be told: no steady line "
                             f"feeds the step host values, so the step's rate is unknown"))
        return out
    for file, line_no, function, rate, how in reads:
        if step_rate is not None and rate >= EVERY_STEP * step_rate:
            out.append(_sync_advice(w, file, line_no, function, rate, how, step_rate))
    return out


def _sync_advice(w: Window, file: str, line: int, function: str, rate: float, how: str, step_rate: float) -> Advice:
    title = "read device values on the host every N steps, not every step"
    per = f", {rate / step_rate:.1f} per call of the step"
    return Advice(
        strategy="host_sync", file=file, line=line, function=function, jitted=None,
        title=title,
        evidence=f"{per_s(rate)} host reads ({how}) at {short(file, line)}{per} {w.over()}: each waits for every "
                 f"step queued before it",
        gain=f"-{per_s(rate)} host syncs: between reads the loop dispatches ahead of the device",
        fix="if step % 100 == 0: print(float(loss))  # or keep a running sum on the device and jax.device_get it "
            "every N steps",
        basis=MEASURED, window_s=w.span_s, score=_score_rate(rate, 0.8))


def guard(w: Window) -> Found:
    """One piece of advice for the program: the implicit copies made every
    step, and the budget (or guard) that fails a run that makes them."""
    if w.no_sites:
        return [NotJudged("guard", w.no_sites)]
    lines = flows(w)
    if not lines:
        return []
    total = sum(f.count.per_s for f in lines)
    busiest = lines[0].line
    spec = ",".join(f"h2d@{short(f.line.file, f.line.line)}=0" for f in lines[:6])
    where = ", ".join(short(f.line.file, f.line.line) for f in lines[:4]) + (", …" if len(lines) > 4 else "")
    return [Advice(
        strategy="guard", file=busiest.file, line=busiest.line, function=busiest.function, jitted=busiest.callee,
        title="make an implicit copy fail the test, not slow the run",
        evidence=f"{len(lines)} line(s) copy host values to the device implicitly every step ({where}; "
                 f"{per_s(total)} together) {w.over()}, and nothing refused them",
        gain="the next implicit copy is caught where it starts, in CI, before it costs a step",
        fix=f"once fixed: jaxtop run --budget {spec} …  (the lines as they are now: renumber them after the fix "
            f"moves them), or `with jax.transfer_guard_host_to_device('disallow'):` around the loop in a test",
        basis=MEASURED, window_s=w.span_s, score=0.02)]
