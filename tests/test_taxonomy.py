"""Every row of every mapping table classifies its own example; the tables are valid data."""

from __future__ import annotations

from importlib import resources

import pytest

from opprof.taxonomy import CANONICAL_OPS, PHASES, mapping_table

TABLES = sorted(
    p.name.removesuffix(".csv")
    for p in resources.files("opprof.normalizers").joinpath("maps").iterdir()
    if p.name.endswith(".csv")
)
ROWS = [(t, i, row) for t in TABLES for i, row in enumerate(mapping_table(t).rows)]


def test_every_format_has_a_table() -> None:
    assert "kineto" in TABLES


@pytest.mark.parametrize(("table", "index", "row"), ROWS,
                         ids=[f"{t}:{i}:{r.example}" for t, i, r in ROWS])
def test_row_classifies_its_example(table: str, index: int, row) -> None:
    tab = mapping_table(table)
    assert row.example, f"{table} row {index} has no example"
    assert tab.lookup(row.example) is row, (
        f"{row.example!r} is taken by an earlier row: {tab.lookup(row.example)}")
    got = tab.classify([row.example]).loc[row.example]
    assert got["op"] == row.op and got["phase"] == row.phase and got["row"] == index


def test_tables_use_only_canonical_names() -> None:
    for t in TABLES:
        for row in mapping_table(t).rows:
            assert row.op in CANONICAL_OPS or row.op == ""
            assert row.phase in PHASES or row.phase == ""


def test_unknown_names_are_other() -> None:
    got = mapping_table("kineto").classify(["my_custom_op", "aten::conv2d"])
    assert got.loc["my_custom_op", "op"] == "other"
    assert got.loc["my_custom_op", "row"] == -1
    assert got.loc["aten::conv2d", "op"] == "convolution"


def test_canonical_ops_have_backward_twins() -> None:
    for op in ("convolution", "batch_norm", "fully_connected", "activation", "pooling", "loss"):
        assert f"{op}_backward" in CANONICAL_OPS
    assert {"weights_update", "comm", "data_load", "h2d", "other"} <= set(CANONICAL_OPS)


def test_docs_list_every_mapping_table_as_shipped() -> None:
    from opprof.taxonomy import tables_markdown
    from tests.conftest import REPO

    doc = (REPO / "docs" / "taxonomy.md").read_text()
    assert doc == tables_markdown(), "regenerate: python docs/make_taxonomy.py"


def test_a_bad_pattern_is_one_error_naming_its_row() -> None:
    """The patterns are compiled once, as the table's combined pattern; a bad one is still
    named by its row."""
    from opprof.errors import OpprofError
    from opprof.taxonomy import parse_table

    head = "pattern,op,phase,kind,example\n"
    good = parse_table("t", head + "aten::conv2d,convolution,forward,,aten::conv2d\n")
    assert good.classify(["aten::conv2d", "x"])["op"].tolist() == ["convolution", "other"]
    with pytest.raises(OpprofError, match=r"mapping table t row 3: bad pattern '\(aten'"):
        parse_table("t", head + "aten::relu,activation,forward,,aten::relu\n"
                    "(aten,convolution,forward,,aten::conv2d\n")
    with pytest.raises(OpprofError, match="mapping table t: its patterns do not combine"):
        parse_table("t", head + "(?P<a>x),activation,forward,,x\n(?P<a>y),activation,forward,"
                    ",y\n")
