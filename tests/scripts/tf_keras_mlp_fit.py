"""A user's small Keras 3 classifier: an MLP with a softmax output layer (Keras trains on its
logits), RMSprop, ``fit`` on NumPy arrays; ``--xla`` compiles it (``jit_compile=True``,
``steps_per_execution=2``). A step is so short that opprof's own per-step callback would show
if it were counted."""

import argparse

import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--xla", action="store_true")
args = parser.parse_args()

rng = np.random.default_rng(0)
x = rng.random((args.batch_size * args.steps, 20)).astype("float32")
y = rng.integers(0, 5, args.batch_size * args.steps)
model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dropout(0.1), keras.layers.Dense(5, activation="softmax")])
model.compile(optimizer=keras.optimizers.RMSprop(1e-3), loss="sparse_categorical_crossentropy",
              jit_compile=args.xla, steps_per_execution=2 if args.xla else 1)
model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0)
print(f"trained {args.steps} steps")
