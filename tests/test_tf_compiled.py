"""TensorFlow training compiled with XLA, and Keras 2, under `opprof run` as users run it
(tests/scripts): Keras 3 ``fit`` with ``jit_compile=True`` on tf.data, a custom loop whose step is
``@tf.function(jit_compile=True)``, and ``tf_keras`` ``fit``. Each run exits 0 with forward,
backward and update found, phases summing to each step, and `other` small both as a phase and as
an operator; XLA's ops (HLO instructions) land in the taxonomy by xprof's HLO category and the
TensorFlow op of their metadata (the backward by its ``gradient_tape/`` name), fusions as
``fused``/``fused_backward`` with their computation kept. The same keys from xprof's GPU
trace-viewer args (``hlo_category``, ``tf_op``) map the same way."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from opprof.loader import load
from opprof.taxonomy import PHASES, mapping_table
from tests.conftest import REPO, run_cli
from tests.procs import needs
from tests.xprof_check import assert_totals_match_xprof

SCRIPTS = REPO / "tests" / "scripts"
#: The issue's protocol: 2 warm-up steps, 3 timed (the default), 5 profiled.
PROTOCOL = ["--steps", "5", "--warmup", "2"]
RUNS = {"keras_xla_fit": ("tf_keras_xla_fit.py", "keras"),
        "xla_loop": ("tf_xla_loop.py", "tensorflow"),
        "keras2_fit": ("tf_keras2_fit.py", "tf_keras")}


def _run(tmp: Path, script: str) -> tuple:
    res = run_cli("run", *PROTOCOL, "-o", str(tmp / "x.trace"), "--format", "json", "--",
                  "python", str(SCRIPTS / script), "--steps", "12", cwd=tmp, timeout=600)
    report = json.loads(res.stdout) if res.stdout.strip() else None
    by_op = run_cli("report", str(tmp / "x.trace"), "--by", "op", "--format", "json", cwd=tmp)
    return res, report, json.loads(by_op.stdout) if by_op.returncode == 0 else None


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory: pytest.TempPathFactory):
    script, module = RUNS[request.param]
    needs("tensorflow", "xprof", module)
    tmp = tmp_path_factory.mktemp(request.param)
    return (request.param, tmp, *_run(tmp, script))


@pytest.mark.slow
def test_opprof_run_counts_the_steps_and_finds_every_phase(run) -> None:
    name, _, res, report, _ = run
    assert res.returncode == 0, res.stderr
    assert "not counted" not in res.stderr
    steps = report["steps"]
    assert len(steps) == 5
    for s in steps:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
    for phase in ("forward", "backward", "update"):
        assert report["phases"][phase]["ns_per_step"] > 0, (name, phase)


@pytest.mark.slow
def test_other_is_small_as_a_phase_and_as_an_operator(run) -> None:
    name, _, _, report, by_op = run
    assert report["phases"]["other"]["share"] <= 0.10, name
    step_ns = sum(s["dur_ns"] for s in report["steps"]) / len(report["steps"])
    other_op = sum(o["ns_per_step"] for o in by_op["ops"] if o["op"] == "other")
    assert other_op <= 0.10 * step_ns, (name, other_op / step_ns)


@pytest.mark.slow
def test_xla_ops_map_by_category_with_their_computation_kept(run) -> None:
    name, tmp, *_ = run
    ev = load(tmp / "x.trace").events
    xla = ev[ev["detail"].astype("string").str.contains(" @ a_inference_", regex=False,
                                                         na=False)]
    if name == "keras2_fit":
        assert xla.empty  # not compiled: TF's own ops
        return
    counted = xla[xla["counted"] & (xla["step"] >= 0)]
    ops = set(counted["op"].astype(str))
    assert {"fused", "fused_backward", "convolution", "fully_connected_backward",
            "weights_update"} <= ops, ops
    assert "other" not in ops
    fused = counted[counted["op"].astype(str).str.startswith("fused")]
    # the fusion's name (xprof's) and its fused computation are kept
    assert fused["name"].astype(str).str.contains("fusion").all()
    assert fused["detail"].astype(str).str.contains(r" = \S*computation", regex=True).all()
    backward = counted[counted["phase"].astype(str) == "backward"]
    assert backward["detail"].astype(str).str.contains("gradient_tape/").all()


@pytest.mark.slow
def test_tf_op_totals_still_match_xprof(run) -> None:
    """xprof's framework_op_stats lists the TF ops around the compiled program (its CPU
    profile has no HLO aggregate: hlo_stats and op_profile are empty there); those agree."""
    _, tmp, *_ = run
    trace = load(tmp / "x.trace")
    for path in (tmp / "x.native").rglob("*.xplane.pb"):
        assert assert_totals_match_xprof(trace, path, counts=False) > 0


@pytest.mark.slow
@pytest.mark.parametrize("xla", [False, True], ids=["eager-graph", "xla"])
def test_a_small_keras_classifier_under_opprof_run(tmp_path: Path, xla: bool) -> None:
    """A step of a fraction of a millisecond (an MLP, RMSprop, a softmax output): opprof's own
    per-step callback is no operator, and the optimizer's scope (Keras 3 names RMSprop
    ``rm_sprop``) is the update."""
    needs("tensorflow", "keras")
    res = run_cli("run", *PROTOCOL, "-o", str(tmp_path / "x.trace"), "--format", "json", "--",
                  "python", str(SCRIPTS / "tf_keras_mlp_fit.py"), "--steps", "12",
                  *(["--xla"] if xla else []), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert len(report["steps"]) == 5
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
        for phase in ("forward", "backward", "update"):
            assert s["phases"][phase] > 0, (phase, s)
    step_ns = sum(s["dur_ns"] for s in report["steps"])
    assert report["phases"]["other"]["share"] <= 0.10
    other_op = sum(o["total_ns"] for o in report["ops"] if o["op"] == "other")
    assert other_op <= 0.10 * step_ns, other_op / step_ns
    ev = load(tmp_path / "x.trace").events
    ev = ev[ev["step"] >= 0]
    callback = ev[ev["name"].astype(str) == "EagerPyFunc"]
    assert len(callback) and (callback["kind"] == "marker").all() and not callback["counted"].any()
    update = ev[ev["counted"] & (ev["op"] == "weights_update")]
    assert update["detail"].astype(str).str.contains("rm_sprop/").any()


def _optimizer_names() -> list[str]:
    """The name scope of every Keras 3 and Keras 2 optimizer that builds with no argument."""
    import inspect
    names = []
    for module in ("keras", "tf_keras"):
        if importlib.util.find_spec(module) is None:
            continue
        optimizers = importlib.import_module(module).optimizers
        for cls in vars(optimizers).values():
            if inspect.isclass(cls) and issubclass(cls, optimizers.Optimizer):
                try:
                    names.append(cls().name)
                except (TypeError, ValueError):  # needs arguments (LossScaleOptimizer, the base)
                    pass
    return names


def test_every_keras_optimizers_scope_is_the_update() -> None:
    """Keras 3 snake-cases its optimizers' names (``RMSprop`` → ``rm_sprop``, ``AdamW`` →
    ``adam_w``): every one's ops, TF ops and XLA ones, are the update."""
    needs("tensorflow", "keras")
    names = _optimizer_names()
    assert {"rm_sprop", "adam_w", "sgd", "RMSprop"} <= set(names), names
    keys = [k for n in names for k in (f"{n}/AssignSubVariableOp:AssignSubVariableOp",
                                       f"XLA loop fusion: {n}/Add_3:AddV2")]
    got = mapping_table("tf").classify(keys)
    wrong = got[(got["op"] != "weights_update") | (got["phase"] != "update")]
    assert wrong.empty, wrong


