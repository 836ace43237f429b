"""The jit ledger in the dashboard: the store it is folded into and the Jit screen in the app."""

from __future__ import annotations

import collections
import io

from rich.console import Console

from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.jit_screen import JitScreen
from jaxtop.dashboard.ledger import LedgerStore
from jaxtop.dashboard.sources import PushSource
from jaxtop.wire.records import from_dict
from jaxtop.widgets.jit import JitLedgerTable, sort_functions
from test_jit_ledger import MODEL_FOLDS  # helpers shared with that module

#: The agent keeps the ledger itself (else the children add it in-process).
#: The model folds ``jit`` fields itself (else the tests feed a store).


# -- the dashboard's store --------------------------------------------------------------------

T0 = 1_790_000_000.0


def exe(ident, name, temp, args=1024, out=512, code=0, site="/src/train.py:40"):
    return {"id": ident, "name": name, "fingerprint": str(ident), "argument_bytes": args, "output_bytes": out,
            "alias_bytes": 0, "temp_bytes": temp, "code_bytes": code, "peak_bytes": None, "flops": 1e6,
            "bytes_accessed": 4096.0, "call_site": site, "call_fn": "main", "first_t": T0}


def fn(name, compiles, live, temp, reasons=(), site="/src/train.py:40", args=1024, code=4096):
    return {"name": name, "compiles": compiles, "compiles_source": "monitoring", "compile_s": 0.5 * compiles,
            "live": live, "call_site": site, "defined_at": "/src/train.py:12", "first_t": T0, "last_t": T0 + 10,
            "reasons": list(reasons), "reasons_total": len(reasons), "argument_bytes": args, "output_bytes": 512,
            "alias_bytes": 0, "temp_bytes": temp, "peak_bytes": None, "flops": 2.5e9, "bytes_accessed": 1e6,
            "code_bytes": code}


def reason(t, old, new, line):
    return {"kind": "types", "call_site": f"/src/train.py:{line}", "call_fn": "main", "arg": "x", "old": old,
            "new": new, "t": t}


def fake_fields() -> list[dict]:
    """A run whose step function recompiles for new shapes, then leaks closures."""
    base = {"pending": 0, "compiles_unattributed": 0, "explain": {"enabled": True, "by": "jaxtop", "misses_total": 5}}
    step_reasons = [reason(T0 + 2, "f32[100,64]", "f32[200,64]", 31), reason(T0 + 3, "f32[200,64]", "f32[300,64]", 32),
                    reason(T0 + 4, "f32[300,64]", "f16[300,64]", 33)]
    full = dict(base, t=T0 + 1, full=True, live_count=2, code_bytes=8192, compiles_total=2, leak=None,
                functions=[fn("jit_train_step", 1, 1, 64 << 20, args=200 << 20),
                           fn("jit_eval", 1, 1, 1 << 20, site="/src/eval.py:7")],
                executables=[exe(1, "jit_train_step", 64 << 20), exe(2, "jit_eval", 1 << 20)], trend=[[T0 + 1, 2]])
    fields = [full]
    fields.append(dict(base, t=T0 + 5, full=False, live_count=5, code_bytes=20480, compiles_total=5, leak=None,
                       functions=[fn("jit_step", 4, 3, 436800, reasons=step_reasons, site="/src/train.py:33")],
                       executables=[exe(3, "jit_step", 0), exe(4, "jit_step", 0), exe(5, "jit_step", 436800)], gone=[]))
    leak = {"since_t": T0 + 6, "from_count": 5, "count": 45, "growth": 40, "seconds": 40.0, "passes": 40,
            "site": "/src/loop.py:9", "message": "live executables +40 in 40 s: jit closures created in a loop? (loop.py:9)"}
    for k in range(1, 41):
        t = T0 + 6 + k
        rows = [fn("jit__lambda", k, k, 0, site="/src/loop.py:9", args=32, code=0)]
        fields.append(dict(base, t=t, full=False, live_count=5 + k, code_bytes=20480, compiles_total=5 + k,
                           leak=leak if k >= 5 else None, functions=rows,
                           executables=[exe(5 + k, "jit__lambda", 0, args=32, out=32, site="/src/loop.py:9")],
                           gone=[2] if k == 40 else []))
    return fields


