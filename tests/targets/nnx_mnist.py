"""The Flax NNX MNIST tutorial's training loop (flax.readthedocs.io, "MNIST
tutorial"): a small CNN, ``nnx.Optimizer`` with optax's AdamW,
``nnx.MultiMetric``, ``@nnx.jit`` train and eval steps. The data is made
here (random 28x28 images and labels, the tutorial's shapes and batch size):
no download.

argv: [steps] [leak_bytes_per_step] [pause_s]. With leak_bytes_per_step > 0,
each step's call also returns an array of that many bytes, which the loop
keeps (the line marked LEAK: a slow leak of known rate, on the very line
that allocates each step's new model and optimizer state). pause_s: a sleep
after each step. Prints ``steps=N`` at the end.
"""

import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
leak_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 0
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        x = self.linear2(x)
        return x


model = CNN(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(0.005, 0.9), wrt=nnx.Param)
metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


@nnx.jit
def leaky_train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """train_step, and an array of leak_bytes for the caller to keep."""
    train_step(model, optimizer, metrics, batch)
    return jnp.zeros(leak_bytes // 4, jnp.float32) + optimizer.step[...]


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])


rng = np.random.default_rng(0)
batch_size = 32
kept = []
history = {"train_loss": [], "train_accuracy": []}
for step in range(steps):
    batch = {"image": rng.random((batch_size, 28, 28, 1), dtype=np.float32),
             "label": rng.integers(0, 10, batch_size).astype(np.int32)}
    model.train()
    if leak_bytes:
        kept.append(leaky_train_step(model, optimizer, metrics, batch))  # LEAK
    else:
        train_step(model, optimizer, metrics, batch)
    if step > 0 and step % 50 == 0:
        for metric, value in metrics.compute().items():  # the tutorial's logging: a host read per metric
            history[f"train_{metric}"].append(float(value))
        metrics.reset()
        model.eval()
        eval_step(model, metrics, batch)
        metrics.reset()
    if pause:
        time.sleep(pause)
jax.block_until_ready(nnx.state(model))
print(f"steps={steps}")
