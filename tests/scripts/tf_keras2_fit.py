"""A user's Keras 2 script (``tf_keras``, what ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``): a
small CNN trained with model.fit on a tf.data pipeline; ``--legacy-optimizer`` takes the
optimizer from ``tf_keras.optimizers.legacy``."""

import argparse

import numpy as np
import tensorflow as tf
import tf_keras as keras

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--legacy-optimizer", action="store_true")
args = parser.parse_args()


class FailAt(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == args.fail_at:
            raise RuntimeError(f"tf_keras2_fit.py: failing at step {batch} as asked")


rng = np.random.default_rng(0)
x = rng.standard_normal((args.batch_size * 8, 32, 32, 3)).astype("float32")
y = rng.integers(0, 10, args.batch_size * 8)
data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256)
        .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
model = keras.Sequential([
    keras.Input((32, 32, 3)),
    keras.layers.Conv2D(16, 3, padding="same"), keras.layers.BatchNormalization(),
    keras.layers.ReLU(), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, padding="same"), keras.layers.BatchNormalization(),
    keras.layers.ReLU(), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
optimizers = keras.optimizers.legacy if args.legacy_optimizer else keras.optimizers
model.compile(optimizer=optimizers.SGD(0.01, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=[FailAt()], verbose=0)
print(f"trained {args.steps} steps with Keras {keras.__version__}")
