"""`record --fw torch` in the model-parallel modes: the built-in model split across the workers
as users split theirs, and its training step. Framework calls only; torch is imported when a
function runs.

- ``tp``: tensor parallel on a 1-D ``init_device_mesh``: ``parallelize_module`` with
  ``ColwiseParallel`` on the first linear layer of each feed-forward block and
  ``RowwiseParallel`` on the second (the transformer's encoder layers; the fully connected
  network's hidden layers in pairs). Every rank sees the same batch.
- ``pp``: ``torch.distributed.pipelining``: the model cut into one stage per rank (the
  transformer's embedding and first layers | … | last layers and head; a ResNet's stem and
  stages; the fully connected network's layers), ``PipelineStage`` + ``ScheduleGPipe`` over
  :func:`microbatches` micro-batches. The step carries no phase marker (forward and backward
  run inside the schedule): its phases are inferred from the operators, as in a user's trace.
- ``ep``: the transformer with a mixture-of-experts feed-forward block (:class:`MoEFeedForward`:
  top-1 routing, one expert per rank, tokens exchanged with ``dist.all_to_all_single`` and the
  split sizes before them); every rank its own batch, the replicated parameters' gradients
  all-reduced after the backward pass.
- ``fsdp+tp``: a 2-D mesh (``dp``, ``tp`` of 2): tensor parallel as ``tp`` inside each encoder
  layer, FSDP2 ``fully_shard`` over ``dp`` on each layer and the root. Ranks of one TP group
  see the same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opprof.errors import OpprofError
from opprof.kinds import Mode

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.optim import Optimizer

    Batch = tuple[torch.Tensor, torch.Tensor]

#: The models each mode splits.
MODELS = {Mode.TP: ("transformer", "fcn"), Mode.PP: ("transformer", "fcn", "resnet18", "resnet50"),
          Mode.EP: ("transformer",), Mode.FSDP_TP: ("transformer",)}
#: The tensor-parallel degree of ``fsdp+tp`` (the inner mesh dimension).
FSDP_TP_DEGREE = 2


def check(mode: str, model: str, workers: int, batch_size: int) -> None:
    """One clear line for a combination the model-parallel modes cannot record."""
    if mode not in MODELS:
        return
    if model not in MODELS[Mode(mode)]:
        raise OpprofError(f"--mode {mode} splits {', '.join(MODELS[Mode(mode)])}; "
                          f"not --model {model}")
    if workers < 2:
        raise OpprofError(f"--mode {mode} needs at least 2 workers")
    if mode == Mode.FSDP_TP and (workers < 2 * FSDP_TP_DEGREE or workers % FSDP_TP_DEGREE):
        raise OpprofError(f"--mode fsdp+tp runs tensor parallel of {FSDP_TP_DEGREE} inside FSDP:"
                          f" give an even number of workers, at least {2 * FSDP_TP_DEGREE}")
    if mode == Mode.PP and batch_size < 2:
        raise OpprofError("--mode pp splits each batch into micro-batches: --batch-size ≥ 2")


def data_replicas(mode: str, rank: int, world: int) -> tuple[int, int]:
    """(how many different batches the job trains on at a time, which one this rank takes)."""
    if mode in (Mode.TP, Mode.PP):
        return 1, 0
    if mode == Mode.FSDP_TP:
        return world // FSDP_TP_DEGREE, rank // FSDP_TP_DEGREE
    return world, rank


def microbatches(batch_size: int) -> int:
    """The micro-batches of a ``pp`` step: 4 when the batch divides so, else 2."""
    return 4 if batch_size % 4 == 0 else 2


def build_model(key: str, classes: int, mode: str, world: int) -> nn.Module:
    """The built-in model (``ep``: the transformer with mixture-of-experts feed-forward
    blocks, one expert per rank)."""
    from opprof.collectors.torch_models import build

    model = build(key, classes)
    if mode == Mode.EP:
        for layer in model.layers:  # type: ignore[union-attr]
            layer.moe = MoEFeedForward(layer.linear1.in_features, layer.linear1.out_features,
                                       world)
            # what TransformerEncoderLayer.forward calls (its own linear layers stay unused:
            # its inference fast path reads them)
            layer._ff_block = layer.moe.__call__
            for p in (*layer.linear1.parameters(), *layer.linear2.parameters()):
                p.requires_grad_(False)
    return model


def _moe_class() -> type:
    import torch
    import torch.distributed as dist
    from torch import nn

    class AllToAll(torch.autograd.Function):
        """Rows to their ranks (``dist.all_to_all_single``), the gradients back."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int]
                    ) -> torch.Tensor:
            ctx.splits = (send, recv)
            out = x.new_empty(sum(recv), x.shape[1])
            dist.all_to_all_single(out, x.contiguous(), recv, send)
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            send, recv = ctx.splits
            out = grad.new_empty(sum(send), grad.shape[1])
            dist.all_to_all_single(out, grad.contiguous(), send, recv)
            return out, None, None

    class MoE(nn.Module):
        """Top-1 mixture of experts, one expert (a two-layer MLP) per rank."""

        def __init__(self, width: int, hidden: int, world: int) -> None:
            super().__init__()
            self.world = world
            self.router = nn.Linear(width, world)
            self.expert = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(),
                                        nn.Linear(hidden, width))
            for p in self.expert.parameters():
                setattr(p, "expert", True)  # noqa: B010 (marked: not all-reduced)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            tokens = x.reshape(-1, shape[-1])
            gate, choice = self.router(tokens).softmax(-1).max(-1)
            order = choice.argsort()
            send = torch.bincount(choice, minlength=self.world)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)
            s, r = send.tolist(), recv.tolist()
            exchange: Any = AllToAll.apply
            mine = exchange(tokens[order], s, r)
            back = exchange(self.expert(mine), r, s)
            out = torch.empty_like(back)
            out[order] = back
            done: torch.Tensor = (gate.unsqueeze(1) * out).reshape(shape)
            return done

    return MoE


