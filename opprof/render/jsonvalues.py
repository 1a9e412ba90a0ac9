"""JSON-safe values: NaN as null, infinities as text, numpy scalars as Python ones (the JSON
formats' cells, :mod:`.jsonfmt` and the sections that render their own JSON)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject


def clean(v: Any) -> Any:
    """``v`` as a JSON-safe value."""
    if v is pd.NA:
        return None
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if hasattr(v, "item"):
        return clean(v.item())
    return v


def records(df: pd.DataFrame) -> list[JSONObject]:
    """DataFrame rows as JSON-safe dicts."""
    return [{k: clean(v) for k, v in row.items()} for row in df.to_dict("records")]
