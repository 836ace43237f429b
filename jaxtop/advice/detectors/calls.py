"""What the jit ledger says of each jitted function: outputs that could take
their inputs' buffers (donation), arrays rebuilt at a new shape every step
(in-place updates), temporaries that dwarf the function's own arrays
(gradient checkpointing).

The ledger's sizes are XLA's own (``memory_analysis()`` of each live
executable: arguments, outputs, outputs aliased to donated arguments,
temporaries); its compiles and their reasons are jax's. The memory profiles
(``holders``) say which line keeps a function's outputs alive.
"""

from __future__ import annotations

from jaxtop.advice.detectors.base import Found, Window, per_s, short, site_of
from jaxtop.advice.types import INFERRED, MEASURED, Advice, NotJudged
from jaxtop.dashboard.ledger import JitFunction
from jaxtop.wire.records import HolderSite, Holders
from jaxtop.wire.units import fmt_bytes

__all__ = ["checkpointing", "donation", "in_place"]

#: Outputs smaller than this are not worth a donation's constraints.
MIN_DONATION_BYTES = 64 * 1024
#: A function whose outputs are at least this share of its arguments (and
#: not more than all of them) returns something the size of an input it was
#: given: a state it updates (parameters, optimizer state, a buffer).
STATE_SHARE = 0.4
#: The calling line holding between these shares of a function's outputs
#: keeps them: the state is carried from call to call.
HELD_SHARE = (0.5, 1.05)
#: Memory profiles read for what a line holds (the least of them).
PROFILES_READ = 3
#: Temporaries at least this large, and this many times the function's
#: arguments and outputs together, are stored activations or intermediates.
#: (Flax's miniGPT example on CPU: 1.2x, and nnx.remat on its blocks left
#: its temporaries as they were; the demo's scan of layers: 1.6x.)
MIN_TEMP_BYTES = 1 << 20
TEMP_RATIO = 1.5
#: Share of the device's limit above which temporaries matter there whatever
#: the ratio.
TEMP_LIMIT_SHARE = 0.25
#: Functions of jax's own ops (an op run eagerly, its compiles per shape).
GROWING_OPS = ("concatenate", "pad", "append", "stack", "hstack", "vstack", "dynamic_update_slice", "scatter")


def _live_functions(w: Window) -> tuple[list[JitFunction], str | None]:
    ledger = w.ledger
    if ledger is None:
        return [], "no jit ledger in the records (an older agent, or jax's executables could not be read)"
    if not ledger.available:
        return [], f"the jit ledger is n/a: {ledger.reason or 'the agent gave no reason'}"
    return [f for f in ledger.functions if not f.eager and f.live], None


def _growing(w: Window) -> set[str]:
    """Functions compiling again and again in the window (in-place's case)."""
    ledger = w.ledger
    names: set[str] = set()
    if ledger is None:
        return names
    if ledger.storm is not None and ledger.storm.function and (ledger.storm.t or 0) >= w.start:
        names.add(ledger.storm.function)
    return names