def samples(fields, pid=4242):
    return [{"type": "sample", "t": f["t"], "seq": n, "jit": f} for n, f in enumerate(fields, 1)]


def test_store_folds_full_tables_changes_and_replies():
    store = LedgerStore()
    recs = samples(fake_fields())
    events = [e for r in recs for e in store.feed_sample(4242, from_dict(r))]
    v = store.view(4242)
    assert v.complete and v.live_count == 45
    names = {f.name: f for f in v.functions}
    assert set(names) == {"jit_train_step", "jit_eval", "jit_step", "jit__lambda"}
    assert names["jit_step"].compiles == 4 and names["jit_step"].recompiles == 3
    assert [r.new for r in names["jit_step"].reasons] == ["f16[300,64]", "f32[300,64]", "f32[200,64]"]
    assert len(v.executables) == 44 and 2 not in {e.id for e in v.executables}  # executable 2 was freed
    assert [g.id for g in v.gone] == [2]
    assert v.trend[0] == (T0 + 1, 2) and v.trend[-1] == (T0 + 46, 45) and v.trend_delta(60) == 43
    assert v.leak.site == "/src/loop.py:9"
    kinds = collections.Counter(text.split(" ")[0] for kind, text, t in events if kind == "jit")
    assert kinds == {"recompile": 3, "leak?": 1}  # each reason once, the flag once
    # A reply to the jit_ledger command is a whole table.
    reply = {"type": "reply", "t": T0 + 50, "ok": True,
             "result": {"jit_ledger": dict(fake_fields()[0], t=T0 + 50, gone_recent=[exe(9, "jit_old", 5)])}}
    assert store.feed_reply(4242, from_dict(reply)) is True
    assert store.feed_reply(4242, from_dict({"type": "reply", "result": {"path": "x"}})) is False
    v = store.view(4242)
    assert {f.name for f in v.functions} == {"jit_train_step", "jit_eval"} and [g.id for g in v.gone] == [9]
    # A stream joined in the middle is incomplete until its next whole table.
    late = LedgerStore()
    late.feed_sample(7, from_dict(samples(fake_fields()[10:11])[0]))
    assert not late.view(7).complete and late.view(7).live_count == 14
    # n/a with the reason; forget; adopt
    na = LedgerStore()
    na.feed_sample(8, from_dict({"type": "sample", "t": T0, "jit": {"available": False, "reason": "jax too old"}}))
    assert na.view(8).available is False and na.view(8).reason == "jax too old"
    store.adopt(8, na)
    assert store.view(8).reason == "jax too old"
    store.forget(8)
    assert store.view(8) is None and store.view(None).pid == 4242


def test_a_reply_of_the_wrong_shape_reads_n_a_and_never_raises():
    """A reply's result is decoded when the ledger reads it: its parts of the
    wrong type read n/a (the rest is folded), and a result that holds no
    table is another command's."""
    store = LedgerStore()
    bad = dict(fake_fields()[0], live_count="many", trend=[[T0, 2], [T0], "x"],
               functions=[dict(fn("jit_a", 1, 1, 8), compiles="once"), fn("jit_b", 2, 1, 16)])
    assert store.feed_reply(1, from_dict({"type": "reply", "t": T0, "result": {"jit_ledger": bad}})) is True
    v = store.view(1)
    assert v.complete and v.live_count is None and v.trend == ((T0, 2),)
    assert {f.name: f.compiles for f in v.functions} == {"jit_a": None, "jit_b": 2}
    for result in ({"jit_ledger": [1]}, {"jit_ledger": None}, [1], "text", None):
        assert store.feed_reply(1, from_dict({"type": "reply", "t": T0, "result": result})) is False
    assert store.view(1) == v
    # Numbers a JSON line cannot spell, in a reply built in Python: n/a too.
    huge = dict(fake_fields()[0], live_count=float("inf"), trend=[[T0, float("nan")]])
    assert store.feed_reply(2, from_dict({"type": "reply", "t": T0, "result": {"jit_ledger": huge}})) is True
    assert store.view(2).live_count is None and store.view(2).trend == ()


