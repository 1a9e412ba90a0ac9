"""The .trace file: Parquet round trip, columns, metadata, atomic writes, rejection of others."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opprof import OpprofError, load, save
from opprof.trace import COLUMNS, FORMAT_VERSION, META_KEY
from tests.conftest import shared_trace


@pytest.fixture(scope="module")
def trace():
    return load(shared_trace("amd-mi250-toy-train.json.gz"))


def test_round_trip_keeps_events_and_meta(trace, tmp_path) -> None:
    out = save(trace, tmp_path / "run.trace")
    back = load(out)
    pd.testing.assert_frame_equal(back.events, trace.events)
    assert back.meta["format_version"] == FORMAT_VERSION
    assert back.meta["step_bounds"] == trace.meta["step_bounds"]
    assert list(back.events.columns) == list(COLUMNS)


def test_file_is_parquet_with_dictionary_names_and_json_meta(trace, tmp_path) -> None:
    out = save(trace, tmp_path / "run.trace")
    schema = pq.read_schema(out)
    assert pa.types.is_dictionary(schema.field("name").type)
    assert schema.field("ts").type == pa.int64()
    meta = json.loads(schema.metadata[META_KEY])
    assert meta["source_formats"] == ["kineto"]


def test_write_is_atomic_and_leaves_no_temporary_files(trace, tmp_path) -> None:
    save(trace, tmp_path / "a.trace")
    assert [p.name for p in tmp_path.iterdir()] == ["a.trace"]
    bad = trace.events.drop(columns=["op"])
    with pytest.raises(ValueError):
        save(type(trace)(bad, trace.meta), tmp_path / "b.trace")
    assert [p.name for p in tmp_path.iterdir()] == ["a.trace"]


def test_foreign_parquet_is_rejected_by_name(tmp_path) -> None:
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), path)
    with pytest.raises(OpprofError, match="not an opprof trace"):
        load(path)


def test_newer_format_is_rejected(trace, tmp_path) -> None:
    tr = type(trace)(trace.events, {**trace.meta, "format_version": FORMAT_VERSION + 1})
    out = save(tr, tmp_path / "new.trace")
    with pytest.raises(OpprofError, match="newer"):
        load(out)


def test_every_writer_stamps_version_command_and_format(tmp_path) -> None:
    """`opprof import` (and the merge of two hosts' files) write the same stamp as `record`:
    the opprof version, the command that wrote the file and the format version."""
    from opprof import __version__
    from tests.conftest import FIXTURES, run_cli

    rank0 = FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank0.pt.trace.json.gz"
    rank1 = FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank1.pt.trace.json.gz"
    for i, rank in enumerate((rank0, rank1)):
        res = run_cli("import", str(rank), "-o", str(tmp_path / f"h{i}.trace"))
        assert res.returncode == 0, res.stderr
    res = run_cli("import", str(tmp_path / "h0.trace"), str(tmp_path / "h1.trace"), "-o",
                  str(tmp_path / "job.trace"))
    assert res.returncode == 0, res.stderr
    for name in ("h0", "job"):
        meta = json.loads(pq.read_schema(tmp_path / f"{name}.trace").metadata[META_KEY])
        assert meta["opprof_version"] == __version__
        assert meta["format_version"] == FORMAT_VERSION
        assert meta["opprof_command"].startswith("opprof import ")
        assert meta["opprof_command"].endswith(f"-o {tmp_path / (name + '.trace')}")


def test_meta_is_typed_and_keeps_unknown_keys(trace, tmp_path) -> None:
    """Read back, the metadata's fields are typed; a key opprof has no field for, and a
    value of the wrong type for its field, are kept as they were stored."""
    from opprof.kinds import Framework, Mode
    from opprof.meta import TraceMeta

    meta = {**trace.meta, "mode": "fsdp", "framework": "torch", "a_future_key": {"x": [1]},
            "workers": "two"}
    back = load(save(type(trace)(trace.events, meta), tmp_path / "typed.trace")).meta
    assert isinstance(back, TraceMeta)
    assert back.mode is Mode.FSDP and back.framework is Framework.TORCH
    assert back.step_bounds == trace.meta["step_bounds"] and back.steps == len(back.step_bounds)
    assert back["a_future_key"] == {"x": [1]} and back.get("a_future_key") == {"x": [1]}
    assert back["workers"] == "two" and "workers" in back.extra
    stored = json.loads(pq.read_schema(tmp_path / "typed.trace").metadata[META_KEY])
    assert stored["a_future_key"] == {"x": [1]} and stored["workers"] == "two"
    assert stored["mode"] == "fsdp"
    # the mapping view behaves as the dict it replaces, keys kept in the order given
    meta = TraceMeta.of({"mode": "zero", "kvstore": "dist_sync", "workers": 2})
    assert list(meta) == ["mode", "kvstore", "workers"] and len(meta) == 3
    assert meta.pop("kvstore") == "dist_sync" and meta.pop("kvstore", None) is None
    meta.update({"batch_size": 8}, dataset="cifar10")
    assert meta.setdefault("workers", 5) == 2 and meta.batch_size == 8
    assert {**meta} == {"mode": "zero", "workers": 2, "batch_size": 8, "dataset": "cifar10"}
