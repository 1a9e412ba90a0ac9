"""Every framework builds the same four networks: the same conv / fc / batchnorm layer counts
as the PyTorch reference and parameter counts within 1%.

To add a framework, write a ``layer_counts``-style counter below and register it in COUNTERS
with the module it needs; frameworks that are not installed are skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.procs import needs

MODELS = ("lenet5", "alexnet", "resnet18", "resnet50", "fcn")
LAYERS = ("conv", "fc", "batchnorm")


def _torch(model: str, classes: int) -> dict[str, int]:
    from opprof.collectors import torch_models

    return torch_models.layer_counts(torch_models.build(model, classes))


def _mxnet(model: str, classes: int) -> dict[str, int]:
    from opprof.collectors import mxnet_models

    return mxnet_models.layer_counts(mxnet_models.build(model, classes))


def _tf(model: str, classes: int) -> dict[str, int]:
    from opprof.collectors import tf_models

    return tf_models.layer_counts(tf_models.build(model, classes))


#: framework → (the module it needs, counter(model, classes) -> {conv, fc, batchnorm, params}).
COUNTERS: dict[str, tuple[str, Callable[[str, int], dict[str, int]]]] = {
    "torch": ("torch", _torch),
    "mxnet": ("mxnet", _mxnet),
    "tf": ("tensorflow", _tf),
}
REFERENCE = "torch"
OTHERS = [fw for fw in COUNTERS if fw != REFERENCE]


def _need(fw: str) -> None:
    needs(COUNTERS[fw][0])


@pytest.mark.parametrize("classes", [10, 100])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("fw", OTHERS)
def test_same_layers_and_parameters_as_torch(fw: str, model: str, classes: int) -> None:
    _need(REFERENCE)
    _need(fw)
    ref = COUNTERS[REFERENCE][1](model, classes)
    got = COUNTERS[fw][1](model, classes)
    for layer in LAYERS:
        assert got[layer] == ref[layer], f"{fw} {model}: {layer} {got[layer]} vs {ref[layer]}"
    assert got["params"] == pytest.approx(ref["params"], rel=0.01), (
        f"{fw} {model}: {got['params']:,} parameters vs torch's {ref['params']:,}")


@pytest.mark.parametrize("model", MODELS)
def test_mxnet_networks_run_and_give_one_score_per_class(model: str) -> None:
    _need("mxnet")
    from opprof.collectors import mxnet_models

    mx = mxnet_models.mx
    net = mxnet_models.build(model, 100)
    net.initialize(mxnet_models.initializer())
    size = mxnet_models.INPUT_SIZE[model]
    out = net(mx.nd.ones((2, 3, size, size)))
    assert out.shape == (2, 100)


def test_mxnet_parameter_counts_are_exactly_torchs() -> None:
    _need("mxnet")
    _need("torch")
    for model in MODELS:
        assert _mxnet(model, 10) == _torch(model, 10)


#: The language models (vocabulary 64): every layer kind and the parameters exactly torch's.
SEQUENCE_MODELS = ("lstm", "transformer")


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
@pytest.mark.parametrize("fw", OTHERS)
def test_language_models_match_torch_exactly(fw: str, model: str) -> None:
    _need(REFERENCE)
    _need(fw)
    ref = COUNTERS[REFERENCE][1](model, 64)
    assert ref["recurrent"] + ref["attention"] > 0
    assert COUNTERS[fw][1](model, 64) == ref


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_mxnet_language_models_give_next_token_logits(model: str) -> None:
    _need("mxnet")
    from opprof.collectors import mxnet_models

    mx = mxnet_models.mx
    net = mxnet_models.build(model, 64)
    net.initialize(mxnet_models.initializer())
    net.hybridize()
    assert net(mx.nd.ones((2, mxnet_models.INPUT_SIZE[model]))).shape == (2, 32, 64)
