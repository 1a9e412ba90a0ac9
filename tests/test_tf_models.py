"""The Keras models run: one score per class for a batch of the right input size, and their
parameter counts are exactly the PyTorch reference's (tests/test_model_parity.py checks layer
counts and the 1% bound for every framework)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.procs import needs

needs("tensorflow")

EXACT = {"lenet5": 62006, "alexnet": 5871434, "resnet18": 11173962, "resnet50": 23520842,
         "fcn": 5256202}


@pytest.mark.parametrize("model", ["lenet5", "alexnet", "resnet18", "fcn"])
def test_keras_networks_give_one_score_per_class(model: str) -> None:
    from opprof.collectors import tf_models

    net = tf_models.build(model, 100)
    size = tf_models.INPUT_SIZE[model]
    out = net(np.ones((2, size, size, 3), np.float32), training=False)
    assert tuple(out.shape) == (2, 100)


@pytest.mark.parametrize("model", list(EXACT))
def test_trainable_parameters_are_exactly_torchs(model: str) -> None:
    from opprof.collectors import tf_models

    assert tf_models.layer_counts(tf_models.build(model, 10))["params"] == EXACT[model]
