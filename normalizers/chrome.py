"""Chrome-trace JSON (Kineto, MXNet): read, decompress and decode into columns, fast and safe.

Decoding is msgspec's typed decoder (chosen by measurement, ``benchmarks/bench_decode.py``):
each format declares the fields it uses as a ``msgspec.Struct`` and every other field is
skipped without building a Python object, which decodes a Kineto trace about 6x faster than
``json.loads`` and 4x faster than orjson, which both build every dict. Columns are then
taken from the structs with ``operator.attrgetter`` (one C call per event) and converted to
numpy once per column: no per-event Python dict is ever made.

Hostile input is one :class:`~opprof.errors.OpprofError` line naming the file: damaged gzip,
malformed or truncated JSON, a wrong type where the format needs a value, and nesting deeper
than Python's recursion limit (which msgspec, like ``json``, reports as a RecursionError).
Memory is bounded before it is spent: a file (or its gunzipped text) larger than a third of
the memory available is refused (decoding needs several times the text), and so is a gzip
stream that inflates more than :data:`MAX_INFLATE_RATIO` times its size past its first
64 MiB (a decompression bomb; real traces compress 5-30x). Gzip is inflated in chunks, so a
bomb is stopped after one chunk over the limit, not after filling memory.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import attrgetter, is_
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from opprof.errors import ErrorKind, OpprofError
from opprof.gunzip import GZIP_MAGIC, gib, gunzip, memory_budget

if TYPE_CHECKING:
    import pandas as pd

    from opprof.preread import Ahead

_UTF8_BOM = b"\xef\xbb\xbf"


def read_bytes(path: Path, head: bytes, ahead: Ahead | None = None) -> bytes | bytearray:
    """The file's bytes, gunzipped when it is gzip (then a bytearray: filled in place, see
    :func:`opprof.gunzip.gunzip`; the text already inflating when ``ahead`` holds it); damaged
    data, or more than memory can hold (see the module docstring), is a clear error."""
    if head.startswith(b"SQLite format 3\x00"):  # no format claimed it (nsys, nvprof)
        from opprof.normalizers.cupti import sqlite_tables

        shown = ", ".join(sorted(sqlite_tables(path))[:6])
        raise OpprofError(f"{path}: a SQLite file but not an nsys or nvprof export ("
                          + (f"tables: {shown})" if shown else "unreadable or empty)"))
    text = ahead.text(path) if ahead is not None and head.startswith(GZIP_MAGIC) else None
    data: bytes | bytearray | None = text.text() if text is not None else None
    if data is None:
        budget = memory_budget()
        try:
            size = path.stat().st_size
            if size > budget and not head.startswith(GZIP_MAGIC):
                raise OpprofError(f"{gib(size)} of JSON is more than this machine "
                                  f"can decode now ({gib(budget)}: a third of the memory "
                                  "available)", path=path, kind=ErrorKind.TOO_LARGE)
            raw = path.read_bytes()
        except OSError as exc:
            raise OpprofError(f"cannot read ({exc.strerror or exc})",
                              path=path, kind=ErrorKind.UNREADABLE) from None
        data = gunzip(raw, path, budget) if head.startswith(GZIP_MAGIC) else raw
    if data.startswith(_UTF8_BOM):  # written by some Windows tools; JSON has no BOM
        if isinstance(data, bytearray):
            del data[:len(_UTF8_BOM)]  # in place: no copy of the text
        else:
            data = data[len(_UTF8_BOM):]
    if not data or data.isspace():  # (not strip(): a copy of the whole text)
        raise OpprofError("file is empty", path=path, kind=ErrorKind.EMPTY)
    return repair_utf8(data)


class Repaired(bytearray):
    """JSON text whose bytes that were not UTF-8 are replaced by :data:`INVALID` (one per
    byte, so nothing moves); ``invalid_utf8`` counts them. msgspec skips an object key it
    does not know without checking its bytes, so a flipped byte in a key would otherwise
    lose that field without a word: the readers drop and count the events holding one."""

    invalid_utf8 = 0


#: What a byte that is not UTF-8 becomes (DEL: valid in JSON strings, never in a real name).
INVALID = 0x7F
#: None as a 0-d object array, for ``np.where(mask, values, NONE)``: an object array with None
#: where the mask is False.
NONE = np.array(None, dtype=object)
_UTF8_PIECE = 1 << 20


def repair_utf8(data: bytes | bytearray) -> bytes | bytearray:
    """``data`` when it is UTF-8 (checked at memory speed when it is ASCII, in pieces
    otherwise: no copy of the whole text); else a :class:`Repaired` copy."""
    if data.isascii():
        return data
    import codecs

    view = memoryview(data)
    bad: list[tuple[int, int]] = []
    pos, n = 0, len(data)
    while pos < n:
        piece = view[pos:pos + _UTF8_PIECE]
        final = pos + len(piece) >= n
        try:
            _, used = codecs.utf_8_decode(piece, "strict", final)
        except UnicodeDecodeError as exc:
            bad.append((pos + exc.start, pos + exc.end))
            pos += exc.end
            continue
        if used == 0:  # a sequence cut at the piece's end that cannot complete
            bad.append((pos, pos + 1))
            used = 1
        pos += used
    view.release()
    if not bad:
        return data
    out = data if isinstance(data, Repaired) else Repaired(data)
    for a, b in bad:
        out[a:b] = bytes([INVALID]) * (b - a)
    out.invalid_utf8 = sum(b - a for a, b in bad)
    return out


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: decoded JSON has no cycles, and collecting while
    hundreds of thousands of objects are made is pure waste."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def decode(data: bytes | bytearray, path: Path, decoder: msgspec.json.Decoder, what: str) -> Any:
    """Typed decode; every failure is one OpprofError line naming the file."""
    try:
        with no_gc():
            return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise OpprofError(f"not a valid {what} ({exc})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise OpprofError(f"truncated JSON and not an opprof trace ({text})",
                              path=path, kind=ErrorKind.NOT_A_TRACE) from None
        if data.lstrip()[:1] in (b"{", b"["):
            raise OpprofError(f"malformed JSON ({text})",
                              path=path, kind=ErrorKind.DAMAGED) from None
        raise OpprofError(f"not JSON and not an opprof trace ({text})",
                          path=path, kind=ErrorKind.NOT_A_TRACE) from None
    except RecursionError:
        raise OpprofError("JSON nested too deeply to be a trace",
                          path=path, kind=ErrorKind.DAMAGED) from None
    except UnicodeDecodeError as exc:
        raise OpprofError(f"JSON with text that is not UTF-8 ({exc.reason} at byte "
                          f"{exc.start})", path=path, kind=ErrorKind.DAMAGED) from None


def describe(data: bytes | bytearray) -> str:
    """What a JSON document's top level is, for 'not a known format' errors."""
    try:
        with no_gc():
            top = msgspec.json.decode(data, type=dict[str, msgspec.Raw] | list[msgspec.Raw]
                                      | str | int | float | bool | None)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return "unreadable top level"
    if isinstance(top, dict):
        return f"top-level keys: {', '.join(list(top)[:5]) or 'none'}"
    kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
    return f"top level is a JSON {kind.get(type(top), 'null')}"


