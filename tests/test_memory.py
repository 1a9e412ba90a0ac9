"""Memory: the memory table (rows of kind ``memory``), the resident memory sampled from outside
every process, the allocator rows of every format, the per-rank analysis and its reports.

The fixtures in ``fixtures/memory/`` are real recordings (see fixtures/README.md): a torch
LeNet-5 with ``profile_memory``, an MXNet parameter-server job (two workers, a server, the
scheduler) and a TensorFlow LeNet-5, each with the sampled memory files of its processes.
The slow tests record every framework live and check the issue's numbers on them."""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.analysis.breakdown import phase_at, step_breakdown
from opprof.analysis.memory import memory_part
from opprof.analysis.ops import native_totals
from opprof.analysis.report import build_report
from opprof.collectors.rss import Sampler, read_status
from opprof.export.chrome import document
from opprof.job import report as job_report
from opprof.loader import load
from opprof.normalizers import sampled
from opprof.normalizers.memory_rows import MEMORY_TID, without_memory
from opprof.taxonomy import PHASES
from opprof.trace import TraceFile, save
from tests.conftest import FIXTURES, REPO, run_cli
from tests.procs import needs

MEMORY = FIXTURES / "memory"
FOLDERS = ["torch-lenet5", "mxnet-ps-sync", "tf-lenet5"]


def memory_rows(trace):
    ev = trace.events
    return ev[ev["kind"] == "memory"]


def sample_files(folder: Path) -> list[Path]:
    return sorted((folder / "memory").glob("*.memory.csv"))


@pytest.fixture(scope="module")
def traces():
    return {name: load(MEMORY / name) for name in FOLDERS}


# ------------------------------------------------------------------ the memory table


@pytest.mark.parametrize("name", FOLDERS)
def test_memory_rows_are_samples_never_events(traces, name):
    m = memory_rows(traces[name])
    assert len(m) and set(m["name"].astype(str)) <= {"rss", "hwm", "allocated", "reserved"}
    assert not m["counted"].any() and m["op"].isna().all() and (m["dur"] == 0).all()
    assert (m["tid"] == MEMORY_TID).all() and (m["depth"] == 0).all() and (m["link"] == -1).all()
    assert set(m["detail"]) <= {"sampled", "kineto", "xprof", "mxnet", "nsys"}
    # a phase exactly where there is a step
    assert m.loc[m["step"] >= 0, "phase"].notna().all()
    assert m.loc[m["step"] < 0, "phase"].isna().all()


@pytest.mark.parametrize("name", FOLDERS)
def test_every_report_is_identical_with_and_without_memory_rows(traces, name):
    trace = traces[name]
    bare = without_memory(trace)
    assert len(bare.events) < len(trace.events)
    full, plain = build_report(trace), build_report(bare)
    for table in ("steps", "phases", "ops", "device_ops", "ranks", "devices", "stragglers"):
        pd.testing.assert_frame_equal(getattr(full, table), getattr(plain, table))
    assert full.comm_overlap == plain.comm_overlap
    pd.testing.assert_frame_equal(native_totals(trace), native_totals(bare))
    assert not plain.memory.ranks.size and len(full.memory.ranks)
    # the exports: the same slices; memory only as counters
    doc, doc_bare = document(trace), document(bare)
    assert [e for e in doc["traceEvents"] if e["ph"] != "C"] == doc_bare["traceEvents"]
    assert {e["cat"] for e in doc["traceEvents"] if e["ph"] == "C"} == {"memory"}


@pytest.mark.parametrize("name", ["torch-lenet5", "tf-lenet5"])
def test_a_trace_recorded_without_memory_says_why_it_has_none(traces, name):
    """`opprof record --memory-interval 0` takes no resident samples; a TF run whose
    allocator traced nothing then has no memory rows: `--by memory` says why, not 'record
    with opprof record'."""
    from rich.console import Console

    from opprof.render.console import memory_tables

    bare = without_memory(traces[name])
    bare.meta["memory_interval_s"] = 0
    console = Console(width=200, record=True)
    for part in memory_tables(build_report(bare)):
        console.print(part)
    text = console.export_text()
    assert "no memory rows (recorded with --memory-interval 0: no resident samples" in text
    assert ("TensorFlow's allocator traced no allocation" in text) == (name == "tf-lenet5")
    bare.meta["memory_interval_s"] = 0.02  # sampled, yet no rows: the generic advice
    console = Console(width=200, record=True)
    for part in memory_tables(build_report(bare)):
        console.print(part)
    assert "record with opprof record" in console.export_text()