def MoEFeedForward(width: int, hidden: int, world: int) -> nn.Module:  # noqa: N802
    """A mixture-of-experts feed-forward block (module docstring)."""
    cls: Any = _moe_class()
    module: nn.Module = cls(width, hidden, world)
    return module


def _feed_forward_pairs(model: Any) -> list[tuple[Any, str, str]]:
    """(module, first linear, second linear) of every feed-forward block to split."""
    from torch import nn

    layers = getattr(model, "layers", None)
    if layers is not None:
        return [(layer, "linear1", "linear2") for layer in layers]
    linear = [n for n, m in model.classifier.named_children() if isinstance(m, nn.Linear)]
    return [(model.classifier, a, b) for a, b in zip(linear[0:-1:2], linear[1:-1:2],
                                                     strict=False)]


def tensor_parallel(model: nn.Module, mesh: Any) -> None:
    """``parallelize_module`` on every feed-forward block: column- then row-parallel. An
    in-place ReLU after a column-parallel layer (the fully connected network's) runs out of
    place: the layer's local output is a view DTensor's autograd function made, which
    autograd forbids modifying in place."""
    from torch import nn
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for module, first, second in _feed_forward_pairs(model):
        parallelize_module(module, mesh, {first: ColwiseParallel(), second: RowwiseParallel()})
        for child in module.modules():
            if isinstance(child, nn.ReLU):
                child.inplace = False


def stage_module(model: Any, key: str, stage: int, stages: int) -> nn.Module:
    """This stage's part of the model (one tensor in, one out)."""
    from torch import nn

    if key == "transformer":
        return _TransformerStage(model, stage, stages)
    if key == "fcn":
        parts = list(model.classifier)
        head = [nn.Flatten(1)] if stage == 0 else []
        return nn.Sequential(*head, *_chunk(parts, stage, stages, pairs=True))
    blocks: list[nn.Module] = [nn.Sequential(model.conv1, model.bn1, model.relu)]
    for name in ("layer1", "layer2", "layer3", "layer4"):
        blocks += list(getattr(model, name))
    blocks += [nn.Sequential(model.avgpool, nn.Flatten(1), model.fc)]
    return nn.Sequential(*_chunk(blocks, stage, stages))


