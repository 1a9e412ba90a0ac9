"""Flax (linen) and optax as the Flax examples write them: a CNN Module with BatchNorm and
Dropout, a TrainState, one jax.jit train step applying the gradient, its batch statistics
as a mutable collection. `opprof run` counts a step per call of the jitted step."""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(16, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(64)(x)
        x = nn.relu(x)
        x = nn.Dropout(0.2, deterministic=not train)(x)
        return nn.Dense(10)(x)


class TrainState(train_state.TrainState):
    batch_stats: dict


model = CNN()
rng = jax.random.PRNGKey(0)
variables = model.init(rng, jnp.ones((1, 32, 32, 3)), train=False)
state = TrainState.create(apply_fn=model.apply, params=variables["params"],
                          batch_stats=variables["batch_stats"], tx=optax.adamw(1e-3))


@jax.jit
def train_step(state, x, y, dropout_rng):
    def loss_fn(params):
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, x, train=True,
            rngs={"dropout": dropout_rng}, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    return state, loss


data = np.random.default_rng(0)
for step in range(args.steps):
    x = data.normal(size=(args.batch, 32, 32, 3)).astype(np.float32)
    y = data.integers(0, 10, args.batch)
    state, loss = train_step(state, x, y, jax.random.fold_in(rng, step))
    if step % 5 == 0:
        print(f"step {step}: loss {float(loss):.4f}")
