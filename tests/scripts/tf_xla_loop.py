"""A user's TensorFlow custom loop compiled with XLA: the training step is
``@tf.function(jit_compile=True)`` (forward, tf.GradientTape, apply_gradients), a small MLP on
tf.data batches."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

rng = np.random.default_rng(0)
x = rng.standard_normal((args.batch_size * 8, 28, 28, 1)).astype("float32")
y = rng.integers(0, 10, args.batch_size * 8)
data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256)
        .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(8, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(), tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dense(10),
])
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.Adam(1e-3)


@tf.function(jit_compile=True)
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


for step, (x, y) in enumerate(data.take(args.steps)):
    if step == args.fail_at:
        raise RuntimeError(f"tf_xla_loop.py: failing at step {step} as asked")
    loss = train_step(x, y)
print(f"trained {args.steps} steps, last loss {float(loss):.4f}")