def _chunk(items: list[Any], stage: int, stages: int, pairs: bool = False) -> list[Any]:
    """Stage ``stage``'s consecutive share of ``items`` (``pairs``: a layer and its
    activation stay together)."""
    unit = 2 if pairs else 1
    groups = [items[i:i + unit] for i in range(0, len(items), unit)]
    per, extra = divmod(len(groups), stages)
    start = stage * per + min(stage, extra)
    mine = groups[start:start + per + (1 if stage < extra else 0)]
    return [x for g in mine for x in g]


def _transformer_stage() -> type:
    import torch
    from torch import nn

    class Stage(nn.Module):
        """A share of the transformer's encoder layers; the first stage embeds the tokens,
        the last projects to the vocabulary."""

        def __init__(self, model: Any, stage: int, stages: int) -> None:
            super().__init__()
            self.first, self.last = stage == 0, stage == stages - 1
            if self.first:
                self.embed, self.position = model.embed, model.position
            self.layers = nn.ModuleList(_chunk(list(model.layers), stage, stages))
            if self.last:
                self.head = model.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.first:
                length = x.shape[1]
                x = self.embed(x) + self.position(torch.arange(length, device=x.device))
            length = x.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(length, device=x.device)
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return self.head(x) if self.last else x

    return Stage


def _TransformerStage(model: nn.Module, stage: int, stages: int) -> nn.Module:  # noqa: N802
    cls: Any = _transformer_stage()
    module: nn.Module = cls(model, stage, stages)
    return module


def training_step(mode: str, key: str, model: nn.Module, batches: Iterator[Batch],
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  device: torch.device, lr: float, batch_size: int
                  ) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """The training step of this rank in a model-parallel ``mode`` (module docstring), and
    the module it trains; the process group exists."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    kind = device.type
    if mode == Mode.PP:
        return _pipeline_step(key, model, batches, loss_fn, device, lr, batch_size)
    if mode == Mode.TP:
        tensor_parallel(model, init_device_mesh(kind, (world,), mesh_dim_names=("tp",)))
    elif mode == Mode.FSDP_TP:
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(kind, (world // FSDP_TP_DEGREE, FSDP_TP_DEGREE),
                                mesh_dim_names=("dp", "tp"))
        tensor_parallel(model, mesh["tp"])
        layers: Any = model.layers
        for layer in layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shared = [p for p in model.parameters() if not getattr(p, "expert", False)] \
        if mode == Mode.EP else []
    del rank
    return _marked_step(batches, model, loss_fn, optimizer, device, shared, world), model


def _marked_step(batches: Iterator[Batch], model: nn.Module,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 optimizer: Optimizer, device: torch.device, shared: Sequence[torch.Tensor],
                 world: int) -> Callable[[], torch.Tensor]:
    """The four-marker step of a built-in model (``shared``: parameters whose gradients are
    averaged over the ranks after the backward pass, the replicated ones of ``ep``)."""
    import torch.distributed as dist
    from torch.profiler import record_function

    def step() -> torch.Tensor:
        with record_function("opprof.load"):
            x, y = next(batches)
            x, y = x.to(device), y.to(device)
        with record_function("opprof.forward"):
            loss = loss_fn(model(x), y)
        with record_function("opprof.backward"):
            backward: Any = loss.backward
            backward()
            for p in shared:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        with record_function("opprof.update"):
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach()

    return step


def _pipeline_step(key: str, model: nn.Module, batches: Iterator[Batch],
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   device: torch.device, lr: float, batch_size: int
                   ) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """This rank's pipeline stage and its step (no phase marker: see the module docstring)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    part = stage_module(model, key, rank, world).to(device)
    stage = PipelineStage(part, rank, world, device)
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches(batch_size), loss_fn=loss_fn)
    optimizer = torch.optim.SGD(part.parameters(), lr=lr, momentum=0.9)
    nan = torch.tensor(float("nan"))

    def step() -> torch.Tensor:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        return torch.stack(losses).mean().detach() if losses else nan

    return step, part