def test_saving_keeps_every_rank_detail_column(tmp_path, traces):
    trace = traces["mxnet-ps-sync"]
    save(trace, tmp_path / "x.trace")
    back = load(tmp_path / "x.trace")
    ev = trace.events  # one row group per rank, ranks in order of first appearance
    ordered = ev.iloc[np.argsort(pd.factorize(ev["rank"])[0], kind="stable")]
    for col in ("rank", "name", "detail", "kind", "step", "phase", "bytes"):
        assert back.events[col].astype(str).tolist() == ordered[col].astype(str).tolist()


# ------------------------------------------------------------------ the sampled files


@pytest.mark.parametrize("name", FOLDERS)
def test_sampled_resident_peak_agrees_with_the_kernels_high_water_mark(name):
    for path in sample_files(MEMORY / name):
        _, df = sampled.read(path)
        # within 5%, either side: the kernel keeps the high-water mark lazily (it is raised
        # when mappings are torn down), so it can trail a resident set that shrank otherwise
        peak, hwm = df["rss_bytes"].max(), df["hwm_bytes"].iloc[-1]
        assert abs(peak - hwm) <= 0.05 * hwm, (path, peak, hwm)


@pytest.mark.parametrize("name", FOLDERS)
def test_every_sample_file_becomes_its_ranks_rows(traces, name):
    m = memory_rows(traces[name])
    rss = m[m["name"] == "rss"]
    for path in sample_files(MEMORY / name):
        head, df = sampled.read(path)
        mine = rss[rss["pid"] == head["pid"]]
        assert len(mine) == len(df)
        assert mine["bytes"].tolist() == df["rss_bytes"].tolist()
        if head["rank"] is not None:
            assert set(mine["rank"]) == {head["rank"]} and set(mine["role"]) == {head["role"]}
        hwm = m[(m["name"] == "hwm") & (m["pid"] == head["pid"])]
        assert 1 < len(hwm) < len(df) and hwm["bytes"].iloc[-1] == df["hwm_bytes"].iloc[-1]


def test_servers_and_the_scheduler_get_ranks_of_their_own(traces):
    trace = traces["mxnet-ps-sync"]
    ev = trace.events
    roles = ev.groupby("rank")["role"].first().astype(str).to_dict()
    assert roles == {0: "worker", 1: "worker", 2: "server", 3: "scheduler"}
    # the scheduler writes no trace: only memory rows
    assert (ev.loc[ev["rank"] == 3, "kind"] == "memory").all()
    assert (ev.loc[ev["rank"] == 2, "kind"] != "memory").any()
    assert trace.ranks == [0, 1]


@pytest.mark.parametrize("name", FOLDERS)
def test_samples_land_inside_the_steps(traces, name):
    """Sampled every 20 ms on the host clock, the resident samples of each worker fill its
    profiled steps (the host clock and the trace's clock are the same), and every sample
    placed in a step lies inside that step's bounds."""
    trace = traces[name]
    m = memory_rows(trace)
    bounds = trace.step_bounds()
    for rank, b in bounds.groupby("rank"):
        rss = m[(m["rank"] == rank) & (m["name"] == "rss")]
        inside = rss[rss["step"] >= 0]
        span = (b["end"] - b["start"]).sum()
        assert len(inside) >= 0.5 * span / 20e6 - 1, (rank, len(inside), span)
        joined = inside.merge(b, on=["rank", "step"])
        assert len(joined) == len(inside)
        assert ((joined["ts"] >= joined["start"]) & (joined["ts"] < joined["end"])).all()