def columns(items: Sequence[Any], fields: Sequence[str]) -> list[list]:
    """The named attributes of every struct as one tuple per field (columns)."""
    return [list(map(attrgetter(f), items)) for f in fields]


def _as_objects(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of the values (lists stay elements, never a second dimension)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values) if not isinstance(values, list) else values
    return arr


def _number(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            return np.nan
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return np.nan
    return np.nan


_PLAIN_TYPES = frozenset({int, float, type(None)})


def numbers(values: Sequence[Any], fill: float = np.nan) -> np.ndarray:
    """A column of JSON numbers as float64; anything else (missing, strings, objects) is
    ``fill``. Numeric strings are read as numbers, as ``pd.to_numeric`` does.

    ``np.fromiter`` converts each value as ``np.array`` does (None is NaN, numeric text is
    read), stops at the first value it cannot take (a list, other text) without scanning
    the rest, and builds no nested array."""
    n = len(values)
    try:
        out = np.fromiter(values, np.float64, n)
    except (TypeError, ValueError, OverflowError):
        # a few odd values (Kineto's "Spans" pid): convert those alone, the rest at once;
        # they are found by their type in C (map), not by a Python loop over every value
        fixed = list(values)
        plain = np.fromiter(map(_PLAIN_TYPES.__contains__, map(type, fixed)), bool, n)
        for i in np.flatnonzero(~plain).tolist():
            fixed[i] = _number(fixed[i])
        try:
            out = np.fromiter(fixed, np.float64, n)
        except OverflowError:  # integers beyond float64
            out = np.array([_number(v) for v in fixed], dtype=np.float64)
    if not np.isnan(fill):
        out[np.isnan(out)] = fill
    return out


def number_column(items: Sequence[Any], field: str, fill: float = np.nan,
                  strict: bool = False) -> np.ndarray:
    """``numbers`` of one field of every struct, read straight into float64 (no list in
    between) when every value is a number or None; else as :func:`numbers` reads it.
    ``strict``: JSON ``true``/``false`` are no numbers (NaN, so the reader drops them).
    """
    try:
        out = np.fromiter(map(attrgetter(field), items), np.float64, len(items))
    except (TypeError, ValueError, OverflowError):
        out = numbers(list(map(attrgetter(field), items)))
    if strict and bool in set(map(type, map(attrgetter(field), items))):
        out[np.fromiter(map(is_, map(type, map(attrgetter(field), items)), repeat(bool)),
                        bool, len(items))] = np.nan
    if not np.isnan(fill):
        out[np.isnan(out)] = fill
    return out


def integers(values: Sequence[Any], fill: int = -1) -> np.ndarray:
    """A column of JSON integers as int64 (exact, unlike a trip through float64); anything
    else (missing, text, fractions rounded toward zero as pandas does) is ``fill``."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    out = numbers(values)
    bad = ~np.isfinite(out) | (np.abs(out) >= 2.0**63)
    out[bad] = fill
    return out.astype(np.int64)


def strings(values: Sequence[Any], missing: str = "") -> pd.Categorical:
    """A column of names as a Categorical with sorted string categories: factorized once,
    converted to text once per distinct value (non-strings as ``str`` does; None → missing)."""
    import pandas as pd

    codes, text = string_codes(values, missing)
    cats = sorted(set(text))
    pos = {t: i for i, t in enumerate(cats)}
    remap = np.array([pos[t] for t in text], dtype=np.int64)
    return pd.Categorical.from_codes(remap[codes] if len(codes) else codes,
                                     categories=pd.Index(cats, dtype=object))


def string_codes(values: Sequence[Any], missing: str = "") -> tuple[np.ndarray, list[str]]:
    """(codes, distinct text) of a column of names, as :func:`strings` reads them but
    unsorted and with no pandas object made (what a reader keeps per chunk, joined once)."""
    fast = _text_codes(values)
    if fast is not None:
        codes, text = fast
    else:
        import pandas as pd  # (the reading half of a reader runs without pandas otherwise)

        arr = _as_objects(values)
        try:
            codes, uniq = pd.factorize(arr, use_na_sentinel=True)
        except TypeError:  # unhashable values (lists, objects) in a name field: their text
            codes, uniq = pd.factorize(np.array([v if v is None else str(v) for v in arr],
                                                dtype=object), use_na_sentinel=True)
        text = [u if type(u) is str else str(u) for u in uniq]
    if (codes < 0).any():
        text.append(missing)
        codes = np.where(codes < 0, len(text) - 1, codes)
    return codes, text


def _text_codes(values: Sequence[Any]) -> tuple[np.ndarray, list[str]] | None:
    """Codes (in order of first appearance) and distinct values of a column that is text
    only — what ``pd.factorize`` gives there, with a dict (hashing in C, no object array,
    no type inference); None when any value is not a ``str`` (missing, numbers, lists:
    :func:`strings` factorizes those as pandas does)."""
    try:
        first = dict.fromkeys(values)
    except TypeError:  # unhashable
        return None
    text = list(first)
    if not all(type(u) is str for u in text):
        return None
    index = {u: i for i, u in enumerate(text)}
    codes = np.fromiter(map(index.__getitem__, values), np.intp, len(values))
    return codes, text