def test_a_softmax_is_attention_only_inside_attention() -> None:
    got = mapping_table("tf").classify([
        "transformer_1/multi_head_attention_1/Softmax:_MklSoftmax",
        "model/multi_head_attention/softmax/Softmax:Softmax",
        "sequential_1/dense_1/Softmax:_MklSoftmax", "model/softmax/Softmax:Softmax"])
    assert got["op"].tolist() == ["attention", "attention", "activation", "activation"]


# ------------------------------------------------------------------ the mapping itself

#: (xprof's HLO category, TF op of the metadata) -> (op, phase): what the trace viewer gives
#: on GPU (XLA Ops line args ``hlo_category`` and ``tf_op``) and what opprof derives on CPU.
GPU_XLA_OPS = [
    ("convolution fusion", "model/conv2d/Relu:Relu", "convolution", "forward"),
    ("custom-call __cudnn$convForward", "model/conv2d/Conv2D:Conv2D", "convolution", "forward"),
    ("custom-call __cublas$gemm", "model/dense/MatMul:MatMul", "fully_connected", "forward"),
    ("custom-call __cublas$gemm", "gradient_tape/model/dense/MatMul/MatMul:MatMul",
     "fully_connected_backward", "backward"),
    ("loop fusion", "model/dense/BiasAdd:BiasAdd", "fused", "forward"),
    ("input fusion", "gradient_tape/model/dense/BiasAdd/BiasAddGrad:BiasAddGrad",
     "fused_backward", "backward"),
    ("custom-call __cudnn$convBackwardFilter",
     "gradient_tape/model/conv2d/Conv2D/Conv2DBackpropFilter:Conv2DBackpropFilter",
     "convolution_backward", "backward"),
    ("loop fusion", "SGD/update/ResourceApplyGradientDescent:ResourceApplyGradientDescent",
     "weights_update", "update"),
    ("all-reduce-start", "CrossReplicaSum:XlaAllReduce", "all_reduce", "comm"),
    ("data formatting", "model/flatten/Reshape:Reshape", "memory", "forward"),
]


