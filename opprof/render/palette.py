"""One colour per phase (and per device category, memory series and run), shared by the HTML
report (plotly) and the paper figures (matplotlib), so a phase looks the same everywhere.

Colours are the Okabe–Ito palette (distinguishable with the common colour-vision deficiencies
and in greyscale by lightness), with grey for ``other`` and light grey for idle time.
"""

from __future__ import annotations

from opprof.taxonomy import PHASES

PHASE_COLORS: dict[str, str] = {
    "load": "#56B4E9",      # sky blue
    "h2d": "#0072B2",       # blue
    "forward": "#009E73",   # bluish green
    "backward": "#E69F00",  # orange
    "update": "#CC79A7",    # reddish purple
    "comm": "#D55E00",      # vermillion
    "other": "#999999",     # grey
}
assert tuple(PHASE_COLORS) == PHASES

#: GPU time per device (opprof.analysis.devices): compute, communication, copies, idle.
DEVICE_COLORS: dict[str, str] = {
    "compute": "#009E73", "comm": "#D55E00", "memcpy": "#0072B2", "idle": "#DDDDDD",
}
#: Memory bars: resident peak, resident before profiling, allocator, parameters.
MEMORY_COLORS: dict[str, str] = {
    "peak resident": "#0072B2", "resident before profiling": "#56B4E9",
    "job resident (all processes)": "#003F63",
    "allocator allocated": "#E69F00", "allocator reserved": "#F5C266", "parameters": "#CC79A7",
}
#: Runs, frameworks and traces compared side by side (lines, grouped bars).
SERIES: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                           "#000000", "#999999")
FRAMEWORK_COLORS: dict[str, str] = {"torch": "#D55E00", "tf": "#E69F00", "mxnet": "#0072B2",
                                    "jax": "#009E73", "chainer": "#CC79A7"}
#: Diff waterfall: a part that makes A slower, one that makes it faster, and the totals.
SLOWER, FASTER, TOTAL = "#D55E00", "#009E73", "#555555"
#: Sequential colour scale (low → high) for heatmaps.
HEAT: tuple[str, ...] = ("#F7FBFF", "#C6DBEF", "#6BAED6", "#2171B5", "#08306B")
#: Straggler marker on the rank × step heatmap.
STRAGGLER = "#D55E00"
FONT_FAMILY = "DejaVu Sans, Helvetica, Arial, sans-serif"


def series_color(i: int) -> str:
    """The i-th colour of SERIES (cycling)."""
    return SERIES[i % len(SERIES)]


def framework_color(fw: str, i: int = 0) -> str:
    """A framework's colour (torch, tf, mxnet), else the i-th series colour."""
    return FRAMEWORK_COLORS.get(fw, series_color(i))
