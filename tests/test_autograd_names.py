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


def _twin_cases() -> dict:
    """Forward calls whose output's autograd node is their own operator's (composites whose
    last node is an inner op's, such as a 3-D ``linear``'s ``ViewBackward0``, are left out)."""
    import torch
    import torch.nn.functional as F

    def x(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, requires_grad=True)

    mask = torch.tensor([True, False, True])
    return {
        "conv2d": lambda: F.conv2d(x(1, 3, 8, 8), x(4, 3, 3, 3)),
        "conv_transpose2d": lambda: F.conv_transpose2d(x(1, 3, 8, 8), x(3, 4, 3, 3)),
        "linear": lambda: F.linear(x(2, 4), x(3, 4), x(3)),
        "linear, no bias": lambda: F.linear(x(2, 4), x(3, 4)),
        "matmul": lambda: x(2, 3) @ x(3, 4),
        "bmm": lambda: torch.bmm(x(2, 3, 4), x(2, 4, 5)),
        "baddbmm": lambda: torch.baddbmm(x(2, 3, 5), x(2, 3, 4), x(2, 4, 5)),
        "batch_norm": lambda: F.batch_norm(x(4, 3), None, None, x(3), x(3), training=True),
        "layer_norm": lambda: F.layer_norm(x(2, 4), (4,)),
        "group_norm": lambda: F.group_norm(x(2, 4, 3), 2),
        "relu": lambda: F.relu(x(3)), "gelu": lambda: F.gelu(x(3)),
        "silu": lambda: F.silu(x(3)), "tanh": lambda: torch.tanh(x(3)),
        "sigmoid": lambda: torch.sigmoid(x(3)), "leaky_relu": lambda: F.leaky_relu(x(3)),
        "elu": lambda: F.elu(x(3)), "hardtanh": lambda: F.hardtanh(x(3)),
        "softplus": lambda: F.softplus(x(3)), "mish": lambda: F.mish(x(3)),
        "hardswish": lambda: F.hardswish(x(3)),
        "clamp_min": lambda: torch.clamp_min(x(3), 0.1),
        "clamp": lambda: torch.clamp(x(3), -0.5, 0.5),
        "max_pool2d": lambda: F.max_pool2d(x(1, 1, 4, 4), 2),
        "avg_pool2d": lambda: F.avg_pool2d(x(1, 1, 4, 4), 2),
        "adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(x(1, 1, 4, 4), 2),
        "adaptive_avg_pool2d to 1": lambda: F.adaptive_avg_pool2d(x(1, 1, 4, 4), 1),
        "adaptive_max_pool2d": lambda: F.adaptive_max_pool2d(x(1, 1, 4, 4), 1),
        "softmax": lambda: F.softmax(x(2, 3), 1),
        "log_softmax": lambda: F.log_softmax(x(2, 3), 1),
        "cross_entropy": lambda: F.cross_entropy(x(2, 3), torch.tensor([0, 1])),
        "mse_loss": lambda: F.mse_loss(x(3), torch.zeros(3)),
        "smooth_l1_loss": lambda: F.smooth_l1_loss(x(3), torch.zeros(3)),
        "binary_cross_entropy_with_logits":
            lambda: F.binary_cross_entropy_with_logits(x(3), torch.ones(3)),
        "binary_cross_entropy": lambda: F.binary_cross_entropy(
            torch.rand(3, requires_grad=True), torch.ones(3)),
        "embedding": lambda: F.embedding(torch.tensor([0, 1]), x(3, 4)),
        "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(
            x(1, 2, 4, 8), x(1, 2, 4, 8), x(1, 2, 4, 8)),
        "lstm": lambda: torch.nn.LSTM(4, 4)(x(3, 1, 4))[0],
        "add": lambda: x(3) + x(3), "mul": lambda: x(3) * x(3),
        "pow": lambda: x(3).pow(2), "exp": lambda: x(3).exp(),
        "sum": lambda: x(2, 3).sum(1), "mean of everything": lambda: x(2, 3).mean(),
        "max": lambda: x(2, 3).max(1)[0], "norm": lambda: x(3).norm(),
        "where": lambda: torch.where(mask, x(3), x(3)),
        "masked_fill": lambda: x(3).masked_fill(mask, 0.0),
        "cumsum": lambda: x(3).cumsum(0),
        "view": lambda: x(6).view(2, 3), "reshape": lambda: x(6).reshape(2, 3),
        "t": lambda: x(2, 3).t(), "permute": lambda: x(2, 3, 4).permute(2, 0, 1),
        "cat": lambda: torch.cat([x(2), x(2)]), "stack": lambda: torch.stack([x(2), x(2)]),
        "split": lambda: torch.split(x(4), 2)[0], "index": lambda: x(4)[torch.tensor([0, 2])],
        "slice": lambda: x(4)[1:3], "select": lambda: x(4, 2)[1],
        "expand": lambda: x(1, 3).expand(2, 3), "flatten": lambda: x(2, 3, 4).flatten(1),
        "to": lambda: x(3).double(), "clone": lambda: x(3).clone(),
        "constant pad": lambda: F.pad(x(1, 1, 3, 3), (1, 1, 1, 1)),
        "reflection pad": lambda: F.pad(x(1, 1, 3, 3), (1, 1, 1, 1), mode="reflect"),
        "replication pad": lambda: F.pad(x(1, 1, 3, 3), (1, 1, 1, 1), mode="replicate"),
    }


TWIN_CASES = sorted(_twin_cases())


@pytest.mark.parametrize("case", TWIN_CASES)
def test_backward_node_is_the_twin_of_its_forward_operator(case: str) -> None:
    """Row by row, on real torch: the forward call's outermost operator under the profiler
    and its output's autograd node map to an op and that op's backward twin."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = _twin_cases()[case]()
    top = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    table = mapping_table("kineto")
    forward = table.classify([top[-1].name]).iloc[0]["op"]
    node = out.grad_fn.name()
    backward = table.classify([PREFIX + node]).iloc[0]["op"]
    assert backward == f"{forward}_backward", (top[-1].name, node)