def donation(w: Window) -> Found:
    out: Found = []
    failed = w.ev.donation_failed.over(w.start, w.end)
    if failed.rise > 0:
        message = w.ev.donation_message or "jax gave no message"
        out.append(Advice(
            strategy="donation", file=None, line=None, function=None, jitted=None,
            title="a donation failed: the buffer was copied, not reused",
            evidence=f"{failed.rise:.0f} donated buffer(s) jax could not use {w.over()}: {message}",
            gain="the donated input's bytes, at each call: the output is a new buffer while the input is kept",
            fix="donate only arguments whose shape, dtype and sharding match an output, and do not read them "
                "after the call",
            basis=MEASURED, window_s=w.span_s, score=0.3))
    functions, why = _live_functions(w)
    if why:
        return out + [NotJudged("donation", why)]
    profiles = list(w.ev.profiles)
    if not profiles:
        why = w.ev.holders_error or "no memory profile in the records yet: which line keeps a function's outputs is unknown"
        return out + [NotJudged("donation", why)]
    growing = _growing(w)
    for fn in functions:
        out_b, arg_b, alias = fn.output_bytes, fn.argument_bytes, fn.alias_bytes
        if out_b is None or arg_b is None or alias is None or fn.name in growing:
            continue
        # What is not donated yet: the outputs not aliased, against the
        # arguments not donated (a function that donates part of its state
        # is judged on the rest).
        new_b, free_args = out_b - alias, arg_b - alias
        if new_b < MIN_DONATION_BYTES or not STATE_SHARE * free_args <= new_b <= free_args:
            continue
        lo, hi = HELD_SHARE
        call_file, call_line = site_of(fn.call_site)
        # The line that called it (and compiled it) keeps about its outputs'
        # bytes: each call's outputs are kept there until the next call
        # replaces them, a state carried from call to call. A line holding
        # as much elsewhere may be an input's (parameters a gradient
        # function reads every step and never replaces): not evidence.
        site = (_kept_at(profiles, (call_file, call_line), fn.first_t)
                if call_file is not None and call_line is not None else None)
        if site is None or not lo * new_b <= (site.bytes or 0) <= hi * out_b:
            continue
        name = fn.name.removeprefix("jit_")
        defined = f" (defined at {short(*site_of(fn.defined_at))})" if fn.defined_at else ""
        aliased = "none aliased" if not alias else f"{fmt_bytes(alias)} of them aliased already"
        out.append(Advice(
            strategy="donation", file=site.file, line=int(site.line or 0), function=site.function, jitted=name,
            title=f"donate the state `{name}` replaces",
            evidence=f"`{name}` returns {fmt_bytes(out_b)} of outputs from {fmt_bytes(arg_b)} of arguments, "
                     f"{aliased} (XLA's memory analysis), and {short(site.file, int(site.line or 0))} keeps "
                     f"{fmt_bytes(site.bytes)} of them alive: its outputs replace inputs of the same size",
            gain=f"up to -{fmt_bytes(new_b)} of new outputs a call in flight, written into the donated inputs' "
                 f"buffers instead (less what XLA adds to its temporaries to alias them: the ledger shows it after)",
            fix=_donation_fix(fn, name, defined),
            basis=INFERRED, window_s=w.span_s, score=_score_bytes(w, new_b)))
    return out


def _donation_fix(fn: JitFunction, name: str, defined: str) -> str:
    """The change as code: the arguments the compiled function's outputs
    match by dtype and shape, by the names jax gave its parameters
    (``JitFunction.donatable``), where the agent read them; else what to
    donate, in words."""
    if fn.donatable:
        names = "(" + ", ".join(f'"{n}"' for n in fn.donatable) + ("," if len(fn.donatable) == 1 else "") + ")"
        jit = "nnx.jit" if fn.donatable_nnx else "jax.jit"
        also = " (not jax.jit: the modules' updates would be lost)" if fn.donatable_nnx else ""
        return (f"{jit}({name}, donate_argnames={names}){also}{defined}: its outputs match these arguments "
                f"leaf for leaf (dtype and shape, in the compiled function); none may be read after the call")
    return (f"donate every argument whose new value `{name}`{defined} returns (in a training step the "
            f"parameters and the optimizer state, not only the first), none read after the call: "
            f"jax.jit({name}, donate_argnums=...) with their positions; a Flax NNX function: "
            f"nnx.jit({name}, donate_argnames=...) with their names as `{name}` calls them (a training "
            f"step's are often \"model\" and \"optimizer\"), not jax.jit (the modules' updates would be lost)")


def _kept_at(profiles: list[Holders], where: tuple[str, int], since: float | None) -> HolderSite | None:
    """The site ``where`` with the least it held over the last
    :data:`PROFILES_READ` memory profiles taken since ``since`` (the
    function's first compile: no line held its outputs before), if every
    one of them lists it; else None.

    The least: a profile taken while a call's new state and the one it
    replaces were both alive reads twice the state at the line (Flax's
    miniGPT and MNIST examples: the advice came or went with the moment of
    the last profile). Every one: a line one profile caught holding a state
    is no line that keeps it (an evaluation step run every 50 steps, whose
    copy of the model the next training step took over: advice whose fix
    raised)."""
    read = [p for p in profiles if since is None or p.t is None or p.t >= since][-PROFILES_READ:]
    least = None
    for profile in read:
        found = None
        for s in profile.sites or ():
            if (not s.library and s.bytes and s.file and s.line is not None
                    and s.file == where[0] and int(s.line) == where[1]):
                found = s
                break
        if found is None:
            return None
        if least is None or found.bytes < least.bytes:
            least = found
    return least


