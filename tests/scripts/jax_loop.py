"""A JAX training loop as users write it: an MLP in plain JAX, optax.adam, one jax.jit step
(forward, backward and update), the batch drawn in numpy. `opprof run` counts a step per call
of the jitted function that computes the gradient."""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()


def init(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
                       "b": jnp.zeros(fan_out)})
    return params


def predict(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    logits = predict(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


optimizer = optax.adam(1e-3)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


params = init(jax.random.PRNGKey(0), [784, 256, 256, 10])
opt_state = optimizer.init(params)
rng = np.random.default_rng(0)
for step in range(args.steps):
    x = rng.normal(size=(args.batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    params, opt_state, loss = train_step(params, opt_state, x, y)
    if step % 5 == 0:
        print(f"step {step}: loss {float(loss):.4f}")