def test_gpu_trace_viewer_xla_ops_map_like_cpu_ones() -> None:
    from opprof.normalizers.xplane import _HLO_COLUMNS, xla_keys

    args = pd.DataFrame({"hlo_op": [f"fusion.{i}" for i in range(len(GPU_XLA_OPS))],
                         "hlo_module": "cluster_0__XlaCompiledKernel_true.12",
                         "hlo_category": [c for c, *_ in GPU_XLA_OPS],
                         "tf_op": [t for _, t, *_ in GPU_XLA_OPS]})
    key, detail = xla_keys(args, pd.DataFrame(columns=_HLO_COLUMNS))
    got = mapping_table("tf").classify(list(key))
    for k, (*_, op, phase) in zip(key, GPU_XLA_OPS, strict=True):
        assert (got.loc[k, "op"], got.loc[k, "phase"]) == (op, phase), k
    assert detail.str.contains("@ cluster_0__XlaCompiledKernel_true.12/fusion.", regex=False).all()


def test_hlo_categories_and_metadata_of_a_module() -> None:
    """A single-op fusion (XLA CPU's ``wrapped_*``) has its op's category; a fusion of several
    its kind's; an instruction without metadata takes its user's TF op (a gradient's helper
    is backward)."""
    needs("tensorflow")
    from tensorflow.compiler.xla.service import hlo_pb2

    from opprof.normalizers.xplane import _module_rows

    m = hlo_pb2.HloModuleProto(name="m")
    wrapped = m.computations.add(name="wrapped_reduce-window_computation", id=2)
    wrapped.instructions.add(name="p", opcode="parameter", id=20)
    wrapped.instructions.add(name="c", opcode="constant", id=21)
    wrapped.instructions.add(name="rw", opcode="reduce-window", id=22)
    fused = m.computations.add(name="fused_computation.1", id=3)
    fused.instructions.add(name="p", opcode="parameter", id=30)
    fused.instructions.add(name="mul", opcode="multiply", id=31)
    fused.instructions.add(name="add", opcode="add", id=32)
    entry = m.computations.add(name="main", id=1)
    entry.instructions.add(name="iota.1", opcode="iota", id=10)
    w = entry.instructions.add(name="wrapped_reduce-window", opcode="fusion", id=11,
                               fusion_kind="kLoop", called_computation_ids=[2],
                               operand_ids=[10])
    w.metadata.op_name, w.metadata.op_type = "gradient_tape/pool/MaxPoolGrad", "MaxPoolGrad"
    f = entry.instructions.add(name="multiply_add_fusion", opcode="fusion", id=12,
                               fusion_kind="kLoop", called_computation_ids=[3])
    f.metadata.op_name, f.metadata.op_type = "dense/BiasAdd", "BiasAdd"
    rows = {r[1]: r for r in _module_rows(m)}
    assert rows["wrapped_reduce-window"][2:] == (
        "reduce-window", "gradient_tape/pool/MaxPoolGrad:MaxPoolGrad",
        "wrapped_reduce-window_computation")
    assert rows["multiply_add_fusion"][2:] == ("loop fusion", "dense/BiasAdd:BiasAdd",
                                               "fused_computation.1")
    assert rows["iota.1"][2:4] == ("iota", "gradient_tape/pool/MaxPoolGrad:MaxPoolGrad")


