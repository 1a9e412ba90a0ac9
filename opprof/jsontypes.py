"""JSON values as types: what opprof writes as JSON and reads back (``--format json``,
bench.json, net.json, a `.trace`'s metadata), so that the type checker sees a document holds
only what JSON holds. Standard library only; names for annotations, nothing at run time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

#: A JSON scalar (``json.dumps`` writes a float that is not finite as ``NaN``/``Infinity``).
JSONScalar: TypeAlias = "str | int | float | bool | None"
#: Any JSON value: a scalar, an array or an object (read-only views, so a ``dict[str, int]``
#: or a ``list[float]`` is one).
JSON: TypeAlias = "JSONScalar | Sequence[JSON] | Mapping[str, JSON]"
#: A JSON object as it is built: keys to values.
JSONObject: TypeAlias = "dict[str, JSON]"
