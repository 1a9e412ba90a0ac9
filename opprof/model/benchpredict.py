"""The model's prediction of a bench run: a multi-worker run predicted from the same framework
and model's 1-worker run and checked against it (`opprof bench`'s table and figures show it
beside the measurement, :class:`~opprof.analysis.matrix.BenchPrediction`)."""

from __future__ import annotations

from opprof.analysis.matrix import BenchPrediction
from opprof.errors import OpprofError
from opprof.model.commmodel import Network
from opprof.model.predict import check, network_from_trace, predict
from opprof.trace import Trace


def prediction(single: Trace, multi: Trace, network: Network | None = None) -> BenchPrediction:
    """The model's prediction of a multi-worker run from the same framework and model's
    1-worker run (:mod:`opprof.model.predict`), checked against it: predicted profiled step
    and scaling (step(1) / step(N)) beside the measured ones, the error, and a note saying
    where α and β came from — or why there is no prediction."""
    workers = int(multi.meta.get("workers") or len(multi.ranks) or 1)
    mode = str(multi.meta.get("mode") or "")
    try:
        if network is None:
            network = network_from_trace(multi)
        result = predict(single, [workers], mode=mode or None,
                         servers=int(multi.meta.get("servers") or 0) or None, network=network)
        c = check(result, multi, "the measured run")
    except OpprofError as exc:
        return BenchPrediction(note=str(exc))
    one = result.base.step_ns
    return BenchPrediction(
        note=f"network {result.network.source}: {result.network_note}",
        predicted_step_ns=c.predicted_step_ns, prediction_error=c.error,
        predicted_scaling=one / c.predicted_step_ns if c.predicted_step_ns else None,
        profiled_scaling=one / c.measured_step_ns if c.measured_step_ns else None)
