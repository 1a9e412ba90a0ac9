"""A user's Keras 3 script on the torch backend: a small CNN trained with model.fit."""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()

assert keras.backend.backend() == "torch", keras.backend.backend()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((args.batch_size * args.steps, 16, 16, 3)).astype("float32")
y = rng.integers(0, 10, args.batch_size * args.steps)
model = keras.Sequential([
    keras.Input((16, 16, 3)),
    keras.layers.Conv2D(8, 3, padding="same"), keras.layers.BatchNormalization(),
    keras.layers.ReLU(), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10),
])
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=args.batch_size, epochs=1, steps_per_epoch=args.steps, verbose=0)
print(f"trained {args.steps} steps")
