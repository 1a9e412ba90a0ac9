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
