"""Named pytrees (jaxtop/agent/labels.py) and host syncs (probes/host_sync.py), in this process on the CPU backend."""

from __future__ import annotations

import gc
import sys

import pytest


from test_holders import Clock, FakeAgent, assert_decoded_whole


# -- labels ------------------------------------------------------------------------------------------------

@pytest.fixture
def labels_installed():
    from jaxtop.agent import labels

    agent = FakeAgent()
    registry = labels.install(agent)
    registry.min_interval_s = 0.0
    yield labels, agent
    labels.uninstall()


def test_label_bytes_match_the_tree_and_dropping_frees_it(jax_cpu, labels_installed):
    import jax
    import jax.numpy as jnp
    import numpy as np

    labels, agent = labels_installed
    before = {id(a) for a in jax.live_arrays()}
    params = {"w": jnp.ones((64, 32)), "b": jnp.zeros((32,), jnp.bfloat16), "layers": [jnp.ones((8, 8)) for _ in range(3)],
              "step": 3, "host": np.ones(5)}
    assert labels.label("params", params) is params
    expected = sum(x.nbytes for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array))
    tree = agent.fields["labels"]()["trees"][0]
    assert tree["name"] == "params" and tree["bytes"] == expected == 64 * 32 * 4 + 32 * 2 + 3 * 256
    assert (tree["arrays"], tree["alive"], tree["leaves"]) == (5, 5, 7)
    ids = {id(x) for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array)}
    assert ids <= {id(a) for a in jax.live_arrays()}
    del params
    gc.collect()
    after = {id(a) for a in jax.live_arrays()}
    assert after <= before | (after - ids) and not (ids & after - before)  # the label kept none alive
    assert len([a for a in jax.live_arrays() if a.shape == (64, 32)]) == 0
    tree = agent.fields["labels"]()["trees"][0]
    assert (tree["bytes"], tree["alive"], tree["arrays"]) == (0, 0, 5)


def test_label_replaces_by_name_and_skips_deleted_and_traced_leaves(jax_cpu, labels_installed):
    import jax
    import jax.numpy as jnp

    labels, agent = labels_installed
    a, b = jnp.ones(100), jnp.ones(200)
    labels.label("state", [a])
    labels.label("state", [a, b])
    b.delete()  # e.g. donated to a jitted step
    assert [(t["name"], t["bytes"], t["alive"]) for t in labels.read()] == [("state", 400, 1)]
    seen = []

    @jax.jit
    def f(x):
        labels.label("inside", {"x": x})
        seen.append(1)
        return x + 1

    f(a)
    inside = next(t for t in labels.read() if t["name"] == "inside")
    assert seen and inside["arrays"] == 0 and inside["leaves"] == 1  # a tracer is no device array


def test_label_falls_back_to_ids_for_leaves_without_weak_references(jax_cpu, labels_installed, monkeypatch):
    import jax.numpy as jnp

    import jaxtop.agent.labels as mod

    def no_weakref(obj):
        raise TypeError(f"cannot create weak reference to {type(obj).__name__!r} object")

    labels, agent = labels_installed
    monkeypatch.setattr(mod, "_weak", no_weakref)
    tree = [jnp.ones(10), jnp.ones((2, 3), jnp.int8)]
    labels.label("t", tree)
    assert [(t["bytes"], t["alive"]) for t in labels.read()] == [(46, 2)]
    del tree
    gc.collect()
    assert [(t["bytes"], t["alive"]) for t in labels.read()] == [(0, 0)]  # ids only: nothing kept alive


def test_label_without_an_agent_does_nothing(jax_cpu, monkeypatch):
    import jax
    import jax.numpy as jnp

    from jaxtop.agent import labels

    labels.uninstall()
    monkeypatch.setattr(jax.tree_util, "tree_leaves", lambda *a, **k: pytest.fail("walked the tree"))
    tree = {"w": jnp.ones(3)}
    assert labels.label("params", tree) is tree
    assert labels.read() == []
    stopped = FakeAgent()
    labels.install(stopped)
    stopped.running = False  # the agent stopped: labels stop recording
    assert labels.label("params", tree) is tree and labels.read() == []
    labels.uninstall()


def test_labels_field_sends_changes_and_a_heartbeat(jax_cpu, labels_installed, monkeypatch):
    import jax.numpy as jnp

    import jaxtop.agent.labels as mod

    labels, agent = labels_installed
    now = Clock(1000.0)
    monkeypatch.setattr(mod.time, "monotonic", now)
    assert agent.fields["labels"]() is None  # nothing labelled: no field
    now.t += 1
    x = jnp.ones(10)
    labels.label("x", x)
    assert agent.fields["labels"]()["trees"][0]["bytes"] == 40
    now.t += 1
    assert agent.fields["labels"]() is None  # unchanged
    now.t += 10
    assert agent.fields["labels"]() is not None  # heartbeat for late clients


def test_the_labels_field_decodes_whole_into_its_types(jax_cpu, labels_installed):
    import jax.numpy as jnp

    from jaxtop.wire.records import Labels, from_dict

    class Model:  # an object with state of its own: followed as it changes
        def __init__(self):
            self.w = jnp.ones(8)

    labels, agent = labels_installed
    params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    model = Model()
    labels.label("params", params)
    labels.label("model", model)
    raw = agent.fields["labels"]()
    assert {t["name"] for t in raw["trees"] if t.get("followed")} == {"model"}
    rec = from_dict({"type": "sample", "t": raw["t"], "labels": raw})
    assert rec.odd == () and isinstance(rec.labels, Labels)
    assert_decoded_whole(raw, rec.labels, "labels")
    assert rec.labels.trees[0].name == "params" and rec.labels.trees[0].bytes == 80