def test_a_samples_phase_is_the_one_the_breakdown_gives_its_instant(traces):
    """On a dense grid of instants, the time phase_at gives each phase adds up to the step
    breakdown's wall time of that phase, within one grid spacing per phase change."""
    trace = without_memory(traces["torch-lenet5"])
    steps = step_breakdown(trace)
    n = 200_000
    for s in steps.to_dict("records"):
        t = np.linspace(s["start"], s["end"], n, endpoint=False).astype(np.int64)
        codes = phase_at(trace, np.zeros(n, np.int64) + s["rank"], t)
        assert (codes >= 0).all()
        spacing = (s["end"] - s["start"]) / n
        changes = int((codes[1:] != codes[:-1]).sum()) + 1
        for i, p in enumerate(PHASES):
            got = (codes == i).sum() * spacing
            assert abs(got - s[p]) <= 2 * changes * spacing + 1, (p, got, s[p])


# ------------------------------------------------------------------ the allocators


def test_torch_allocator_peak_is_the_largest_total_allocated_of_the_kineto_trace(traces):
    with gzip.open(MEMORY / "torch-lenet5" / "rank0.pt.trace.json.gz", "rt") as f:
        doc = json.load(f)
    native = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert native, "recorded with profile_memory"
    rep = build_report(traces["torch-lenet5"])
    row = rep.memory.ranks.iloc[0]
    assert row["peak_allocated_bytes"] == max(e["args"]["Total Allocated"] for e in native)
    assert row["allocated_device"] == "cpu" and row["allocated_source"] == "kineto"
    m = memory_rows(traces["torch-lenet5"])
    assert (m["name"] == "allocated").sum() == len(native)
    assert not (m["name"] == "reserved").any()  # the CPU allocator keeps no pool


def test_mxnet_storage_counters_are_the_allocated_rows(traces):
    m = memory_rows(traces["mxnet-ps-sync"])
    counters = []
    for rank in (0, 1):
        with gzip.open(MEMORY / "mxnet-ps-sync" / f"rank{rank}_worker.json.gz", "rt") as f:
            ev = json.load(f)["traceEvents"]
        counters = [e["args"]["Memory: cpu/0"] for e in ev if e.get("cat") == "Device Storage"]
        mine = m[(m["rank"] == rank) & (m["name"] == "allocated")]
        assert sorted(mine["bytes"]) == sorted(counters) and len(counters)


def test_tensorflow_allocator_rows_come_from_xprofs_memory_profile(traces):
    from opprof.normalizers.xplane import _tool

    xplane = next((MEMORY / "tf-lenet5").rglob("*.xplane.pb"))
    prof = _tool(xplane, "memory_profile")["memoryProfilePerAllocator"]["mklcpu"]
    peak = int(prof["profileSummary"]["peakStats"]["heapAllocatedBytes"])
    m = memory_rows(traces["tf-lenet5"])
    alloc = m[m["name"] == "allocated"]
    assert len(alloc) and alloc["bytes"].max() == peak
    # every traced allocation is inside the profile: in a step, or between two
    bounds = traces["tf-lenet5"].step_bounds()
    assert alloc["ts"].min() >= bounds["start"].min() - 50_000_000
    assert alloc["ts"].max() <= bounds["end"].max() + 50_000_000