def _score_bytes(w: Window, nbytes: float) -> float:
    """Bytes as a share of the device memory in use (of 1 GiB where unknown)."""
    in_use = 0.0
    for readings in w.ev.devices.values():
        if readings and readings[-1].in_use:
            in_use = max(in_use, float(readings[-1].in_use))
    base = in_use if in_use > 0 else float(1 << 30)
    return min(1.0, nbytes / (nbytes + base))


def in_place(w: Window) -> Found:
    ledger = w.ledger
    if ledger is None:
        return [NotJudged("in_place", "no jit ledger in the records: compiles per shape are unknown")]
    out: Found = []
    storm = ledger.storm
    if storm is not None and storm.site and (storm.t or 0) >= w.start and storm.kind != "static":
        name = storm.name or (storm.function or "?").removeprefix("jit_")
        sizes = sorted((e.first_t or 0.0, float(e.argument_bytes)) for e in ledger.executables
                       if e.name == storm.function and e.argument_bytes is not None)
        grows = len(sizes) >= 2 and sizes[-1][1] > sizes[0][1]
        # A storm of new shapes; an eager op's that grows or is one of the
        # ops that build a larger array; any storm whose arguments grew (a
        # recording of an agent that worded a storm by its newest reason
        # alone called a grown buffer's storm "a new function object" when
        # the jit was made anew at the restart of the growth).
        if storm.kind in ("types", "unknown") or grows or (storm.kind == "eager" and name in GROWING_OPS):
            file, line = site_of(storm.site)
            rate = storm.rate_per_s
            shapes = (f", its arguments {fmt_bytes(sizes[0][1])} -> {fmt_bytes(sizes[-1][1])}" if grows else "")
            out.append(Advice(
                strategy="in_place", file=file, line=line, function=None, jitted=name,
                title="write into a preallocated buffer instead of rebuilding it",
                evidence=f"{storm.compiles or '?'} compiles of `{name}` within the last {storm.window_s or 60:.0f} s at "
                         f"{short(file, line)}, one per new shape{shapes}"
                         + (f" ({per_s(rate)})" if rate else ""),
                gain=(f"-{per_s(rate)} compiles" if rate else "one compile per shape less")
                     + ", and no copy of the whole array each step",
                fix="buf = jnp.zeros((max_rows, width)) once; then in a jax.jit(..., donate_argnums=(0,)) function "
                    "buf = lax.dynamic_update_slice(buf, row, (i, 0))",
                basis=MEASURED, window_s=w.span_s, score=min(1.0, 0.3 + _rate_share(rate))))
    return out


def _rate_share(rate: float | None) -> float:
    return 0.0 if not rate else rate / (rate + 20.0)


def checkpointing(w: Window) -> Found:
    functions, why = _live_functions(w)
    if why:
        return [NotJudged("checkpointing", why)]
    limit = None
    for readings in w.ev.devices.values():
        if readings and readings[-1].limit:
            limit = max(limit or 0.0, float(readings[-1].limit))
    out: Found = []
    for fn in functions:
        temp, arg_b, out_b = fn.temp_bytes, fn.argument_bytes or 0, fn.output_bytes or 0
        if temp is None or temp < MIN_TEMP_BYTES:
            continue
        big_share = limit is not None and temp >= TEMP_LIMIT_SHARE * limit
        if temp < TEMP_RATIO * (arg_b + out_b) and not big_share:
            continue
        name = fn.name.removeprefix("jit_")
        file, line = site_of(fn.call_site)
        share = f", {100 * temp / limit:.0f} % of the device's {fmt_bytes(limit)}" if limit else ""
        out.append(Advice(
            strategy="checkpointing", file=file, line=line, function=None, jitted=name,
            title=f"recompute `{name}`'s activations instead of storing them",
            evidence=f"XLA's temporaries of `{name}` are {fmt_bytes(temp)}, {temp / max(1, arg_b + out_b):.1f}x its "
                     f"arguments and outputs ({fmt_bytes(arg_b + out_b)}){share}",
            gain=f"part of {fmt_bytes(temp)} at peak where they are activations kept for the backward pass "
                 f"(paid in recompute time)",
            fix="wrap each block (the scan body, each layer) in jax.checkpoint: "
                "lax.scan(jax.checkpoint(body), x, ws); with Flax NNX, nnx.remat on each block; then check in "
                "the ledger that the temporaries fell",
            basis=INFERRED, window_s=w.span_s, score=_score_bytes(w, temp) * 0.8))
    return out
