"""Real MXNet parameter-server jobs on loopback (scheduler, server and two workers as separate
processes): per-rank traces, the servers' traces, comm per worker, phases summing to steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.procs import needs  # (before the imports it guards)

needs("mxnet")

from opprof.analysis.breakdown import step_breakdown  # noqa: E402
from opprof.analysis.report import build_report  # noqa: E402
from opprof.collectors import RecordConfig, record  # noqa: E402
from opprof.normalizers import normalize  # noqa: E402
from tests.test_mxnet_normalizer import aggregate_mismatches  # noqa: E402
from tests.test_mxnet_ps_failures import job_processes  # noqa: E402

PHASES = ["load", "h2d", "forward", "backward", "update", "comm", "other"]


def run_job(workdir: Path, mode: str):
    config = RecordConfig(fw="mxnet", model="lenet5", batch_size=8, steps=2, warmup=1,
                          timing_steps=1, workers=2, servers=1, mode=mode, timeout_s=120)
    seen: list[tuple[str, int, int]] = []
    rec = record(config, workdir, lambda *a: seen.append(a))
    return rec, normalize(rec.native, rec.meta), seen


@pytest.fixture(scope="module", params=["ps-sync", "ps-async"])
def job(request, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp(request.param)
    return (request.param, workdir, *run_job(workdir, request.param))


def test_every_rank_wrote_its_trace_and_no_process_is_left(job) -> None:
    mode, workdir, rec, _, _ = job
    assert [p.name for p in rec.native] == ["rank0_worker.json", "rank1_worker.json",
                                           "rank0_server.json"]
    for rank in (0, 1):
        assert (workdir / f"rank{rank}_worker.dumps.txt").is_file()
    assert job_processes(workdir) == []
    m = rec.meta
    assert (m["workers"], m["servers"], m["mode"]) == (2, 1, mode)
    assert m["kvstore"] == {"ps-sync": "dist_sync", "ps-async": "dist_async"}[mode]
    assert set(m["rank_pids"]) == {"0", "1"} and m["server_traces"] == 1
    assert m["comm_bytes_per_step"] == {"0": 2 * 4 * 62_006, "1": 2 * 4 * 62_006}


def test_comm_per_worker_and_phases_sum_to_the_step(job) -> None:
    _, _, _, trace, _ = job
    steps = step_breakdown(trace)
    assert sorted(set(steps["rank"])) == [0, 1]
    assert (steps.groupby("rank").size() == 2).all()
    assert (steps[PHASES].sum(axis=1) == steps["dur_ns"]).all()
    assert (steps["comm"] > 0).all()
    ranks = build_report(trace).ranks
    assert (ranks["comm"] > 0).all() and len(ranks) == 2


def test_each_worker_agrees_with_its_own_aggregate(job) -> None:
    _, workdir, _, trace, _ = job
    assert aggregate_mismatches(trace, workdir) == []


def test_server_is_a_rank_after_the_workers_and_updates_the_weights(job) -> None:
    mode, _, _, trace, _ = job
    ev = trace.events
    server = ev[ev["role"] == "server"]
    assert set(server["rank"]) == {2}
    # 10 arrays, 2 steps: a sync server updates once for both workers, an async one per push.
    # MXNet passes the servers' profiler switches on like messages: an async server may apply
    # worker 1's first profiled push before the switch on from worker 0 has reached it, or
    # its first push after the profile before the switch off (one step: the workers meet
    # after each switch).
    updates = int((server["op"] == "weights_update").sum())
    if mode == "ps-sync":
        assert updates == 10 * 2
    else:
        assert 10 * 2 * 2 - 10 <= updates <= 10 * 2 * 2 + 10
    workers = ev[ev["role"] == "worker"]
    assert not (workers["op"] == "weights_update").any()  # update_on_kvstore: servers update


def test_progress_is_relayed_from_worker_zero(job) -> None:
    _, _, _, _, seen = job
    assert ("profile", 2, 2) in seen and ("timing", 1, 1) in seen


def test_a_job_split_over_two_launchers_like_two_machines(tmp_path: Path) -> None:
    """`opprof record --nnodes 2 --node-rank R --master-addr A --master-port P` (Rendezvous)
    spreads one job over one run per machine; here both "machines" are this one."""
    import threading

    from opprof.collectors import Rendezvous
    from opprof.collectors.supervisor import free_port

    port = free_port()
    parts = {name: Rendezvous(nnodes=2, node_rank=i, master_addr="127.0.0.1", master_port=port)
             for i, name in enumerate(("a", "b"))}
    out: dict = {}

    def run(name: str) -> None:
        config = RecordConfig(fw="mxnet", model="lenet5", batch_size=8, steps=2, warmup=1,
                              timing_steps=1, workers=2, servers=1, mode="ps-sync",
                              timeout_s=120, rendezvous=parts[name])
        (tmp_path / name).mkdir()
        try:
            out[name] = record(config, tmp_path / name)
        except Exception as exc:  # reported below
            out[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    recs = [out["a"], out["b"]]
    assert all(not isinstance(r, Exception) for r in recs), recs
    worker_ranks = sorted(int(p.name[4]) for r in recs for p in r.native if "worker" in p.name)
    assert worker_ranks == [0, 1]
    assert (tmp_path / "a" / "rank0_server.json").is_file()  # the server ran on "machine" a
    trace = normalize([p for r in recs for p in r.native])
    steps = step_breakdown(trace)
    assert sorted(set(steps["rank"])) == [0, 1] and (steps["comm"] > 0).all()