def test_nsys_cuda_memory_usage_is_the_reserved_series(tmp_path):
    from tests.nvidia_sqlite import SESSION_UTC_NS, gtid, torch_job, write_nsys

    tl = torch_job(ranks=2, steps=2)
    db = write_nsys(tmp_path / "job.sqlite", tl)
    pids = sorted(tl.devices)
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL,
            pc INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER NOT NULL,
            memoryOperationType INTEGER NOT NULL, name TEXT, correlationId INTEGER,
            streamId INTEGER, localMemoryPoolAddress INTEGER,
            localMemoryPoolReleaseThreshold INTEGER, localMemoryPoolSize INTEGER,
            localMemoryPoolUtilizedSize INTEGER, importedMemoryPoolAddress INTEGER,
            importedMemoryPoolProcessId INTEGER);
        CREATE TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT,
            label TEXT);
        INSERT INTO ENUM_CUDA_DEV_MEM_EVENT_OPER VALUES
            (0, 'CUDA_DEV_MEM_EVENT_OPR_ALLOCATION', 'Allocation'),
            (1, 'CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION', 'Deallocation');""")
    plan = [(1_000, 2 << 20, 2, 0), (2_000, 8 << 20, 2, 0), (3_000, 1 << 20, 1, 0),
            (4_000, 2 << 20, 2, 1), (5_000, 4 << 20, 2, 0)]  # (t, bytes, kind, op)
    for pid in pids:
        con.executemany(
            "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, "
            "address, pc, bytes, memKind, memoryOperationType) VALUES (?, ?, ?, 1, 0, 0, ?, ?, ?)",
            [(t, gtid(pid, 0), tl.devices[pid], b, k, op) for t, b, k, op in plan])
    con.commit()
    con.close()
    trace = load(db)
    m = memory_rows(trace)
    assert set(m["name"]) == {"reserved"} and set(m["detail"]) == {"nsys"}
    for rank, pid in enumerate(pids):
        mine = m[m["rank"] == rank].sort_values("ts")
        # the pinned host allocation (kind 1) is not device memory
        assert mine["bytes"].tolist() == [2 << 20, 10 << 20, 8 << 20, 12 << 20]
        assert (mine["ts"] - SESSION_UTC_NS).tolist() == [1_000, 2_000, 4_000, 5_000]
        assert set(mine["device"]) == {f"cuda:{tl.devices[pid]}"}
    rep = build_report(trace)
    assert rep.memory.ranks["peak_reserved_bytes"].tolist() == [12 << 20, 12 << 20]


# ------------------------------------------------------------------ the sampler


def test_the_sampler_reads_a_process_from_outside(tmp_path):
    code = ("import numpy, time; time.sleep(0.3); b = numpy.ones(64 * 2**20 // 8); "
            "time.sleep(0.5)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        sampler = Sampler(tmp_path, lambda: [child.pid], lambda: [], interval_s=0.01)
        with sampler:
            child.wait(timeout=30)
    finally:
        child.kill()
    files = list((tmp_path / "memory").glob("*.memory.csv"))
    assert [f.name for f in files] == [f"{child.pid}.memory.csv"]
    head, df = sampled.read(files[0])
    assert head["pid"] == child.pid and head["role"] is None  # never on the channel
    assert len(df) >= 40 and df["ts_ns"].is_monotonic_increasing
    assert df["rss_bytes"].max() - df["rss_bytes"].iloc[0] >= 60 * 2**20
    assert (df["hwm_bytes"] >= df["rss_bytes"]).all()
    assert sampler.late <= sampler.ticks // 2


def test_reading_proc_status_gives_rss_and_hwm():
    fd = os.open(f"/proc/{os.getpid()}/status", os.O_RDONLY)
    try:
        rss, hwm = read_status(fd)
    finally:
        os.close(fd)
    with open(f"/proc/{os.getpid()}/statm") as f:
        statm = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert hwm >= rss > 0 and abs(rss - statm) < 16 * 2**20


def test_a_damaged_sample_file_is_one_clear_line(tmp_path):
    folder = tmp_path / "run"
    (folder / "memory").mkdir(parents=True)
    (folder / "rank0.pt.trace.json.gz").write_bytes(
        (MEMORY / "torch-lenet5" / "rank0.pt.trace.json.gz").read_bytes())
    bad = folder / "memory" / "1.memory.csv"
    bad.write_text("ts_ns,rss_bytes,hwm_bytes\n1,2,3\n")
    res = run_cli("import", str(folder), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and "not an opprof memory sample file" in res.stderr
    assert not (tmp_path / "x.trace").exists()
    # a file cut short mid-row keeps its whole rows
    good = (MEMORY / "torch-lenet5" / "memory").glob("*.csv").__next__().read_text()
    bad.write_text(good[: len(good) - 7])
    res = run_cli("import", str(folder), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------ reports


def test_rank_by_rank_equals_the_whole_job(tmp_path, traces):
    folder = MEMORY / "torch-lenet5"
    whole = build_report(traces["torch-lenet5"]).memory
    by_rank = job_report([folder], jobs=1).memory
    pd.testing.assert_frame_equal(whole.ranks, by_rank.ranks)
    pd.testing.assert_frame_equal(whole.steps, by_rank.steps)
    assert run_cli("import", str(folder), "-o", str(tmp_path / "t.trace")).returncode == 0
    tf = TraceFile(tmp_path / "t.trace")
    assert tf.by_rank
    from_file = job_report([tmp_path / "t.trace"], jobs=1).memory
    pd.testing.assert_frame_equal(whole.ranks, from_file.ranks)
    assert sorted(tf.meta["memory_sources"]) == ["kineto", "sampled"]


def test_report_json_memory_has_exactly_the_documented_keys():
    res = run_cli("report", str(MEMORY / "mxnet-ps-sync"), "--format", "json")
    assert res.returncode == 0, res.stderr
    mem = json.loads(res.stdout)["memory"]
    assert [m["rank"] for m in mem] == [0, 1, 2, 3]
    keys = ["rank", "role", "peak_rss_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
            "param_bytes", "peak_step", "by_phase"]
    for m in mem:
        assert list(m) == keys and list(m["by_phase"]) == list(PHASES)
        assert m["peak_rss_bytes"] > 100 * 2**20
    before = json.loads(res.stdout)["memory_unprofiled"]
    assert [b["rank"] for b in before] == [0, 1, 2, 3]
    assert all(0 < b["peak_rss_bytes"] <= m["peak_rss_bytes"] * 1.05
               for b, m in zip(before, mem, strict=True))
    workers = [m for m in mem if m["role"] == "worker"]
    assert all(m["param_bytes"] == 62006 * 4 for m in workers)  # from the ranks' .meta
    assert all(m["peak_allocated_bytes"] > 0 for m in workers)
    assert all(m["peak_step"] is None and m["param_bytes"] is None
               for m in mem if m["role"] != "worker")


@pytest.mark.parametrize("fmt", ["rich", "csv", "md"])
def test_report_by_memory(fmt):
    res = run_cli("report", str(MEMORY / "tf-lenet5"), "--by", "memory", "--format", fmt)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    if fmt == "rich":
        assert "Memory per rank" in out and "Peak by phase" in out and "Timeline" in out
        assert "MiB" in out and "256 KiB" in out
    elif fmt == "csv":
        table = pd.read_csv(__import__("io").StringIO(out))
        assert table["peak_rss_bytes"].iloc[0] > 0 and "peak_forward_bytes" in table
    else:
        assert out.startswith("## opprof report tf") and "| rank | role | peak rss MiB |" in out
        assert " MiB |" in out.splitlines()[-1] and "_bytes" not in out


def test_the_default_report_has_a_memory_line():
    res = run_cli("report", str(MEMORY / "torch-lenet5"))
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    line = text[text.index("memory:"):text.index("(--by memory for more)")]
    assert "peak resident" in line and "allocator" in line and "(cpu)" in line
    # the profiler's own growth is told apart from the run's memory
    assert re.search(r"peak resident [\d.,]+ MiB unprofiled, [\d.,]+ MiB while profiling "
                     r"\(rank 0, step \d+; [+-][\d.,]+ MiB is the profiler's own\)", line), line


def test_diff_puts_memory_beside_time():
    a, b = str(MEMORY / "tf-lenet5"), str(MEMORY / "torch-lenet5")
    res = run_cli("diff", a, b)
    assert res.returncode == 0, res.stderr
    assert "Memory" in res.stdout
    verdict = " ".join(ln for ln in res.stdout.splitlines() if ln.startswith("Memory verdict"))
    assert "resident peak before profiling, the profiler's buffers left out" in \
        " ".join(res.stdout.split())
    assert verdict.count("Memory verdict") == 1  # one verdict row, on the unprofiled peak
    assert "allocator peaks not compared" in res.stdout  # TF's large tensors vs torch's net
    doc = json.loads(run_cli("diff", a, b, "--format", "json").stdout)
    rows = {r["metric"]: r for r in doc["memory"]}
    ta, tb = load(a), load(b)
    pa = memory_part(ta).ranks["peak_rss_bytes"].iloc[0]
    pb = memory_part(tb).ranks["peak_rss_bytes"].iloc[0]
    assert rows["peak_rss"]["a_bytes"] == pa and rows["peak_rss"]["b_bytes"] == pb
    assert rows["peak_rss"]["ratio"] == pytest.approx(pa / pb)
    assert rows["peak_allocated"]["ratio"] is None
    assert "peak_forward" in rows  # both resident: phases compared
    csv = run_cli("diff", a, b, "--format", "csv").stdout
    assert "memory,peak_rss," in csv


def test_perfetto_export_has_a_counter_track_per_series(tmp_path):
    needs("perfetto")
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PTrace
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    out = tmp_path / "x.pftrace"
    assert run_cli("export", str(MEMORY / "torch-lenet5"), "--to", "perfetto", "-o",
                   str(out)).returncode == 0
    pt = PTrace()
    pt.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor.name for p in pt.packet
              if p.HasField("track_descriptor") and p.track_descriptor.HasField("counter")}
    assert sorted(tracks.values()) == ["memory allocated cpu", "memory hwm cpu",
                                       "memory rss cpu"]
    values = [p.track_event.counter_value for p in pt.packet
              if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_COUNTER]
    assert values and max(values) > 100 * 2**20


# ------------------------------------------------------------------ live runs (slow)


def native_dir(trace: Path) -> Path:
    return trace.with_name(trace.name.removesuffix(".trace") + ".native")


def record(tmp: Path, fw: str, *extra: str, env: dict[str, str] | None = None,
           steps: int = 2) -> tuple[Path, dict]:
    out = tmp / f"{fw}.trace"
    res = run_cli("record", "--fw", fw, "--model", "lenet5", "--steps", str(steps), "--warmup", "1",
                  "--timing-steps", "1", "-o", str(out), "--format", "json", *extra, cwd=tmp,
                  env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return out, json.loads(res.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("fw,extra", [("torch", ["--batch-size", "32"]),
                                      ("mxnet", ["--batch-size", "32"]),
                                      ("tf", ["--batch-size", "64"])])
def test_record_measures_memory_on_every_framework(tmp_path, fw, extra):
    # LeNet-5's profiled steps take ~10-40 ms: sample every 5 ms over twelve of them so that
    # some samples land in them even when the sampler waits for a core on a loaded machine (two
    # steps of batch 8 once got none: every phase's peak was null; four of TF's, 52 ms in all,
    # once fell in one 62 ms stall of the sampling thread at load 4).
    # TensorFlow traces its CPU allocations only with oneDNN, on by default only on some x86
    # CPUs: switched on here so that the allocator figure is there on any CPU
    env = {"TF_ENABLE_ONEDNN_OPTS": "1"} if fw == "tf" else None
    steps = 12
    out, rep = record(tmp_path, fw, *extra, "--memory-interval", "0.005", env=env, steps=steps)
    (mem,) = rep["memory"]
    params = 62006 * 4
    assert mem["param_bytes"] == params
    # sampled from outside: the peak agrees with the kernel's own high-water mark
    files = sample_files(native_dir(out))
    assert files
    for path in files:
        head, df = sampled.read(path)
        peak, hwm = df["rss_bytes"].max(), df["hwm_bytes"].iloc[-1]
        assert abs(peak - hwm) <= 0.05 * hwm, (path, head, peak, hwm)
    # parameters + gradients fit: in the allocator where it counts everything (TF: its large
    # tensors, since the process started), in the resident set where the allocator counts
    # only what the profiled steps allocated (torch's and MXNet's on a CPU)
    assert mem["peak_rss_bytes"] >= 2 * params
    assert mem["peak_allocated_bytes"] is not None
    if fw == "tf":
        assert mem["peak_allocated_bytes"] >= 2 * params
    if fw == "torch":
        # zero_grad frees the gradients and backward allocates them again in every step
        assert mem["peak_allocated_bytes"] >= params
        doc = json.loads((native_dir(out) / "rank0.pt.trace.json").read_text())
        totals = [e["args"]["Total Allocated"] for e in doc["traceEvents"]
                  if e.get("name") == "[memory]"]
        assert mem["peak_allocated_bytes"] == max(totals)
    assert mem["peak_step"] in (*range(steps + 1), None)  # step numbers as the trace has them
    assert any(v is not None for v in mem["by_phase"].values())


@pytest.mark.slow
def test_tf_without_onednn_says_why_it_has_no_allocator_figure(tmp_path):
    out, rep = record(tmp_path, "tf", "--batch-size", "64",
                      env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    (mem,) = rep["memory"]
    assert mem["peak_rss_bytes"] > 0 and mem["peak_allocated_bytes"] is None
    assert TraceFile(out).meta["onednn"] is False
    res = run_cli("report", str(out), "--by", "memory", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "oneDNN, off in this run (TF_ENABLE_ONEDNN_OPTS=1 turns it on)" in " ".join(
        res.stdout.split())


@pytest.mark.slow
def test_no_profile_memory_records_no_allocator(tmp_path):
    _, rep = record(tmp_path, "torch", "--batch-size", "8", "--no-profile-memory",
                    "--memory-interval", "0")
    assert rep["memory"] == []
    _, rep = record(tmp_path, "mxnet", "--batch-size", "8", "--no-profile-memory")
    (mem,) = rep["memory"]
    assert mem["peak_allocated_bytes"] is None and mem["peak_rss_bytes"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("fw", ["torch", "mxnet", "tf"])
def test_a_memory_spike_lands_in_its_step_and_its_forward_phase(tmp_path, fw):
    """A user's script under `opprof run` fills 400 MiB at a known moment of one step, just
    before its forward pass: the sampled peak is in that window, in the step whose bounds
    (the framework profiler's clock) hold the window, and in the forward phase."""
    window = tmp_path / "window.json"
    res = run_cli("run", "--warmup", "1", "--timing-steps", "1", "--steps", "3",
                  "-o", str(tmp_path / "run.trace"), "--format", "json", "--",
                  sys.executable, str(REPO / "tests" / "scripts" / "memory_spike.py"),
                  "--fw", fw, "--steps", "7", "--spike-at", "3", "--window", str(window),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    w = json.loads(window.read_text())
    trace = load(tmp_path / "run.trace")
    m = memory_rows(trace)
    rss = m[(m["name"] == "rss") & (m["rank"] == 0)]
    peak = rss.loc[rss["bytes"].idxmax()]
    assert w["start_ns"] <= peak["ts"] <= w["end_ns"] + 25_000_000
    b = trace.step_bounds()
    mid = (w["start_ns"] + w["end_ns"]) // 2
    holding = b[(b["start"] <= mid) & (b["end"] > mid)]
    assert len(holding) == 1, (b, w)
    assert peak["step"] == holding["step"].iloc[0]
    # The spike's samples fall in the gap before the forward operators: forward. On a loaded
    # host one sample may meet the previous step's last update operators, still running on
    # TF's inter-op threads; the phase most of the spike's samples are in is forward.
    high = rss[(rss["ts"] >= w["start_ns"]) & (rss["ts"] <= w["end_ns"])
               & (rss["bytes"] >= rss["bytes"].min() + 300 * 2**20)]
    assert high["phase"].astype(str).value_counts().idxmax() == "forward", high
    (mem,) = json.loads(res.stdout)["memory"]
    assert mem["peak_step"] == int(peak["step"])
    assert mem["by_phase"]["forward"] >= rss["bytes"].min() + 300 * 2**20
    assert mem["peak_rss_bytes"] - rss["bytes"].min() >= 300 * 2**20


@pytest.mark.slow
def test_bench_tables_carry_peak_memory_and_its_ratio(tmp_path):
    res = run_cli("bench", "--fw", "torch,mxnet", "--model", "lenet5", "--workers", "1",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "1", "--batch-size", "8",
                  "-o", str(tmp_path / "bench"), cwd=tmp_path, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "profiled mem" in res.stdout and "mem/leanest" in res.stdout
    runs = json.loads((tmp_path / "bench" / "bench.json").read_text())["runs"]
    assert all(r["peak_rss_bytes"] >= r["unprofiled_rss_bytes"] * 0.9 for r in runs)
    peaks = [r["unprofiled_rss_bytes"] for r in runs]
    assert all(p and p > 50 * 2**20 for p in peaks)
    ratios = [r["rss_ratio"] for r in runs]
    assert min(ratios) == 1.0
    assert max(ratios) == pytest.approx(max(peaks) / min(peaks))
    for r in runs:
        trace = load(tmp_path / "bench" / f"lenet5-{r['fw']}-w1-single.trace")
        mem = memory_part(trace).ranks
        assert r["peak_rss_bytes"] == mem["peak_rss_bytes"].max()
        assert r["unprofiled_rss_bytes"] == mem["unprofiled_rss_bytes"].max()


def test_sampling_thread_stops_and_leaves_no_process():
    sampler = Sampler(Path("/nonexistent"), lambda: [], lambda: [], interval_s=0.005)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler._thread is None and sampler.ticks >= 2
