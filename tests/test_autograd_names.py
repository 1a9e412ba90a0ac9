"""Every autograd node the built-in torch models produce maps, row by row, to the backward
twin of the canonical op of its forward operator (normalizers/maps/kineto.csv)."""

from __future__ import annotations

import pytest

from opprof.taxonomy import mapping_table

#: autograd node → canonical op, for every node the built-in models' training step runs
#: (lenet5, alexnet, resnet18, resnet50 with nn.CrossEntropyLoss; torch 2.13 CPU), and the
#: pooling nodes other CIFAR models use.
EXPECTED = {
    "ConvolutionBackward0": "convolution_backward",        # aten::conv2d → convolution
    "NativeBatchNormBackward0": "batch_norm_backward",     # aten::batch_norm → batch_norm
    "AddmmBackward0": "fully_connected_backward",          # aten::linear → fully_connected
    "TBackward0": "memory_backward",                       # aten::t (linear's weight) → memory
    "ReluBackward0": "activation_backward",                # aten::relu_ → activation
    "MaxPool2DWithIndicesBackward0": "pooling_backward",   # aten::max_pool2d → pooling
    "MeanBackward1": "pooling_backward",                   # AdaptiveAvgPool2d(1) → aten::mean
    "AvgPool2DBackward0": "pooling_backward",              # aten::avg_pool2d → pooling
    "AdaptiveAvgPool2DBackward0": "pooling_backward",      # aten::adaptive_avg_pool2d
    "ViewBackward0": "memory_backward",                    # torch.flatten → aten::view
    "LogSoftmaxBackward0": "loss_backward",                # cross-entropy's log_softmax → loss
    "NllLossBackward0": "loss_backward",                   # cross-entropy's nll_loss → loss
    "AddBackward0": "elementwise_backward",                # the residual add → elementwise
    "MulBackward0": "elementwise_backward",                # aten::mul (CPU dropout's mask)
    "torch::autograd::AccumulateGrad": "memory_backward",  # a parameter's gradient stored
}

PREFIX = "autograd::engine::evaluate_function: "


@pytest.mark.parametrize(("node", "op"), sorted(EXPECTED.items()))
def test_autograd_node_maps_to_its_backward_twin(node: str, op: str) -> None:
    table = mapping_table("kineto")
    got = table.classify([PREFIX + node]).iloc[0]
    assert (got["op"], got["phase"]) == (op, "backward")
    if not node.startswith("torch::"):  # the bare node name, as older traces give it
        assert table.classify([node]).iloc[0]["op"] == op


def _autograd_nodes(model: str) -> set[str]:
    """The autograd nodes of one training step of a built-in model (its graph, walked)."""
    import torch
    from torch import nn

    from opprof.collectors.torch_models import build

    torch.manual_seed(0)
    net = build(model, 10)
    side = 64 if model == "alexnet" else 32
    loss = nn.CrossEntropyLoss()(net(torch.randn(2, 3, side, side)), torch.tensor([1, 2]))
    seen, stack, names = set(), [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(fn.name())
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return names


@pytest.mark.parametrize("model", ["lenet5", "alexnet", "resnet18", "resnet50"])
def test_every_node_of_the_built_in_models_is_listed(model: str) -> None:
    missing = _autograd_nodes(model) - set(EXPECTED)
    assert not missing, f"{model}: add these nodes and their expected op: {sorted(missing)}"
