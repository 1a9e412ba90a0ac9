"""A JAX loop that profiles itself, as the JAX docs show: jax.profiler.trace(DIR) around
steps marked with jax.profiler.StepTraceAnnotation; a small CNN (lax.conv, max pool) with
optax.sgd. `--host-tracer-level 2` records XLA:CPU's operations (the default, 1, does not);
`opprof report DIR` reads the folder as the profiler writes it. Under `opprof run`, the
annotations mark the steps and the script's own trace is left to opprof's."""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--logdir", default="jax-profile")
parser.add_argument("--host-tracer-level", type=int, default=0, help="0: JAX's default")
args = parser.parse_args()


def init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"conv": jax.random.normal(k1, (3, 3, 3, 16)) * 0.1,
            "conv_b": jnp.zeros(16),
            "dense": jax.random.normal(k2, (16 * 16 * 16, 10)) * 0.01,
            "dense_b": jnp.zeros(10), "unused": jax.random.normal(k3, (1,))}


def model(params, x):
    y = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + params["conv_b"])
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return y.reshape(y.shape[0], -1) @ params["dense"] + params["dense_b"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(params, x), y).mean()


optimizer = optax.sgd(0.01, momentum=0.9)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


params = init(jax.random.PRNGKey(0))
opt_state = optimizer.init(params)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(16, 32, 32, 3)), jnp.float32)
y = jnp.asarray(rng.integers(0, 10, 16))
for _ in range(2):  # compile outside the profile
    params, opt_state, loss = train_step(params, opt_state, x, y)
options = None
if args.host_tracer_level:
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = args.host_tracer_level
with jax.profiler.trace(args.logdir, profiler_options=options):
    for step in range(args.steps):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            params, opt_state, loss = train_step(params, opt_state, x, y)
            loss.block_until_ready()
print(f"loss {float(loss):.4f}")