def render_text(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_jit_table_renders_sorted_with_reasons_and_the_flag():
    store = LedgerStore()
    for r in samples(fake_fields()):
        store.feed_sample(4242, from_dict(r))
    v = store.view(4242)
    by_temp = [f.name for f in sort_functions(v.functions, "temp")]
    assert by_temp[:2] == ["jit_train_step", "jit_eval"]
    assert [f.name for f in sort_functions(v.functions, "compiles")][0] == "jit__lambda"
    assert [f.name for f in sort_functions(v.functions, "total")][0] == "jit_train_step"
    text = render_text(JitLedgerTable(v, sort="temp"))
    assert "⚠ live executables +40 in 40 s: jit closures created in a loop? (loop.py:9)" in text
    assert "live executables 45 (+43 in 60 s)" in text
    assert text.index("jit_train_step") < text.index("jit_eval") < text.index("jit_step")
    reasons = text[text.index("Recompile reasons, latest first"):]
    assert reasons.index("x f32[300,64] → f16[300,64] at train.py:33") < reasons.index("x f32[100,64] → f32[200,64] at train.py:31")
    for width, name in ((60, "jit_step"), (80, "jit_train_step"), (200, "jit_train_step")):
        # Narrow terminals lose columns first, then the ends of long names.
        narrow = render_text(JitLedgerTable(v, sort="code"), width=width)
        assert name in narrow and "JIT LEDGER" in narrow and "⚠ live executables +40" in narrow
    assert "No jit ledger from this process yet" in render_text(JitLedgerTable(None))


# -- the Jit screen in the app ---------------------------------------------------------------------

def hello(pid):
    return {"type": "hello", "t": T0, "protocol": 1, "pid": pid, "argv": ["train.py"], "started_t": T0,
            "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
            "interval_s": 1.0, "slow_interval_s": 1.0, "transfer_capture": {"available": True}, "nvml": {"available": False, "reason": "no driver"}}


def app_with_ledger(pid=4242):
    """The app on a pushed stream with a jit ledger, and the store it folds into."""
    src = PushSource()
    app = make_app(src, refresh_s=0.05)
    return src, app


def feed(src, app, pid=4242):
    store = app.model.ledgers if MODEL_FOLDS else LedgerStore()
    src.push(pid, hello(pid), update=False)
    for rec in samples(fake_fields(), pid):
        src.push(pid, rec, update=False)
        if not MODEL_FOLDS:
            store.feed_sample(pid, from_dict(rec))
    src.on_update()
    return store


async def open_jit(pilot, app, src, store, pid=4242):
    await pilot.press("J")
    await pilot.pause(0.2)
    assert isinstance(app.screen, JitScreen)
    return app.screen


async def test_jit_screen_keys(utc):
    src, app = app_with_ledger()
    async with app.run_test(size=(120, 40)) as pilot:
        store = feed(src, app)
        screen = await open_jit(pilot, app, src, store)
        assert ("jit_ledger" in [c[1] for c in src.commands])  # opening asks for the whole table
        text = render_text(screen._renderable())
        assert "sorted by temp bytes  esc/q/j back · s sort · r refresh" in text
        await pilot.press("s")
        assert screen.sort == "total" and "sorted by total bytes" in render_text(screen._renderable())
        await pilot.press("s", "s", "s")
        assert screen.sort == "temp"
        asked = len(src.commands)
        await pilot.press("r")
        assert len(src.commands) == asked + 1 and src.commands[-1][1] == "jit_ledger"
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, JitScreen)
        await open_jit(pilot, app, src, store)
        await pilot.press("q")  # closes the screen, not the app
        await pilot.pause(0.1)
        assert not isinstance(app.screen, JitScreen) and app.is_running


def test_jit_screen_snapshot(snap_compare, utc):
    src, app = app_with_ledger()
    holder = {}

    async def run_before(pilot):
        holder["store"] = feed(src, app)
        await open_jit(pilot, app, src, holder["store"])
        app.screen.redraw()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
