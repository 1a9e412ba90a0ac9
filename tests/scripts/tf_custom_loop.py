"""A user's TensorFlow custom training loop: a Keras LSTM classifier, tf.GradientTape,
optimizer.apply_gradients, batches from tf.data."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()

rng = np.random.default_rng(0)
seqs = rng.standard_normal((args.batch_size * 8, 20, 16)).astype("float32")
labels = rng.integers(0, 5, args.batch_size * 8)
data = (tf.data.Dataset.from_tensor_slices((seqs, labels)).shuffle(256)
        .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
model = tf.keras.Sequential([
    tf.keras.Input((20, 16)), tf.keras.layers.LSTM(64), tf.keras.layers.Dense(5),
])
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.Adam(1e-3)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


for step, (x, y) in enumerate(data.take(args.steps)):
    if step == args.fail_at:
        raise RuntimeError(f"tf_custom_loop.py: failing at step {step} as asked")
    loss = train_step(x, y)
print(f"trained {args.steps} steps, last loss {float(loss):.4f}")
