"""The PyTorch reference models: shapes, layer counts and the parameter counts in the docs."""

from __future__ import annotations

import pytest
import torch

from opprof.collectors import torch_models  # noqa: E402
from opprof.collectors.torch_models import INPUT_SIZE, build, layer_counts  # noqa: E402
from opprof.errors import OpprofError  # noqa: E402

# (conv, fc, batchnorm, params for 10 classes, params for 100 classes), computed by hand
EXPECTED = {
    "lenet5": (2, 3, 0, 62_006, 69_656),
    "alexnet": (5, 3, 0, 5_871_434, 5_963_684),
    "resnet18": (20, 1, 20, 11_173_962, 11_220_132),
    "resnet50": (53, 1, 53, 23_520_842, 23_705_252),
    "fcn": (0, 4, 0, 5_256_202, 5_348_452),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("classes", [10, 100])
def test_forward_shape(name: str, classes: int) -> None:
    torch.manual_seed(0)
    model = build(name, classes).eval()
    size = INPUT_SIZE[name]
    with torch.no_grad():
        out = model(torch.randn(2, 3, size, size))
    assert tuple(out.shape) == (2, classes)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_layer_counts(name: str) -> None:
    conv, fc, bn, p10, p100 = EXPECTED[name]
    assert layer_counts(build(name, 10)) == {"conv": conv, "fc": fc, "batchnorm": bn,
                                             "params": p10}
    assert layer_counts(build(name, 100))["params"] == p100


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_docstring_states_the_counts(name: str) -> None:
    conv, fc, bn, p10, p100 = EXPECTED[name]
    doc = torch_models.__doc__
    assert f"{p10:,} parameters (10 classes) / {p100:,} (100 classes)" in doc
    assert f"{conv} conv" in doc and f"{fc} fc" in doc and f"{bn} batchnorm" in doc


def test_input_sizes_and_names() -> None:
    assert INPUT_SIZE == {"lenet5": 32, "alexnet": 64, "resnet18": 32, "resnet50": 32,
                          "fcn": 32, "lstm": 32, "transformer": 32}
    assert layer_counts(build("LeNet-5", 10))["params"] == 62_006
    assert layer_counts(build("ResNet-18", 10))["conv"] == 20


def test_unknown_model() -> None:
    with pytest.raises(OpprofError, match="unknown model 'vgg16'"):
        build("vgg16", 10)


def test_conv_bias_only_without_batchnorm() -> None:
    for name in EXPECTED:
        convs = [m for m in build(name, 10).modules() if isinstance(m, torch.nn.Conv2d)]
        with_bn = EXPECTED[name][2] > 0
        assert all((m.bias is None) == with_bn for m in convs), name


# (embedding, recurrent, attention, fc, layernorm, params at vocabulary 64), computed by hand
SEQUENCE = {"lstm": (1, 2, 0, 1, 0, 243_776), "transformer": (2, 0, 2, 5, 4, 77_248)}


@pytest.mark.parametrize("name", sorted(SEQUENCE))
def test_language_models_give_next_token_logits_and_their_counts(name: str) -> None:
    embedding, recurrent, attention, fc, layernorm, params = SEQUENCE[name]
    torch.manual_seed(0)
    model = build(name, 64)
    tokens = torch.randint(0, 64, (2, INPUT_SIZE[name]))
    assert tuple(model(tokens).shape) == (2, INPUT_SIZE[name], 64)
    assert layer_counts(model) == {"conv": 0, "fc": fc, "batchnorm": 0, "params": params,
                                   "embedding": embedding, "recurrent": recurrent,
                                   "attention": attention, "layernorm": layernorm}
    assert f"{params:,} parameters (vocab 64)" in torch_models.__doc__


def test_transformer_is_causal() -> None:
    """A position's logits do not depend on later tokens (next-token prediction is honest)."""
    torch.manual_seed(0)
    model = build("transformer", 64).eval()
    tokens = torch.randint(0, 64, (1, 32))
    changed = tokens.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % 64
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :20], b[0, :20], atol=1e-5)
    assert not torch.allclose(a[0, 20:], b[0, 20:])
