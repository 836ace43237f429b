"""A miniGPT in Flax NNX, written from the patterns of Flax's miniGPT
tutorial: token and position embeddings, transformer blocks of
``nnx.MultiHeadAttention`` with a causal mask, ``nnx.LayerNorm``,
``nnx.Dropout`` and an MLP, ``nnx.Optimizer`` with optax's AdamW and an
``@nnx.jit`` train step. Small sizes (CPU); the tokens are made here.

argv: [steps]. Prints ``steps=N`` at the end.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
vocab, maxlen, embed, heads, ff, layers, batch = 512, 32, 64, 4, 128, 2, 8


class TransformerBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.attention = nnx.MultiHeadAttention(num_heads=heads, in_features=embed, qkv_features=embed,
                                                decode=False, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.1, rngs=rngs)
        self.norm1 = nnx.LayerNorm(embed, epsilon=1e-6, rngs=rngs)
        self.linear1 = nnx.Linear(embed, ff, rngs=rngs)
        self.linear2 = nnx.Linear(ff, embed, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.1, rngs=rngs)
        self.norm2 = nnx.LayerNorm(embed, epsilon=1e-6, rngs=rngs)

    def __call__(self, x):
        mask = nnx.make_causal_mask(x[..., 0])
        h = self.norm1(x + self.dropout1(self.attention(x, mask=mask)))
        return self.norm2(h + self.dropout2(self.linear2(nnx.relu(self.linear1(h)))))


class MiniGPT(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.token_emb = nnx.Embed(vocab, embed, rngs=rngs)
        self.pos_emb = nnx.Embed(maxlen, embed, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(rngs) for _ in range(layers)])
        self.output = nnx.Linear(embed, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.token_emb(tokens) + self.pos_emb(jnp.arange(tokens.shape[1])[None, :])
        for block in self.blocks:
            x = block(x)
        return self.output(x)


model = MiniGPT(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)


def loss_fn(model, tokens, targets):
    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@nnx.jit
def train_step(model, optimizer, tokens, targets):
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, targets)
    optimizer.update(model, grads)
    return loss


rng = np.random.default_rng(0)
for step in range(steps):
    data = rng.integers(0, vocab, (batch, maxlen + 1)).astype(np.int32)
    loss = train_step(model, optimizer, data[:, :-1], data[:, 1:])
    if step % 20 == 0:
        float(loss)  # the tutorial prints the loss now and then
jax.block_until_ready(nnx.state(model))
print(f"steps={steps}")
