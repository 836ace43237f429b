"""Which arguments a jitted function's outputs could be written into
(``jaxtop.probes.jit_donatable``): the names a donation fix gives to
``donate_argnames``, read from the compiled module's entry parameters
(jax names each after its argument) and its root's shape.

Pure (the parsing, the matching), then real executables of jax's and of
Flax NNX's, then the advisor's fix text.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxtop.probes.jit_donatable import MAX_NAMES, _root_shape, donatable, donatable_args, parse_parameter, shapes_in


def test_a_parameter_is_its_number_shape_and_argument_name():
    text = '%params_0__0_.1 = f32[4,3]{1,0} parameter(0), metadata={op_name="params[0][0]"}'
    assert parse_parameter(text) == (0, ("f32", "4,3"), "params[0][0]")
    assert parse_parameter('%b.1 = s32[] parameter(7), metadata={op_name="batch"}') == (7, ("s32", ""), "batch")
    # TPU layouts carry tiles; a parameter without a name or of a tuple is not read.
    assert parse_parameter('%p = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(1), metadata={op_name="w"}') == (
        1, ("bf16", "8,128"), "w")
    assert parse_parameter("%p = f32[2]{0} parameter(0)") is None
    assert parse_parameter('%p = (f32[2], s32[]) parameter(0), metadata={op_name="t"}') is None


def test_the_roots_shape_is_read_whole_and_alone():
    root = "%tuple.1 = (f32[4,3]{1,0}, f32[3]{0}, (s32[], pred[2])) tuple(%a, %b, %c), metadata={op_name=\"x[1]\"}"
    assert _root_shape(root) == "(f32[4,3]{1,0}, f32[3]{0}, (s32[], pred[2]))"
    assert shapes_in(_root_shape(root)) == [("f32", "4,3"), ("f32", "3"), ("s32", ""), ("pred", "2")]
    assert shapes_in(_root_shape("%fusion = f32[2]{0} fusion(%p), kind=kLoop")) == [("f32", "2")]


def test_an_argument_is_donatable_when_every_leaf_finds_an_output_of_its_dtype_and_shape():
    params = [(0, ("f32", "4,3"), "params[0]"), (1, ("f32", "3"), "params[1]"),
              (2, ("f32", "4,3"), "grads[0]"), (3, ("f32", "5,4"), "batch[0]"), (4, ("s32", ""), "step")]
    # Outputs: the new parameters and the step: the gradients find no second f32[4,3].
    assert donatable(params, [("f32", "4,3"), ("f32", "3"), ("s32", "")]) == ["params", "step"]
    # Each output leaf is taken once, arguments in parameter order.
    assert donatable(params, [("f32", "4,3"), ("f32", "4,3"), ("f32", "3")]) == ["params", "grads"]
    assert donatable(params, [("f32", "2")]) == []
    many = [(i, ("f32", "1"), f"a{i}") for i in range(20)]
    assert len(donatable(many, [("f32", "1")] * 20)) == MAX_NAMES


def _executable(name: str):
    for e in jax.devices()[0].client.live_executables():
        if e.hlo_modules()[0].name == name:
            return e
    raise AssertionError(f"no live executable {name}")


def test_a_training_steps_parameters_are_named_not_its_batch():
    def train_step(params, opt_state, batch):
        x, y = batch
        loss = jnp.mean((x @ params["w"] + params["b"] - y) ** 2)
        return {"w": params["w"] - 0.1 * loss, "b": params["b"] * 0.9}, opt_state + 1, loss

    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    step = jax.jit(train_step)
    out = step(params, jnp.zeros((), jnp.int32), (jnp.ones((5, 4)), jnp.ones((5, 3))))
    assert donatable_args(_executable("jit_train_step")) == (["params", "opt_state"], False)
    del out, step


def test_flax_nnx_steps_name_the_module_and_the_optimizer():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            return self.linear(x)

    model = Model(nnx.Rngs(0))
    try:
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    except TypeError:  # flax before 0.11 has no wrt
        optimizer = nnx.Optimizer(model, optax.adam(1e-3))

    @nnx.jit
    def nnx_train_step(model, optimizer, batch):
        def loss_fn(model):
            return (model(batch) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        try:
            optimizer.update(model, grads)
        except TypeError:
            optimizer.update(grads)
        return loss

    nnx_train_step(model, optimizer, jnp.ones((2, 4)))
    assert donatable_args(_executable("jit_nnx_train_step")) == (["model", "optimizer"], True)


def test_the_advisors_fix_pastes_the_names():
    from jaxtop.advice.detectors.calls import _donation_fix
    from jaxtop.dashboard.ledger import JitFunction

    fn = JitFunction(name="jit_update", donatable=("params",))
    fix = _donation_fix(fn, "update", " (defined at mnist.py:124)")
    assert fix.startswith('jax.jit(update, donate_argnames=("params",)) (defined at mnist.py:124)')
    nnx_fn = JitFunction(name="jit_train_step", donatable=("model", "optimizer"), donatable_nnx=True)
    assert _donation_fix(nnx_fn, "train_step", "").startswith(
        'nnx.jit(train_step, donate_argnames=("model", "optimizer")) (not jax.jit')
    # Where the agent read no names (an older agent, outputs aliased already): in words.
    assert "donate every argument whose new value" in _donation_fix(JitFunction(name="jit_f"), "f", "")
