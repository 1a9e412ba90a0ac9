"""Low-efficiency operators: operators that take much of the step far below the machine's
roofline at their arithmetic intensity. Evidence: the roofline rows of the efficiency
analysis (op, phase, FLOPs, bytes, intensity, achieved FLOP/s and bytes/s, the share of the
roofline achieved, what bounds it) and the operator's time per step. Actions by what bounds
it: memory-bound elementwise, activation and normalization work — fuse it with its
neighbours (``torch.compile``); matmuls and convolutions in fp32 — bf16 autocast (tensor
cores); convolutions — the channels-last layout; latency/overhead-bound calls — larger,
fewer calls (the launch-bound rule's). Saving: the operator brought to :data:`TARGET` of its
roofline, re-simulated (`opprof whatif --op OP=share/TARGET`; the graph replay where the trace
has one), for the operators with the largest such saving.

Reads the ``roofline`` rows of the Round 4 contract (``report.efficiency.roofline``);
without them (no FLOPs for this trace: shapes not recorded, or an opprof without the
efficiency analysis) the rule does not run and the advisory says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice
from opprof.model.knobs import op_scaled

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "low-efficiency"
NEEDS: tuple[str, ...] = ("roofline",)
#: The share of its roofline an operator is brought to in the prediction.
TARGET = 0.5
#: Below this share of its roofline an operator is worth a word.
LOW = 0.25
#: At most this many operators advised.
TOP = 2
FUSIBLE = ("elementwise", "activation", "normalization", "batch_norm", "dropout", "memory",
           "loss")
MATMUL = ("fully_connected", "convolution", "attention")


def advise(ev: Evidence) -> list[Advice]:
    """The low-efficiency advice (see the module docstring)."""
    roof = ev.roofline
    if roof is None or "roofline_share" not in roof:
        return []
    time = ev.ops_per_step("device" if ev.gpu else "host")
    rows = roof.dropna(subset=["roofline_share"])
    rows = rows[(rows["roofline_share"] > 0) & (rows["roofline_share"] < LOW)]
    cands = []
    for r in rows.to_dict("records"):
        op = str(r["op"])
        t = float(r.get("time_ns_per_step") or time.get(op, 0.0))
        if t <= 0 or op not in time.index:
            continue
        factor = float(r["roofline_share"]) / TARGET
        cands.append((t * (1.0 - factor), op, factor, r, t))
    cands.sort(key=lambda c: -c[0])
    out: list[Advice] = []
    step = ev.step_ns
    seen: set[str] = set()
    for _, op, factor, r, t in cands:
        if op in seen or len(out) >= TOP:
            continue
        seen.add(op)
        pred = op_scaled(ev.context, op, factor)
        bound = str(r.get("bound") or "")
        share = float(r["roofline_share"])
        evidence: JSONObject = {"op": op, "phase": r.get("phase"), "ns_per_step": t,
                    "roofline_share": share, "bound": bound,
                    "intensity": r.get("intensity"),
                    "achieved_flops_per_s": r.get("achieved_flops_per_s"),
                    "achieved_bytes_per_s": r.get("achieved_bytes_per_s"),
                    "precision": r.get("precision")}
        finding = (f"low efficiency: {op} ({r.get('phase')}) takes {t / 1e6:,.1f} ms per step "
                   f"at {share:.0%} of its roofline ({bound or 'bound unknown'})")
        out.append(Advice(NAME, finding, _action(op, bound, r, ev.gpu), pred.saving_ns,
                          pred.saving_ns / step if step else 0.0, "low", evidence,
                          f"{op} at {TARGET:.0%} of its roofline ({pred.how})"))
    return out


def _action(op: str, bound: str, row: dict[str, object], gpu: bool) -> str:
    base = op.removesuffix("_backward")
    precision = str(row.get("precision") or "")
    if bound == "latency-overhead":
        return (f"{op} runs as many small calls: batch them (a larger batch, fewer, larger "
                "tensors) or capture them (torch.compile, CUDA graphs)")
    if base in MATMUL and gpu and precision in ("", "fp32", "float32", "tf32"):
        extra = "; for convolutions also the channels-last layout" if base == "convolution" \
            else ""
        return (f"run {op} in bf16 (torch.autocast(device_type='cuda', dtype=torch.bfloat16)) "
                f"so it uses the tensor cores{extra}")
    if base == "convolution":
        return (f"give {op} the channels-last layout (model.to(memory_format="
                "torch.channels_last)) and check the backend picks a fast algorithm "
                "(torch.backends.cudnn.benchmark = True on a GPU)")
    if base in FUSIBLE or bound == "memory":
        return (f"fuse {op} with its neighbours so its tensors are read once "
                "(torch.compile(model)): it moves bytes, it does little arithmetic")
    return f"look at {op}'s implementation: it reaches a small part of what the machine allows"