def _gpu_xspace(path: Path) -> list:
    """An XPlane of one XLA step on a GPU, built by the XSpace schema as TensorFlow's GPU
    profiler writes it: the program's HLO proto in ``/host:metadata`` (stat ``Hlo Proto``), a
    ``/device:GPU:0`` plane whose ``Stream #1(Compute)`` line holds the kernels, each with its
    ``hlo_op`` and ``hlo_module`` stats, and the host's ``train`` step marker."""
    from tensorflow.compiler.xla.service import hlo_pb2
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    hlo = hlo_pb2.HloProto()
    module = hlo.hlo_module
    module.name, module.id, module.entry_computation_name = "cluster_0", 7, "main"
    main = module.computations.add(name="main", id=1)
    fused = module.computations.add(name="fused_computation", id=2)
    fused.instructions.add(name="p", opcode="parameter", id=20)
    fused.instructions.add(name="cmp", opcode="compare", id=21)
    fused.instructions.add(name="sel", opcode="select", id=22)
    kernels = [  # (kernel, HLO instruction, opcode, TF op, what opprof makes of it)
        ("sm90_xmma_gemm", "custom-call.1", "custom-call", ("dense/MatMul", "MatMul"),
         ("fully_connected", "forward")),
        ("loop_select_fusion", "fusion.2", "fusion", ("gradient_tape/dense/ReluGrad",
                                                      "ReluGrad"), ("fused_backward", "backward")),
        ("sm90_xmma_gemm", "custom-call.3", "custom-call",
         ("gradient_tape/dense/MatMul/MatMul", "MatMul"),
         ("fully_connected_backward", "backward")),
    ]
    for n, (_, op, opcode, (op_name, op_type), _) in enumerate(kernels):
        ins = main.instructions.add(name=op, opcode=opcode, id=10 + n)
        ins.metadata.op_name, ins.metadata.op_type = op_name, op_type
        if opcode == "custom-call":
            ins.custom_call_target = "__cublas$gemm"
        else:
            ins.fusion_kind, ins.called_computation_ids[:] = "kLoop", [2]
    space = xplane_pb2.XSpace()
    meta = space.planes.add(id=1, name="/host:metadata")
    meta.stat_metadata[1].id, meta.stat_metadata[1].name = 1, "Hlo Proto"
    meta.event_metadata[7].id, meta.event_metadata[7].name = 7, "cluster_0"
    meta.event_metadata[7].stats.add(metadata_id=1).bytes_value = hlo.SerializeToString()
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    for i, stat in enumerate(("hlo_op", "hlo_module"), start=1):
        gpu.stat_metadata[i].id, gpu.stat_metadata[i].name = i, stat
    stream = gpu.lines.add(id=1, name="Stream #1(Compute)", timestamp_ns=1_000_000)
    for n, (kernel, op, *_) in enumerate(kernels, start=1):
        gpu.event_metadata[n].id, gpu.event_metadata[n].name = n, kernel
        ev = stream.events.add(metadata_id=n, offset_ps=n * 40_000_000, duration_ps=30_000_000)
        ev.stats.add(metadata_id=1, str_value=op)
        ev.stats.add(metadata_id=2, str_value="cluster_0")
    host = space.planes.add(id=3, name="/host:CPU")
    host.stat_metadata[1].id, host.stat_metadata[1].name = 1, "step_num"
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "train"
    marker = host.lines.add(id=5, name="python", timestamp_ns=1_000_000).events.add(
        metadata_id=1, offset_ps=0, duration_ps=200_000_000)
    marker.stats.add(metadata_id=1, int64_value=0)
    path.write_bytes(space.SerializeToString())
    return kernels


def test_xla_kernels_of_a_gpu_xplane_map_like_cpu_ones(tmp_path: Path) -> None:
    needs("tensorflow", "xprof")
    from opprof.normalizers import normalize

    path = tmp_path / "host.xplane.pb"
    kernels = _gpu_xspace(path)
    trace = normalize([path], {})
    ev = trace.events
    k = ev[ev["kind"].astype(str) == "kernel"].sort_values("ts")
    assert (k["device"].astype(str) == "cuda:0").all() and (k["step"] == 0).all()
    assert k["counted"].all()
    got = list(zip(k["op"].astype(str), k["phase"].astype(str), strict=True))
    assert got == [want for *_, want in kernels]
    assert trace.meta["device"] == "cuda"


PROFILE_API = '''
import numpy as np
import tensorflow as tf
import opprof

model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(10)])
optimizer = tf.keras.optimizers.SGD(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
x, y = np.random.rand(32, 64).astype("float32"), np.random.randint(0, 10, 32)


@tf.function(jit_compile=True)
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


with opprof.profile(steps=3, warmup=1, timing_steps=1, output="mine.trace") as prof:
    for _ in range(8):
        train_step(x, y)
        prof.step()
'''


@pytest.mark.slow
def test_profile_api_counts_the_steps_of_an_xla_loop(tmp_path: Path) -> None:
    needs("tensorflow", "xprof")
    import subprocess
    import sys

    (tmp_path / "mine.py").write_text(PROFILE_API)
    res = subprocess.run([sys.executable, "mine.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    report = json.loads(run_cli("report", "mine.trace", "--format", "json",
                                cwd=tmp_path).stdout)
    assert len(report["steps"]) == 3
    for phase in ("forward", "backward", "update"):
        assert report["phases"][phase]["busy_ns_per_step"] > 0, phase
