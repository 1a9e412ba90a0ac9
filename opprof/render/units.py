"""One unit system for every renderer: bytes in binary units (KiB, MiB, GiB), rates in decimal
ones (MB/s, GB/s), every ratio printed with what it divides."""

from __future__ import annotations

import math

_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_DECIMAL_RATE = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"))


def _missing(x: object) -> bool:
    if x is None:
        return True
    try:
        return math.isnan(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def size(n: float | None, zero: str = "0 B") -> str:
    """Bytes in the largest binary unit they reach ("1.00 MiB", "64.0 KiB", "512 B")."""
    if _missing(n):
        return "-"
    n = float(n)  # type: ignore[arg-type]
    if n == 0:
        return zero
    for scale, unit in _BINARY:
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.2f} {unit}" if abs(v) < 10 else f"{v:,.1f} {unit}"
    return f"{n:,.0f} B"


def mib(n: float | None) -> str:
    """Bytes as MiB (GiB from 10 GiB), the unit of memory tables; '-' for none."""
    if _missing(n):
        return "-"
    n = float(n)  # type: ignore[arg-type]
    if abs(n) >= 10 * 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.1f} MiB"


def rate(bps: float | None) -> str:
    """Bytes per second in decimal units (MB/s, GB/s), as networks are rated."""
    if _missing(bps) or not bps:
        return "-"
    bps = float(bps)
    if math.isinf(bps):
        return "unlimited"
    for scale, unit in _DECIMAL_RATE:
        if abs(bps) >= scale:
            return f"{bps / scale:,.2f} {unit}"
    return f"{bps:,.0f} B/s"


def ratio(x: float | None, what: str = "") -> str:
    """A factor with what it divides: ``ratio(1.05, "profiled/unprofiled")`` →
    "profiled/unprofiled 1.05x"; '-' when undefined."""
    if _missing(x) or math.isinf(float(x)):  # type: ignore[arg-type]
        return "-"
    text = _factor(float(x))  # type: ignore[arg-type]
    return f"{what} {text}" if what else text


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds with thousands separators ("1,234.567"); '-' for none."""
    if _missing(ns):
        return "-"
    return f"{float(ns) / 1e6:,.3f}"  # type: ignore[arg-type]


def ab_ratio(a: float | None, b: float | None) -> str:
    """A/B of two measures for a diff cell: "1.93x", "only in A", "only in B", or '-' when
    neither has it (never "0.00x" or "∞")."""
    a = 0.0 if _missing(a) else float(a)  # type: ignore[arg-type]
    b = 0.0 if _missing(b) else float(b)  # type: ignore[arg-type]
    if a and not b:
        return "only in A"
    if b and not a:
        return "only in B"
    if not a and not b:
        return "-"
    return _factor(a / b)


def _factor(x: float) -> str:
    """"1.93x"; two significant digits below 0.1 ("0.0029x"), so no factor reads 0.00x."""
    return f"{x:.2f}x" if abs(x) >= 0.1 or x == 0 else f"{x:.2g}x"


_DECIMAL = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def flop(n: float | None, unit: str = "FLOP") -> str:
    """A count of FLOPs in decimal units ("1.36 GFLOP"; ``unit`` "FLOP/s" for a rate)."""
    if _missing(n):
        return "-"
    n = float(n)  # type: ignore[arg-type]
    for scale, prefix in _DECIMAL:
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.2f} {prefix}{unit}" if abs(v) < 100 else f"{v:,.0f} {prefix}{unit}"
    return f"{n:,.0f} {unit}"


def flops_rate(n: float | None) -> str:
    """FLOP/s in decimal units ("4.48 TFLOP/s")."""
    return flop(n, "FLOP/s")


def share(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage ("3.1%"; "0.04%" for small ones); '-' for none."""
    if _missing(x) or math.isinf(float(x)):  # type: ignore[arg-type]
        return "-"
    v = float(x) * 100  # type: ignore[arg-type]
    if v and abs(v) < 0.1:
        return f"{v:.2g}%"
    return f"{v:.{digits}f}%"
