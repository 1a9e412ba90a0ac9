"""A user's Keras 3 script with XLA: a small CNN compiled with ``jit_compile=True`` and trained
with model.fit on a tf.data pipeline (on a GPU Keras does this by itself: jit_compile="auto")."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()


class FailAt(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == args.fail_at:
            raise RuntimeError(f"tf_keras_xla_fit.py: failing at step {batch} as asked")


rng = np.random.default_rng(0)
x = rng.standard_normal((args.batch_size * 8, 32, 32, 3)).astype("float32")
y = rng.integers(0, 10, args.batch_size * 8)
data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256)
        .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
model = tf.keras.Sequential([
    tf.keras.Input((32, 32, 3)),
    tf.keras.layers.Conv2D(16, 3, padding="same"), tf.keras.layers.BatchNormalization(),
    tf.keras.layers.ReLU(), tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Conv2D(32, 3, padding="same"), tf.keras.layers.BatchNormalization(),
    tf.keras.layers.ReLU(), tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(), tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True)
model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=[FailAt()], verbose=0)
print(f"trained {args.steps} steps")