# -- host syncs (in this process) ---------------------------------------------------------------------------

@pytest.fixture
def host_sync(jax_cpu):
    from jaxtop.probes.host_sync import HostSyncProbe, array_class_state

    before = array_class_state()
    probe = HostSyncProbe(numpy_hooks=True)  # numpy's wrappers too (off by default: they cost every numpy call)
    probe.start()
    yield probe
    probe.stop()
    after = array_class_state()
    for group in before:
        assert before[group].keys() == after[group].keys(), group
        for name, value in before[group].items():
            assert after[group][name] is value, (group, name)


def outcome(fn):
    try:
        return ("returned", fn())
    except Exception as exc:
        return ("raised", type(exc), str(exc))


def here_counts(probe):
    return {k[1]: v for k, v in probe.counts().items() if k[0] == __file__}


def test_host_sync_counts_each_read_once_per_line_and_kind(host_sync):
    import jax
    import jax.numpy as jnp
    import numpy as np

    def fresh(k=1):
        return jnp.arange(4.0) * k + 1

    base = sys._getframe().f_lineno
    a = float(jnp.sum(fresh()))  # +2
    b = jnp.sum(fresh()).item()  # +3
    c = np.asarray(fresh())  # +4
    d = str(fresh())  # +5
    e = [bool(jnp.all(fresh(k) > 0)) for k in range(3)]  # +6
    f = jax.device_get(fresh())  # +7
    g = np.array(fresh())  # +8
    h = f"{jnp.sum(fresh()):.1f}"  # +9
    assert (a, b, c.tolist(), d, e, f.tolist(), g.tolist(), h) == (
        10.0, 10.0, [1, 2, 3, 4], "[1. 2. 3. 4.]", [True] * 3, [1, 2, 3, 4], [1, 2, 3, 4], "10.0")
    counts = here_counts(host_sync)
    assert counts == {
        base + 1: {"float": 1}, base + 2: {"item": 1}, base + 3: {"asarray": 1}, base + 4: {"str": 1},
        base + 5: {"bool": 3}, base + 6: {"device_get": 1}, base + 7: {"array": 1}, base + 8: {"format": 1},
    }
    name = sys._getframe().f_code.co_name
    assert {k[2] for k in host_sync.counts() if k[1] == base + 5} == {f"{name}.<listcomp>"}
    rec = host_sync.snapshot()
    assert rec["available"] and rec["count"] == 10 and rec["by_kind"]["bool"] == 3


def test_host_sync_leaves_results_and_exceptions_alone(host_sync):
    import jax.numpy as jnp
    import numpy as np

    x = jnp.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError, match="Only scalar arrays"):
        float(x)
    x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        str(x)
    with pytest.raises(TypeError):
        np.asarray()
    with pytest.raises(ValueError):
        jnp.ones(2).item()
    host_sync.stop()
    plain = [outcome(lambda: jnp.ones(2).item(foo=1)), outcome(lambda: jnp.arange(3).item(5))]
    host_sync.start()
    assert [outcome(lambda: jnp.ones(2).item(foo=1)), outcome(lambda: jnp.arange(3).item(5))] == plain
    assert np.asarray([1, 2], dtype=np.int8).dtype == np.int8 and np.array(object=[3]).tolist() == [3]
    assert here_counts(host_sync) == {}  # failed reads are not counted


def test_host_sync_hooks_are_cheap_off_the_read_path(host_sync):
    import numpy as np

    host = np.ones(3)
    assert np.asarray(host) is host  # not a jax Array: passed straight through
    assert np.asarray.__wrapped__ is host_sync._orig_np["asarray"] and np.asarray.__name__ == "asarray"


def test_host_sync_stop_restores_and_a_second_probe_stays_off(jax_cpu):
    import jax
    import numpy as np

    from jaxtop.probes.host_sync import HostSyncProbe, array_class_state

    before = array_class_state()
    first, second = HostSyncProbe(), HostSyncProbe()
    first.start()
    second.start()
    assert not second.started and "another" in second.reason
    assert second.snapshot()["available"] is False
    first.stop()
    first.stop()  # twice is fine
    after = array_class_state()
    assert all(after[g][k] is v for g in before for k, v in before[g].items())
    assert jax.Array.__dict__.keys() == before["Array"].keys() and np.asarray is before["numpy"]["asarray"]


def test_the_host_syncs_field_decodes_whole_into_its_types(host_sync):
    import jax.numpy as jnp

    from jaxtop.probes.host_sync import HostSyncProbe
    from jaxtop.wire.records import HostSyncs, from_dict

    float(jnp.sum(jnp.ones(3)))
    jnp.ones(2).tolist()
    raw = host_sync.snapshot()
    assert raw["count"] == 2 and len(raw["sites"]) == 2
    off = HostSyncProbe()  # a second probe stays off and says why
    off.start()
    stopped = off.snapshot()
    assert stopped["available"] is False and stopped["reason"]
    for part in (raw, stopped):
        rec = from_dict({"type": "sample", "t": part["t"], "host_syncs": part})
        assert rec.odd == () and isinstance(rec.host_syncs, HostSyncs)
        assert_decoded_whole(part, rec.host_syncs, "host_syncs")
