"""The HTML report: one self-contained file (plotly.js, styles and scripts inlined; no CDN, no

request when it opens) for `report`, `diff` and `bench`, with plotly charts and sortable
tables.

Charts are drawn from aggregates only (opprof.render.plotdata: per-step phase rows, operator
tables, rank × step matrices, per-device and per-rank rows), never from events, so the file's
size is plotly.js (~4.6 MB) plus a few kB per step, rank and operator, whatever the trace's
event count. The raw timeline is what ``opprof export --to perfetto`` is for. Colours come
from opprof.render.palette (the same as the paper figures).

Charts are plain plotly.js specs (:class:`Fig`: trace dicts and a layout dict), never
``plotly.graph_objects`` figures, whose property validation cost tens of ms a chart (a fifth
of a second for the first); plotly.io only writes the div and its script.

Each function returns the page as a string: ``report(rep, by, top)``, ``diff(d, top)``,
``bench(b)``. ``by`` does not change the page (every view is in it).
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import html
import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, TypeAlias

import numpy as np
import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from opprof.analysis.report import Report
from opprof.render import palette, plotdata, units, verdicts
from opprof.render.plotdata import MS
from opprof.render.views import PAGE_VIEWS
from opprof.taxonomy import PHASES
from opprof.version import __version__

if TYPE_CHECKING:
    from opprof.advice.base import Advisory
    from opprof.analysis.diff import Diff
    from opprof.analysis.matrix import Bench
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: The views this format renders (a report and a diff: no model views) and its file type.
VIEWS = PAGE_VIEWS
EXTENSION = ".html"

#: Rows of the operator bar chart when --top is not given (the table has every operator).
DEFAULT_TOP = 20
#: The id of the element the page's error handler adds when a script fails (tests look
#: for it).
ERROR_ID = "opprof-script-error"
_CONFIG = {"displaylogo": False, "responsive": True,
           "toImageButtonOptions": {"format": "svg", "scale": 1}}

# --- page ---------------------------------------------------------------------------------

_ONERROR = f"""window.opprofErrors = [];
function opprofError(msg) {{
  window.opprofErrors.push(String(msg));
  var e = document.getElementById('{ERROR_ID}');
  if (!e) {{ e = document.createElement('pre'); e.id = '{ERROR_ID}';
            document.documentElement.appendChild(e); }}
  e.textContent += String(msg) + '\\n';
}}
window.addEventListener('error', function (ev) {{ opprofError(ev.message || 'script error'); }});
window.addEventListener('unhandledrejection', function (ev) {{
  opprofError('unhandled rejection: ' + (ev.reason && ev.reason.message || ev.reason)); }});
"""

_SORT = """(function () {
  function key(td) { var v = td.getAttribute('data-v');
    if (v !== null && v !== '') { var n = parseFloat(v); if (!isNaN(n)) return n; }
    return td.textContent.trim().toLowerCase(); }
  function cmp(a, b) { if (typeof a === typeof b) return a < b ? -1 : a > b ? 1 : 0;
    return typeof a === 'number' ? -1 : 1; }
  document.querySelectorAll('table.sortable').forEach(function (t) {
    t.querySelectorAll('th').forEach(function (th, i) {
      th.addEventListener('click', function () {
        var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        t.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        rows.sort(function (a, b) { var r = cmp(key(a.cells[i]), key(b.cells[i]));
          return asc ? r : -r; });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.body.setAttribute('data-charts',
    String(document.querySelectorAll('.js-plotly-plot .main-svg').length > 0));
})();"""

_STYLE = f"""
:root {{ --fg: #1d2125; --muted: #5f6b76; --line: #e3e6ea; --bg: #ffffff; --soft: #f6f8fa; }}
* {{ box-sizing: border-box; }}
body {{ font-family: {palette.FONT_FAMILY}; color: var(--fg); background: var(--bg); margin: 0;
       font-size: 14px; line-height: 1.45; }}
header {{ padding: 18px 32px 10px; border-bottom: 1px solid var(--line); }}
header h1 {{ font-size: 20px; margin: 0 0 4px; }}
header .sub {{ color: var(--muted); margin: 0; }}
nav {{ padding: 8px 32px; border-bottom: 1px solid var(--line); background: var(--soft);
      position: sticky; top: 0; z-index: 10; }}
nav a {{ margin-right: 16px; color: #0b5cad; text-decoration: none; }}
nav a:hover {{ text-decoration: underline; }}
main {{ padding: 8px 32px 32px; max-width: 1400px; }}
section {{ margin-top: 22px; }}
h2 {{ font-size: 17px; margin: 0 0 4px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }}
h3 {{ font-size: 14px; margin: 14px 0 4px; }}
p.note {{ color: var(--muted); margin: 4px 0 8px; max-width: 1000px; }}
p.summary {{ font-size: 15px; background: var(--soft); border-left: 4px solid #0072B2;
            padding: 8px 12px; max-width: 1100px; }}
.chart {{ width: 100%; min-height: 120px; }}
.grid2 {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr));
         gap: 12px; }}
.tablewrap {{ width: fit-content; max-width: 100%; overflow-x: auto; max-height: 560px;
             overflow-y: auto; margin: 6px 0 10px;
             border: 1px solid var(--line); }}
table {{ border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }}
th, td {{ padding: 3px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }}
th {{ background: var(--soft); position: sticky; top: 0; text-align: left; }}
table.sortable th {{ cursor: pointer; user-select: none; }}
table.sortable th:after {{ content: ' \\21C5'; color: #b0b7bf; font-size: 11px; }}
table.sortable th[aria-sort=ascending]:after {{ content: ' \\25B2'; color: var(--fg); }}
table.sortable th[aria-sort=descending]:after {{ content: ' \\25BC'; color: var(--fg); }}
td.num {{ text-align: right; }}
tbody tr:hover {{ background: #fafbfc; }}
.swatch {{ display: inline-block; width: 10px; height: 10px; border-radius: 2px;
          margin-right: 6px; vertical-align: baseline; }}
.meta td:first-child {{ color: var(--muted); }}
.meta td {{ white-space: normal; max-width: 900px; word-break: break-word; }}
code {{ background: var(--soft); padding: 1px 4px; border-radius: 3px; }}
footer {{ color: var(--muted); padding: 12px 32px 24px; border-top: 1px solid var(--line);
         font-size: 12px; }}
#{ERROR_ID} {{ color: #b00020; background: #fff0f0; padding: 8px; }}
"""


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]],
         footer: str = "") -> str:
    """A whole page: title, subtitle, a nav bar and (id, heading, body html) sections."""
    nav = "".join(f'<a href="#{sid}">{html.escape(head)}</a>' for sid, head, _ in sections)
    body = "\n".join(f'<section id="{sid}"><h2>{html.escape(head)}</h2>\n{inner}</section>'
                     for sid, head, inner in sections)
    made = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="opprof {__version__}">
<title>{html.escape(title)}</title>
<script>{_ONERROR}</script>
<style>{_STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<header><h1>{html.escape(title)}</h1><p class="sub">{html.escape(subtitle)}</p></header>
<nav>{nav}</nav>
<main>
{body}
</main>
<footer>Made by opprof {__version__} on {made}. {footer} Charts: plotly.js, inlined (this file
needs no network). Click a table's header to sort it; hover a chart for values; its toolbar
saves it as SVG.</footer>
<script>{_SORT}</script>
</body></html>
"""


# --- pieces -------------------------------------------------------------------------------

@functools.cache
def _template() -> dict[str, Any]:
    """The charts' template, plotly's ``plotly_white`` as the package ships it: read once,
    not validated and deep-copied into every figure (``update_layout(template=…)``: 20 ms a
    chart, 150 ms for the first)."""
    text = (resources.files("plotly") / "package_data" / "templates" / "plotly_white.json"
            ).read_text(encoding="utf-8")
    spec: dict[str, Any] = json.loads(text)
    return spec


#: A plotly.js trace or layout (part): the attributes plotly.js takes, nested; array values
#: may be lists, numpy arrays or pandas Series (written as plotly.js typed arrays).
Spec: TypeAlias = dict[str, Any]


def _merge(into: Spec, update: Spec) -> None:
    """``update`` into ``into``, nested dicts merged key by key (as plotly's ``update_*``)."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


class Fig:
    """A chart as plotly.js takes it: ``data`` (trace dicts, each with its ``type``) and
    ``layout``, built with helpers named as plotly's figure methods."""

    def __init__(self, *traces: Spec) -> None:
        self.data: list[Spec] = list(traces)
        self.layout: Spec = {}

    def add_trace(self, trace: Spec, xaxis: str | None = None,
                  yaxis: str | None = None) -> None:
        """Append a trace (on the subplot of axes ``xaxis``/``yaxis``: "x2", "y2" …)."""
        self.data.append(trace if xaxis is None else {**trace, "xaxis": xaxis, "yaxis": yaxis})

    def update_layout(self, **kw: Any) -> Fig:
        """Merge ``kw`` into the layout."""
        _merge(self.layout, kw)
        return self

    def update_xaxes(self, axis: str = "xaxis", **kw: Any) -> Fig:
        """Merge ``kw`` into the x axis (``axis``: "xaxis2" … on a grid)."""
        _merge(self.layout.setdefault(axis, {}), kw)
        return self

    def update_yaxes(self, axis: str = "yaxis", **kw: Any) -> Fig:
        """Merge ``kw`` into the y axis (``axis``: "yaxis2" … on a grid)."""
        _merge(self.layout.setdefault(axis, {}), kw)
        return self


def _bar(**kw: Any) -> Spec:
    """A bar trace."""
    return {"type": "bar", **kw}


def _scatter(**kw: Any) -> Spec:
    """A scatter trace (lines, markers, text)."""
    return {"type": "scatter", **kw}


def _colorscale(colors: Sequence[str]) -> list[list[float | str]]:
    """Colours spread evenly from 0 to 1 (a plotly.js colorscale)."""
    return [[i / (len(colors) - 1), c] for i, c in enumerate(colors)]


def _title(text: str) -> Spec:
    """An axis' or the chart's title."""
    return {"text": text}


def _layout(fig: Fig, height: int, xtitle: str | None = None, ytitle: str | None = None,
            **kw: object) -> Fig:
    """The charts' common layout: height, font, margins, the legend above; axis titles."""
    fig.update_layout(font={"family": palette.FONT_FAMILY, "size": 12},
                      margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02,
                              "xanchor": "left", "x": 0, "traceorder": "normal"},
                      hoverlabel={"namelength": -1}, height=height, **kw)
    if xtitle is not None:
        fig.update_xaxes(title=_title(xtitle))
    if ytitle is not None:
        fig.update_yaxes(title=_title(ytitle))
    return fig


#: plotly.js's typed-array names of the numpy dtypes it takes (plotly's own table).
_TYPED = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4",
          "uint32": "u4", "float32": "f4", "float64": "f8"}
#: Keys whose arrays plotly leaves as they are.
_UNTYPED_KEYS = frozenset({"geojson", "layer", "layers", "range"})


def _typed_arrays(obj: object) -> None:
    """Every numpy array (pandas Series, Index) in ``obj`` replaced, in place, by what
    plotly's figures write for it (``_plotly_utils.utils.convert_to_base64``, done here
    without its pandas/narwhals dispatch: 80 ms of a small page): a numeric array as a
    plotly.js typed array (``{"dtype", "bdata"[, "shape"]}``; 64-bit integers narrowed to
    the smallest type that holds them, else left as numbers), any other array as itself."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in _UNTYPED_KEYS:
                continue
            if isinstance(value, np.ndarray | pd.Series | pd.Index):
                obj[key] = _typed(value)
            else:
                _typed_arrays(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _typed_arrays(value)


def _typed(v: Array | pd.Series | pd.Index) -> object:
    """One array as plotly's ``to_typed_array_spec`` writes it."""
    a = v.to_numpy() if isinstance(v, pd.Series | pd.Index) else v
    if a.size == 0 or a.dtype.kind not in "uif":
        return a
    a = np.ascontiguousarray(a)
    if a.dtype.kind in "iu" and a.dtype.itemsize == 8:
        lo, hi = int(a.min()), int(a.max())
        for t in (("uint8", "uint16", "uint32") if a.dtype.kind == "u" else
                  ("int8", "int16", "int32")):
            if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
                a = a.astype(t)
                break
        else:
            return a
    code = _TYPED.get(str(a.dtype))
    if code is None:
        return a
    spec: dict[str, str] = {"dtype": code,
                            "bdata": base64.b64encode(a.tobytes()).decode("ascii")}
    if a.ndim > 1:
        spec["shape"] = str(a.shape)[1:-1]
    return spec


_counter = [0]


def chart(fig: Fig) -> str:
    """A figure as a div and its script (plotly.js is in the page's head); numeric arrays
    as plotly.js typed arrays, as plotly's own figures write them."""
    _counter[0] += 1
    spec: Spec = {"data": fig.data, "layout": dict(fig.layout)}
    _typed_arrays(spec)
    spec["layout"]["template"] = _template()
    div: str = pio.to_html(spec, include_plotlyjs=False, full_html=False, config=_CONFIG,
                           div_id=f"chart{_counter[0]}", default_width="100%", validate=False)
    return div.replace('<div>', '<div class="chart">', 1)


#: A table cell as the formatters take it: a number (numpy's too), text, or missing (None;
#: pandas' NA and NaN read as missing as well).
Cell: TypeAlias = "SupportsFloat | SupportsIndex | str | None"


def _num(v: Cell) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def f_ms(v: Cell) -> str:
    """ns → ``1,234.567`` ms text."""
    x = _num(v)
    return "-" if x is None else f"{x / MS:,.3f}"


def f_pct(v: Cell) -> str:
    """A fraction as a percentage."""
    x = _num(v)
    return "-" if x is None or math.isinf(x) else f"{x:.1%}"


def f_ratio(v: Cell) -> str:
    """A ratio as ``1.93x``."""
    x = _num(v)
    if x is None:
        return "-"
    return "-" if math.isinf(x) else units.ratio(x)


def f_int(v: Cell) -> str:
    """An integer with thousands separators."""
    x = _num(v)
    return "-" if x is None else f"{x:,.0f}"


def f_mib(v: Cell) -> str:
    """Bytes as MiB."""
    x = _num(v)
    return "-" if x is None else f"{x / plotdata.MIB:,.1f}"


def f_text(v: object) -> str:
    """Any value as text ('-' when missing)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return str(v)


Column = tuple[str, str, Callable[[Any], str]]


def table(df: pd.DataFrame, columns: Sequence[Column], sortable: bool = True) -> str:
    """An HTML table of ``df``: (column, header, formatter) per column; numbers keep their raw
    value in ``data-v`` so sorting is numeric."""
    cols = [c for c in columns if c[0] in df.columns]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in cols)
    rows = []
    for rec in df[[c for c, _, _ in cols]].itertuples(index=False, name=None):
        cells = []
        for (col, _, fmt), v in zip(cols, rec, strict=True):
            x = _num(v) if not isinstance(v, str) else None
            text = fmt(v)
            if col == "phase" and str(v) in palette.PHASE_COLORS:
                text = (f'<span class="swatch" style="background:{palette.PHASE_COLORS[str(v)]}">'
                        f'</span>{html.escape(text)}')
            else:
                text = html.escape(text)
            if x is not None and not isinstance(v, bool):
                dv = "" if math.isinf(x) and x < 0 else ("1e308" if math.isinf(x) else repr(x))
                cells.append(f'<td class="num" data-v="{dv}">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return (f'<div class="tablewrap"><table{cls}><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(rows) + "</tbody></table></div>")


def _meta_text(v: object, limit: int) -> str:
    if v is None:
        return "-"
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text):,} characters)"
    return html.escape(text)


def meta_table(meta: MetaMapping, limit: int = 300, pair: bool = False) -> str:
    """The run's metadata as a key/value table (long values cut at ``limit`` characters);
    ``pair``: each value is ``{"A": …, "B": …}``, shown in two columns."""
    rows = []
    for k, v in meta.items():
        cells = ([_meta_text(v["A"], limit), _meta_text(v["B"], limit)] if pair
                 else [_meta_text(v, limit)])
        rows.append(f"<tr><td>{html.escape(str(k))}</td>"
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "<thead><tr><th></th><th>A</th><th>B</th></tr></thead>" if pair else ""
    return (f'<div class="tablewrap"><table class="meta">{head}<tbody>' + "".join(rows)
            + "</tbody></table></div>")


def note(text: str) -> str:
    """A muted explanatory paragraph."""
    return f'<p class="note">{html.escape(text)}</p>'


def _stacked_phases(df: pd.DataFrame, x: Sequence[str], height: int, xtitle: str = "",
                    ytitle: str = "ms per step", horizontal: bool = False) -> Fig:
    fig = Fig()
    for p in PHASES:
        v = df[p].to_numpy(float) if p in df else np.zeros(len(df))
        if not (v > 0).any():
            continue
        kw = {"x": v, "y": list(x), "orientation": "h"} if horizontal else {"x": list(x),
                                                                          "y": v}
        fig.add_trace(_bar(name=p, marker={"color": palette.PHASE_COLORS[p]},
                           hovertemplate=f"{p}: %{{{'x' if horizontal else 'y'}:.3f}} ms"
                                         "<extra>%{" + ("y" if horizontal else "x") + "}</extra>",
                           **kw))
    _layout(fig, height, xtitle, ytitle, barmode="stack")
    if horizontal:
        fig.update_yaxes(autorange="reversed", type="category")
    else:
        fig.update_xaxes(type="category")
    return fig


# --- report -------------------------------------------------------------------------------

PHASE_COLUMNS: list[Column] = [("phase", "phase", f_text), ("ns_per_step", "ms/step", f_ms),
                               ("share", "share", f_pct),
                               ("busy_ns_per_step", "busy ms/step", f_ms)]
OP_COLUMNS: list[Column] = [
    ("op", "op", f_text), ("phase", "phase", f_text), ("count", "count", f_int),
    ("ns_per_step", "ms/step", f_ms), ("total_ns", "total ms", f_ms),
    ("mean_ns", "mean ms", f_ms), ("p50_ns", "p50 ms", f_ms), ("p95_ns", "p95 ms", f_ms),
    ("share_of_phase", "share of phase", f_pct)]


def _subtitle(meta: MetaMapping) -> str:
    keys = [("framework", ""), ("framework_version", ""), ("model", ""), ("dataset", ""),
            ("batch_size", "batch "), ("workers", "workers "), ("mode", "mode "),
            ("device", "")]
    return "  ·  ".join(f"{p}{meta[k]}" for k, p in keys if meta.get(k) not in (None, ""))


def report(rep: Report, by: str = "phase", top: int | None = None,
           advice: Advisory | None = None) -> str:
    """The whole report as one HTML page (every view; ``by`` is ignored; ``advice`` first)."""
    meta = rep.meta
    n_steps, ranks = len(rep.steps), sorted(set(rep.steps["rank"])) if len(rep.steps) else []
    mean = float(rep.steps["dur_ns"].mean()) if n_steps else float("nan")
    secs = [("advice", "Advice", _report_advice(advice))] if advice is not None else []
    secs += [("summary", "Summary", _report_summary(rep, n_steps, ranks, mean)),
            ("steps", "Step breakdown", _report_steps(rep, len(ranks))),
            ("ops", "Operators", _report_ops(rep.ops, top, "host"))]
    if len(rep.device_ops):
        secs.append(("device-ops", "GPU kernels and copies",
                     _report_ops(rep.device_ops, top, "device")))
    if len(ranks) > 1:
        secs.append(("ranks", "Ranks", _report_ranks(rep)))
    if len(rep.collectives):
        secs.append(("collectives", "Collectives", _report_collectives(rep)))
    if len(rep.pipeline):
        secs.append(("pipeline", "Pipeline", _report_pipeline(rep)))
    if len(rep.experts):
        secs.append(("experts", "Experts (all-to-all)", _report_experts(rep)))
    if len(rep.devices):
        secs.append(("devices", "GPU time per device", _report_devices(rep)))
    if len(rep.critical):
        secs.append(("critical", "Critical path", _report_critical(rep)))
    if len(rep.memory.ranks):
        secs.append(("memory", "Memory", _report_memory(rep)))
    secs.append(("efficiency", "Efficiency and roofline", _report_efficiency(rep)))
    secs.append(("metadata", "Metadata", meta_table(meta)))
    src = meta.get("sources") or []
    name = str(src[0]) if len(src) == 1 else "TRACE"
    footer = (f"The raw timeline: <code>opprof export {html.escape(name)} --to perfetto -o "
              "run.pftrace</code>, then open it in the Perfetto UI (ui.perfetto.dev).")
    title = "opprof report — " + (" ".join(str(meta[k]) for k in ("framework", "model")
                                           if meta.get(k)) or name)
    return page(title, _subtitle(meta), secs, footer)


def _gate_html(d: Diff) -> str:
    """The regression gate's verdict and checks (``diff --fail-above``)."""
    if d.gate is None:
        return ""
    from opprof.render.console import gate_lines

    lines = gate_lines(d.gate)
    color = "#b00020" if d.gate.verdict == "fail" else "#1b7f3b"
    return (f'<p style="color:{color}"><b>{html.escape(lines[0])}</b></p>'
            + "".join(note(line.strip()) for line in lines[1:]))


def _report_advice(a: Advisory) -> str:
    """The advice, largest saving first: what the trace shows, what to do, the saving."""
    training = [x for x in a.advice if x.kind == "training"]
    out = ""
    if not a.step_ns:
        return note("No advice: " + next(iter(a.not_checked.values()), "no steps"))
    if not training:
        out += (f'<p><b>Healthy</b>: no rule finds a saving of 2% of the step or more '
                f"({html.escape(a.bound)}).</p>")
    else:
        rows = pd.DataFrame([{"#": i, "saves_ms": x.saving_ns, "share": x.saving_share,
                              "confidence": x.confidence, "finding": x.finding,
                              "action": x.action, "model": x.model}
                             for i, x in enumerate(training, 1)])
        out += table(rows, [("#", "#", f_text), ("saves_ms", "saves ms/step", f_ms),
                            ("share", "share of step", f_pct),
                            ("confidence", "confidence", f_text),
                            ("finding", "finding", f_text), ("action", "action", f_text),
                            ("model", "predicted by", f_text)])
    for x in a.advice:
        if x.kind != "training":
            out += note(f"{x.finding}: {x.action}")
    if a.not_checked:
        out += note("Not checked: " + "; ".join(f"{k} ({v})" for k, v in a.not_checked.items()))
    return out + note("Each saving is predicted per step by the model or the replay of this "
                      "trace's dependency graph; `opprof advise TRACE` gives the evidence, "
                      "`--verify` checks them on a recorded run.")


def _report_summary(rep: Report, n_steps: int, ranks: list[int], mean: float) -> str:
    meta = rep.meta
    distinct = rep.steps["step"].nunique() if n_steps else 0
    facts = [("mean profiled step", f"{f_ms(mean)} ms"), ("steps", f"{distinct:,}"),
             ("ranks", f"{len(ranks):,}")]
    if meta.get("unprofiled_step_ns"):
        facts.append(("unprofiled step", f"{f_ms(meta['unprofiled_step_ns'])} ms"))
        facts.append(("profiler overhead",
                      units.ratio(mean / float(meta["unprofiled_step_ns"]),
                                  "profiled/unprofiled")))
    if meta.get("samples_per_s"):
        facts.append(("samples/s (unprofiled)", f"{float(meta['samples_per_s']):,.1f}"))
    if rep.comm_overlap is not None:
        facts.append(("communication hidden behind compute", f_pct(rep.comm_overlap)))
    ph = plotdata.phase_means(rep)
    fig = _stacked_phases(pd.DataFrame([ph]), ["mean step"], 150, ytitle="",
                          horizontal=True)
    fig.update_xaxes(title=_title("ms per step"))
    fig.update_layout(margin={"l": 90, "r": 20, "t": 40, "b": 40})
    facts_html = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                         for k, v in facts)
    return (f'<div class="tablewrap" style="display:inline-block"><table class="meta">'
            f"<tbody>{facts_html}</tbody></table></div>" + chart(fig)
            + note("Every instant of a step is given to one phase (forward/backward/update > "
                   "comm > h2d > load > other), so the phases sum to the step time; comm is "
                   "communication not hidden behind compute."))


def _report_steps(rep: Report, n_ranks: int) -> str:
    df = plotdata.step_phases(rep)
    parts = []
    if len(df):
        fig = _stacked_phases(df, [str(s) for s in df.index], 380, xtitle="step",
                              ytitle="ms" + (" (mean over ranks)" if n_ranks > 1 else ""))
        parts.append(chart(fig))
    parts.append(table(rep.phases.reset_index(), PHASE_COLUMNS))
    return "".join(parts)


def _report_ops(ops: pd.DataFrame, top: int | None, where: str) -> str:
    rows = plotdata.op_rows(ops, top or DEFAULT_TOP)
    if rows.empty:
        return note("No operators.")
    fig = Fig()
    for p in PHASES:
        sub = rows[rows["phase"] == p]
        if len(sub):
            fig.add_trace(_bar(x=sub["ms_per_step"], y=sub["op"], orientation="h", name=p,
                               marker={"color": palette.PHASE_COLORS[p]},
                               customdata=np.stack([sub["count"], sub["mean_ms"]], axis=1),
                               hovertemplate="%{y}: %{x:.3f} ms/step<br>count %{customdata[0]}"
                                             ", mean %{customdata[1]:.3f} ms<extra>"
                                             + p + "</extra>"))
    _layout(fig, 120 + 22 * rows["op"].nunique(), f"{where} ms per step", barmode="stack")
    # An operator in several phases (``memory`` in forward and backward) is one bar of
    # stacked phase segments, placed by its total.
    order = rows.groupby("op", sort=False)["ms_per_step"].sum().sort_values(ascending=False)
    fig.update_yaxes(categoryorder="array", categoryarray=list(order.index),
                     type="category", autorange="reversed")
    fig.update_layout(margin={"l": 170, "r": 20, "t": 40, "b": 50})
    return (chart(fig) + note(f"The {len(rows)} largest canonical operators ({where} time, "
                              "nested operators counted once); the table has all of them.")
            + table(ops, OP_COLUMNS))


RANK_COLUMNS: list[Column] = [
    ("rank", "rank", f_int), ("steps", "steps", f_int), ("dur_ns", "step ms", f_ms),
    *[(p, f"{p} ms", f_ms) for p in PHASES], ("own_ns", "own ms", f_ms),
    ("comm_ns", "comm ms", f_ms), ("wait_ns", "wait ms", f_ms),
    ("transfer_ns", "transfer ms", f_ms), ("wait_share", "wait share", f_pct),
    ("overlap", "overlap", f_pct), ("bytes", "per step", units.size),
    ("bandwidth_Bps", "bandwidth", units.rate)]
STRAGGLER_COLUMNS: list[Column] = [
    ("step", "step", f_int), ("ranks", "ranks", f_int), ("slowest_rank", "slowest rank", f_int),
    ("own_ns", "own ms", f_ms), ("median_own_ns", "median own ms", f_ms),
    ("excess_ns", "excess ms", f_ms), ("excess_share", "excess", f_pct)]


def _report_ranks(rep: Report) -> str:
    parts = []
    mat = plotdata.rank_step_matrix(rep)
    if not mat.empty:
        fig = Fig({
            "type": "heatmap", "z": mat.to_numpy(float), "x": [str(s) for s in mat.columns],
            "y": [str(r) for r in mat.index], "colorscale": _colorscale(palette.HEAT),
            "colorbar": {"title": _title("ms")},
            "hovertemplate": "rank %{y}, step %{x}: own %{z:.3f} ms<extra></extra>"})
        st = plotdata.stragglers(rep)
        if len(st):
            fig.add_trace(_scatter(
                x=[str(s) for s in st["step"]], y=[str(r) for r in st["slowest_rank"]],
                mode="markers", name="straggler (slowest rank)",
                marker={"symbol": "x", "size": 12, "color": palette.STRAGGLER,
                        "line": {"width": 1, "color": "white"}},
                customdata=np.stack([st["excess_ms"], st["excess_share"] * 100], axis=1),
                hovertemplate="step %{x}: rank %{y} slowest, +%{customdata[0]:.3f} ms "
                              "(+%{customdata[1]:.1f}%) over the median<extra></extra>"))
        _layout(fig, min(900, 140 + 26 * len(mat)), "step", "rank", showlegend=True)
        fig.update_xaxes(type="category")
        fig.update_yaxes(type="category", autorange="reversed")
        parts.append("<h3>Own time per rank and step (step − wait for others)</h3>"
                     + chart(fig))
    wt = plotdata.wait_transfer(rep)
    if len(wt):
        fig = Fig()
        for col, name, color in (("own_ms", "own (not in comm)", palette.PHASE_COLORS["forward"]),
                                 ("transfer_ms", "transfer", palette.PHASE_COLORS["comm"]),
                                 ("wait_ms", "wait for others", "#F0A982")):
            fig.add_trace(_bar(y=[str(r) for r in wt["rank"]], x=wt[col], orientation="h",
                               name=name, marker={"color": color},
                               hovertemplate=f"rank %{{y}}: {name} %{{x:.3f}} ms<extra></extra>"))
        _layout(fig, min(900, 130 + 24 * len(wt)), "ms per step", "rank", barmode="stack")
        fig.update_yaxes(type="category", autorange="reversed")
        parts.append("<h3>Communication: waiting for others vs transfer</h3>" + chart(fig))
    parts.append(note("Own time = step − waiting inside collectives for the last rank to "
                      "enter; the straggler of a step is the rank with the largest own time."))
    parts.append(table(rep.ranks, RANK_COLUMNS))
    if len(rep.stragglers):
        parts.append("<h3>Stragglers</h3>" + table(rep.stragglers, STRAGGLER_COLUMNS))
    return "".join(parts)


COLLECTIVE_COLUMNS: list[Column] = [
    ("op", "collective", f_text), ("dim", "dimension", f_text), ("group", "group", f_text),
    ("size", "ranks in group", f_int),
    ("calls_per_step", "calls/step", lambda v: f"{_num(v) or 0:,.1f}"),
    ("bytes_per_call", "bytes/call", units.size),
    ("ns_per_step", "ms/step", f_ms), ("wait_ns", "wait ms (total)", f_ms),
    ("transfer_ns", "transfer ms (total)", f_ms),
    ("algbw_Bps", "algbw", units.rate),
    ("busbw_Bps", "busbw", units.rate), ("hidden", "hidden", f_pct)]


def _joined(values: object) -> str:
    """A list cell (stages, bytes per peer) as text."""
    return ", ".join(str(v) for v in values) if isinstance(values, list) else f_text(values)


PIPELINE_COLUMNS: list[Column] = [
    ("rank", "rank", f_int), ("stages", "stage", _joined), ("step", "step", f_int),
    ("schedule", "schedule", f_text), ("microbatches", "micro-batches", f_int),
    ("forward_ns_per_microbatch", "forward ms / micro-batch", f_ms),
    ("backward_ns_per_microbatch", "backward ms / micro-batch", f_ms),
    ("bubble_ns", "bubble ms", f_ms), ("bubble_share", "bubble share", f_pct),
    ("ideal_bubble_share", "ideal bubble", f_pct), ("step_ns", "step ms", f_ms),
    ("order", "order", f_text)]
EXPERT_COLUMNS: list[Column] = [
    ("rank", "rank", f_int), ("step", "step", f_int), ("calls", "all-to-alls", f_int),
    ("bytes_sent", "sent", units.size), ("bytes_received", "received", units.size),
    ("send_bytes_per_peer", "sent per peer (bytes)", _joined),
    ("recv_bytes_per_peer", "received per peer (bytes)", _joined),
    ("peer_imbalance", "max/mean", lambda v: f"{_num(v) or 0:.2f}")]
LOAD_COLUMNS: list[Column] = [
    ("step", "step", f_int), ("call", "all-to-all", f_int),
    ("recv_bytes_per_rank", "received per rank (bytes)", _joined),
    ("imbalance", "max/mean", lambda v: f"{_num(v) or 0:.2f}")]


def _report_pipeline(rep: Report) -> str:
    return (note("Per pipeline stage and step: the bubble is the time the stage waited on a "
                 "send or receive with nothing to compute (part of the comm phase); ideal = "
                 "(p−1)/(v·m+p−1); forward/backward = the compute inside each micro-batch "
                 "(docs/parallelism.md).") + table(rep.pipeline, PIPELINE_COLUMNS))


def _report_experts(rep: Report) -> str:
    return (note("All-to-all bytes per peer (from the split sizes), and per exchange the bytes "
                 "each rank's experts received: max/mean = 1.00 when the tokens went evenly.")
            + table(rep.experts, EXPERT_COLUMNS) + table(rep.expert_load, LOAD_COLUMNS))


def _report_collectives(rep: Report) -> str:
    return (note("Per collective and process group: wait = before the last rank entered it; "
                 "algbw = bytes / transfer time, busbw = algbw × "
                 "2(n−1)/n for all_reduce, (n−1)/n for all_gather, reduce_scatter and "
                 "all_to_all, 1 otherwise (the nccl-tests convention); hidden = the share "
                 "of its time the rank computed beside it (on a GPU: compute kernels).")
            + table(rep.collectives, COLLECTIVE_COLUMNS))


#: Colours of the critical path's bound-by parts (the phase palette where they match).
BOUND_COLORS = {"compute": palette.PHASE_COLORS["forward"], "comm": palette.PHASE_COLORS["comm"],
                "launch": palette.PHASE_COLORS["update"], "sync": palette.PHASE_COLORS["h2d"],
                "load": palette.PHASE_COLORS["load"], "idle": palette.PHASE_COLORS["other"]}


def _report_critical(rep: Report) -> str:
    from opprof.analysis.critpath import BOUND_BY

    df = rep.critical
    label = [f"rank {r} step {s}" for r, s in zip(df["rank"], df["step"], strict=True)]
    fig = Fig()
    for k in BOUND_BY:
        v = df[k].to_numpy(float) / 1e6
        if (v > 0).any():
            fig.add_trace(_bar(name=k, x=v, y=label, orientation="h",
                               marker={"color": BOUND_COLORS[k]},
                               hovertemplate=f"{k}: %{{x:.3f}} ms<extra>%{{y}}</extra>"))
    _layout(fig, 120 + 24 * len(df), "ms", barmode="stack")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(margin={"l": 130, "r": 20, "t": 40, "b": 40})
    cols: list[Column] = [("rank", "rank", f_int), ("step", "step", f_int),
                          ("step_ns", "step ms", f_ms), ("path_ns", "path ms", f_ms),
                          *((k, f"{k} ms", f_ms) for k in BOUND_BY)]
    return (chart(fig) + note("Each step's critical path through its dependency graph (host "
                              "order per thread, launch → kernel, stream order, syncs, "
                              "collectives matched across ranks), every nanosecond of the step "
                              "given to what bound it: docs/critical-path.md.")
            + table(df, cols))


DEVICE_COLUMNS: list[Column] = [
    ("rank", "rank", f_int), ("device", "device", f_text), ("span_ns", "span ms", f_ms),
    ("compute_ns", "compute ms", f_ms), ("comm_ns", "comm ms", f_ms),
    ("memcpy_ns", "memcpy ms", f_ms), ("idle_ns", "idle ms", f_ms),
    ("compute_share", "compute", f_pct), ("comm_share", "comm", f_pct),
    ("memcpy_share", "memcpy", f_pct), ("idle_share", "idle", f_pct),
    ("comm_overlap", "comm overlapped", f_pct), ("idle_host_ns", "idle: host ms", f_ms),
    ("kernels", "kernels", f_int), ("memcpys", "copies", f_int), ("streams", "streams", f_int)]


def _report_efficiency(rep: Report) -> str:
    """The HTML report's efficiency section: the headline, the roofline chart, the table."""
    from opprof.render.efficiency import headline
    from opprof.render.roofline import BOUND_COLORS, ceilings, points, span
    from opprof.render.units import flops_rate, rate, share

    eff = rep.efficiency
    lines = "".join(f"<p>{line.strip()}</p>" for line in headline(rep))
    if eff is None:
        return lines
    pts = points(eff)
    fig = Fig()
    x = span(pts, eff)
    for name, y in ceilings(eff, x):
        fig.add_trace(_scatter(x=x, y=y, mode="lines", name=name,
                               line={"color": "#333333", "dash": "dash" if "vector" in name
                                     else "solid"}))
    for bound, g in pts.groupby("bound", sort=False):
        size = np.sqrt(g["time_ns_per_step"].to_numpy(float))
        size = 8 + 30 * size / max(float(np.sqrt(pts["time_ns_per_step"].max())), 1.0)
        fig.add_trace(_scatter(
            x=g["intensity"], y=g["achieved_flops_per_s"], mode="markers+text",
            text=g["label"], textposition="top center", name=str(bound) or "unbounded",
            marker={"size": size, "color": BOUND_COLORS.get(str(bound), "#777777"),
                    "opacity": 0.8},
            customdata=np.stack([g["phase"].astype(str), g["roofline_share"] * 100,
                                 g["time_ns_per_step"] / 1e6], axis=1),
            hovertemplate="%{text} (%{customdata[0]})<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s"
                          "<br>%{customdata[1]:.1f}% of the roofline, %{customdata[2]:.3f} "
                          "ms/step<extra></extra>"))
    _layout(fig, 520, "arithmetic intensity (FLOP/byte)", "achieved FLOP/s")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    cols = [("op", "op", f_text), ("phase", "phase", f_text),
            ("flops", "FLOP/step", lambda v: flops_rate(v).removesuffix("/s")),
            ("bytes", "bytes/step", lambda v: rate(v).removesuffix("/s")),
            ("intensity", "FLOP/byte", lambda v: "-" if v is None or v != v else f"{v:.3g}"),
            ("achieved_flops_per_s", "FLOP/s", flops_rate),
            ("achieved_bytes_per_s", "bytes/s", rate),
            ("roofline_share", "of roofline", share), ("bound", "bound", f_text)]
    return (lines + chart(fig) + note(
        "Each operator at its arithmetic intensity (FLOPs per byte moved) and the FLOP/s it "
        "achieved over its time (its kernels' on a GPU trace), the marker's area its time per "
        "step; the lines are the machine's ceilings: min(peak FLOP/s, intensity × peak "
        "bandwidth). compute- and memory-bound operators sit near the line right and left of "
        "the ridge; latency-overhead ones far below it.") + table(eff.roofline, cols))


def _report_devices(rep: Report) -> str:
    d = plotdata.device_rows(rep)
    fig = Fig()
    for p in plotdata.DEVICE_PARTS:
        fig.add_trace(_bar(y=d["label"], x=d[f"{p}_ms"], orientation="h", name=p,
                           marker={"color": palette.DEVICE_COLORS[p]},
                           customdata=d[f"{p}_share"] * 100,
                           hovertemplate=f"{p}: %{{x:.3f}} ms (%{{customdata:.1f}}%)"
                                         "<extra>%{y}</extra>"))
    _layout(fig, min(900, 130 + 30 * len(d)), f"ms over the {rep.device_span} span",
            barmode="stack")
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_layout(margin={"l": 130, "r": 20, "t": 40, "b": 50})
    return (chart(fig) + note("Each device's span split into compute kernels, communication "
                              "kernels, copies and idle time (they sum to the span); "
                              "'idle: host' is idle time while the host was busy.")
            + table(rep.devices, DEVICE_COLUMNS))


def _memory_axis(fig: Fig, values: pd.DataFrame, height: int) -> None:
    log = plotdata.wants_log(values)
    _layout(fig, height, ytitle="MiB" + (" (log scale)" if log else ""), barmode="group")
    fig.update_xaxes(type="category")
    if log:
        fig.update_yaxes(type="log", dtick=1)


MEMORY_COLUMNS: list[Column] = [
    ("rank", "rank", f_int), ("role", "role", f_text),
    ("peak_rss_bytes", "peak resident MiB", f_mib), ("hwm_bytes", "VmHWM MiB", f_mib),
    ("unprofiled_rss_bytes", "before profiling MiB", f_mib),
    ("peak_allocated_bytes", "allocated MiB", f_mib),
    ("peak_reserved_bytes", "reserved MiB", f_mib), ("param_bytes", "parameters MiB", f_mib),
    ("peak_step", "peak step", f_int), ("series", "series", f_text),
    *[(f"peak_{p}_bytes", f"{p} MiB", f_mib) for p in PHASES]]


def _report_memory(rep: Report) -> str:
    df = plotdata.memory_rows(rep)
    fig = Fig()
    for i, s in enumerate(c for c in df.columns if c != "label"):
        fig.add_trace(_bar(x=df["label"], y=df[s], name=s,
                           marker={"color": palette.MEMORY_COLORS.get(s, palette.series_color(i))},
                           hovertemplate=f"{s}: %{{y:,.1f}} MiB<extra>%{{x}}</extra>"))
    _memory_axis(fig, df.drop(columns=["label"]), 380)
    parts = [chart(fig)]
    pm = plotdata.phase_memory(rep)
    if len(pm) and np.isfinite(pm[list(PHASES)].to_numpy(float)).any():
        fig = Fig()
        for p in PHASES:
            if np.isfinite(pm[p].to_numpy(float)).any():
                fig.add_trace(_bar(x=pm["label"], y=pm[p], name=p,
                                   marker={"color": palette.PHASE_COLORS[p]},
                                   hovertemplate=f"{p}: %{{y:,.1f}} MiB<extra>%{{x}}</extra>"))
        _layout(fig, 340, ytitle="MiB", barmode="group")
        fig.update_xaxes(type="category")
        parts.append("<h3>Peak per phase (main series)</h3>" + chart(fig))
    parts.append(note("Resident memory sampled from outside each process; the allocator's "
                      "own counters where the framework exposes them."))
    parts.append(table(rep.memory.ranks, MEMORY_COLUMNS))
    return "".join(parts)


# --- diff ---------------------------------------------------------------------------------

DIFF_COLUMNS: list[Column] = [
    ("a_ns_per_step", "A ms/step", f_ms), ("b_ns_per_step", "B ms/step", f_ms),
    ("ab", "A/B", f_text), ("delta_ns", "A−B ms", f_ms),
    ("share_of_gap", "share of gap", f_pct)]


def _with_ab(df: pd.DataFrame) -> pd.DataFrame:
    """The diff rows with their A/B as text ("only in A" where B has none)."""
    return df.assign(ab=[units.ab_ratio(a, b) for a, b in
                         zip(df["a_ns_per_step"], df["b_ns_per_step"], strict=True)])


def _waterfall(w: plotdata.Waterfall, height: int) -> Fig:
    names = [w.start_label, *w.parts["name"], w.end_label]
    vals = [w.start_ms, *w.parts["delta_ms"], w.end_ms]
    colors = [palette.PHASE_COLORS.get(str(n)) for n in w.parts["name"]]
    fig = Fig({
        "type": "waterfall", "x": names, "y": vals,
        "measure": ["absolute", *["relative"] * len(w.parts), "total"],
        "text": [f"{v:,.2f}" if i in (0, len(vals) - 1) else f"{v:+,.2f}"
                 for i, v in enumerate(vals)], "textposition": "outside",
        "increasing": {"marker": {"color": palette.SLOWER}},
        "decreasing": {"marker": {"color": palette.FASTER}},
        "totals": {"marker": {"color": palette.TOTAL}},
        "connector": {"line": {"color": "#bbbbbb", "width": 1}},
        "hovertemplate": "%{x}: %{text} ms<extra></extra>", "showlegend": False})
    # A phase's own colour on the axis label keeps phases recognisable across charts.
    if any(colors):
        fig.update_xaxes(ticktext=[n if c is None else f'<span style="color:{c}">■</span> {n}'
                                   for n, c in zip(names, [None, *colors, None], strict=True)],
                         tickvals=names)
    _layout(fig, height, ytitle="ms per step", showlegend=False)
    fig.update_xaxes(type="category")
    # The parts are often small beside the steps: the axis starts below the lowest running
    # total rather than at 0 (the start and end bars are cut; their values are printed).
    run = np.cumsum(vals[:-1])
    lo, hi = float(min(run.min(), w.end_ms)), float(max(run.max(), w.end_ms))
    span = max(hi - lo, 1e-9 * max(abs(hi), 1.0))
    bottom = max(0.0, lo - 1.5 * span)
    fig.update_yaxes(range=[bottom, hi + 0.25 * span],
                     title=_title("ms per step" + (" (axis not from 0)" if bottom > 0 else "")))
    return fig


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as one HTML page: the sentence, phases A vs B, waterfalls of the gap by phase
    and by operator, the tables; memory and what-if when present."""
    top = top or 15
    secs = []
    runs = pd.DataFrame([{"run": f"A: {d.a_label}", "unprofiled": d.a_unprofiled_ns,
                          "step": d.a_step_ns},
                         {"run": f"B: {d.b_label}", "unprofiled": d.b_unprofiled_ns,
                          "step": d.b_step_ns}])
    runs["overhead"] = [d.overhead("a"), d.overhead("b")]
    warn = "".join(note(line) for line in verdicts.mismatch_lines(d))
    verdict = verdicts.memory_verdict(d)
    head = (f"<p class=\"summary\">{html.escape(verdicts.diff_sentence(d))}</p>" + warn
            + table(runs, [("run", "run", f_text), ("unprofiled", "unprofiled ms/step", f_ms),
                           ("step", "profiled ms/step", f_ms),
                           ("overhead", "profiled/unprofiled", f_ratio)], sortable=False)
            + note(f"A/B step time, {d.basis} (the headline): {f_ratio(d.headline_ratio)}"
                   + (f"; profiled: {f_ratio(d.step_ratio)}" if d.basis == "unprofiled"
                      else " (no unprofiled timing in both runs)")
                   + ". The phase and operator tables are profiled times; positive A−B: A "
                     "spends longer.")
            + (note(verdict) if verdict else "") + _gate_html(d))
    both = pd.DataFrame({p: [float(d.phases.set_index('phase').get('a_ns_per_step', {}).get(p, 0)),
                             float(d.phases.set_index('phase').get('b_ns_per_step', {}).get(p, 0))]
                         for p in PHASES}) / MS
    fig = _stacked_phases(both, [f"A: {d.a_label}", f"B: {d.b_label}"], 200, ytitle="",
                          horizontal=True)
    fig.update_xaxes(title=_title("ms per step"))
    fig.update_layout(margin={"l": 200, "r": 20, "t": 40, "b": 40})
    secs.append(("summary", "Summary", head + chart(fig)))
    wf = _waterfall(plotdata.diff_waterfall(d, "phase"), 380)
    secs.append(("phases", "The gap by phase",
                 chart(wf) + note("From B's step (left) to A's (right): each phase's A−B; "
                                  "red makes A slower, green faster. The phases sum to the "
                                  "gap exactly.")
                 + table(_with_ab(d.phases), [("phase", "phase", f_text), *DIFF_COLUMNS])))
    wo = plotdata.diff_waterfall(d, "op", top)
    ops = d.ops.head(top)
    bars = Fig()
    for label_, col, color in ((f"A: {d.a_label}", "a_ns_per_step", palette.SERIES[0]),
                               (f"B: {d.b_label}", "b_ns_per_step", palette.SERIES[1])):
        bars.add_trace(_bar(y=ops["op"], x=ops[col] / MS, orientation="h", name=label_,
                            marker={"color": color},
                            hovertemplate="%{y}: %{x:.3f} ms/step<extra>" + label_[:1]
                                          + "</extra>"))
    _layout(bars, 140 + 34 * len(ops), "host ms per step", barmode="group")
    bars.update_yaxes(type="category", autorange="reversed")
    bars.update_layout(margin={"l": 190, "r": 20, "t": 40, "b": 50})
    secs.append(("ops", "The gap by operator",
                 chart(_waterfall(wo, 420))
                 + note(f"The {len(ops)} operators with the largest |A−B| (host time); "
                        "'rest of the step' is the gap outside them (other operators, and "
                        "time that is not operator time, like waiting).")
                 + chart(bars) + table(_with_ab(d.ops), [("op", "op", f_text), *DIFF_COLUMNS])))
    if d.whatif is not None and len(d.whatif):
        w = d.whatif.head(top)
        fig = Fig(_bar(y=w["op"], x=w["saving_ns"] / MS, orientation="h",
                       marker={"color": palette.FASTER},
                       hovertemplate="%{y}: %{x:.3f} ms shorter<extra></extra>"))
        _layout(fig, 140 + 24 * len(w), "ms shorter A step at B's speed")
        fig.update_yaxes(type="category", autorange="reversed")
        fig.update_layout(margin={"l": 190, "r": 20, "t": 40, "b": 50})
        secs.append(("whatif", "What if", chart(fig) + table(_with_ab(d.whatif), [
            ("op", "op", f_text), ("a_ns_per_step", "A ms/step", f_ms),
            ("b_ns_per_step", "B ms/step", f_ms), ("ab", "A/B", f_text),
            ("whatif_step_ns", "A step at B's speed ms", f_ms),
            ("saving_ns", "saving ms", f_ms), ("saving_share", "saving", f_pct)])))
    if len(d.comm):
        secs.append(("comm", "Collectives by parallel dimension", table(_with_ab(d.comm), [
            ("dim", "dimension", f_text), ("op", "collective", f_text),
            ("a_ns_per_step", "A ms/step", f_ms), ("b_ns_per_step", "B ms/step", f_ms),
            ("ab", "A/B", f_text), ("delta_ns", "A−B ms", f_ms)])))
    if len(d.memory):
        secs.append(("memory", "Memory", table(d.memory, [
            ("metric", "metric", f_text), ("a_bytes", "A MiB", f_mib),
            ("b_bytes", "B MiB", f_mib), ("ratio", "A/B", f_ratio),
            ("delta_bytes", "A−B MiB", f_mib)])))
    if d.a_meta or d.b_meta:
        keys = list(dict.fromkeys([*d.a_meta, *d.b_meta]))
        secs.append(("metadata", "Metadata", meta_table(
            {k: {"A": d.a_meta.get(k), "B": d.b_meta.get(k)} for k in keys}, pair=True)))
    return page(f"opprof diff — {d.a_label} vs {d.b_label}", "A = " + d.a_label + "  ·  B = "
                + d.b_label, secs)


# --- bench --------------------------------------------------------------------------------

def _f_loss(v: Cell) -> str:
    return "-" if _num(v) is None else f"{_num(v):.3f}"


def _f_s(v: Cell) -> str:
    return "-" if _num(v) is None else f"{_num(v):.2f}"


BENCH_COLUMNS: list[Column] = [
    ("fw", "fw", f_text), ("model", "model", f_text), ("workers", "workers", f_int),
    ("mode", "mode", f_text), ("status", "status", f_text),
    ("samples_per_s", "samples/s", lambda v: "-" if _num(v) is None else f"{_num(v):,.1f}"),
    ("unprofiled_step_ns", "unprofiled ms/step", f_ms),
    ("step_ns", "profiled ms/step", f_ms), *[(p, f"{p} ms", f_ms) for p in PHASES],
    ("scaling_efficiency", "scaling", f_pct), ("profiled_scaling", "profiled scaling", f_pct),
    ("predicted_step_ns", "predicted ms", f_ms),
    ("predicted_scaling", "predicted scaling", f_pct),
    ("prediction_error", "prediction error", f_pct),
    ("unprofiled_rss_bytes", "mem MiB", f_mib), ("peak_rss_bytes", "profiled mem MiB", f_mib),
    ("rss_ratio", "mem/leanest", f_ratio), ("final_loss", "final loss", _f_loss),
    ("best_test_accuracy", "best test acc", f_pct),
    *[(f"time_to_{t}_s", f"s to {t}%", _f_s) for t in (50, 70, 90)], ("wall_s", "wall s",
                                          lambda v: "-" if _num(v) is None else f"{_num(v):.1f}"),
    ("reason", "reason", f_text)]
RATIO_COLUMNS: list[Column] = [
    ("model", "model", f_text), ("workers", "workers", f_int), ("op", "op", f_text),
    ("slower", "slower", f_text), ("faster", "faster", f_text),
    ("slower_ns_per_step", "slower ms", f_ms), ("faster_ns_per_step", "faster ms", f_ms),
    ("ratio", "ratio", f_ratio)]


#: The convergence chart's 2 × 2 grid (loss above test accuracy; against time, then step):
#: each subplot's axes and their domains, 0.08 between columns and 0.12 between rows.
_GRID = {(1, 1): ("", [0.0, 0.46], [0.56, 1.0]), (1, 2): ("2", [0.54, 1.0], [0.56, 1.0]),
         (2, 1): ("3", [0.0, 0.46], [0.0, 0.44]), (2, 2): ("4", [0.54, 1.0], [0.0, 0.44])}


def convergence_figure(curves: pd.DataFrame) -> Fig:
    """Loss and test accuracy against training time and against step, one colour per run
    (:func:`opprof.render.plotdata.bench_curves`' rows)."""
    fig = Fig()
    for n, xdom, ydom in _GRID.values():
        fig.update_xaxes(f"xaxis{n}", anchor=f"y{n}", domain=xdom)
        fig.update_yaxes(f"yaxis{n}", anchor=f"x{n}", domain=ydom)
    for i, (lab, g) in enumerate(curves.groupby("label", sort=False)):
        color = palette.series_color(i)
        for k, (rep, r) in enumerate(g.groupby("repeat")):
            ev = r.dropna(subset=["test_accuracy"])
            name = lab + (f" (repeat {rep})" if g["repeat"].nunique() > 1 else "")
            for row, y, data in ((1, "loss", r), (2, "test_accuracy", ev)):
                for col, x in ((1, "time_s"), (2, "step")):
                    n = _GRID[row, col][0]
                    fig.add_trace(_scatter(
                        x=data[x], y=data[y], mode="lines" if y == "loss" else "lines+markers",
                        name=name, legendgroup=lab, showlegend=row == 1 and col == 1 and k == 0,
                        line={"color": color, "width": 1.5 if k == 0 else 1},
                        opacity=1.0 if k == 0 else 0.6,
                        hovertemplate=f"{x}: %{{x}}<br>{y}: %{{y:.3f}}<extra>{name}</extra>"),
                        xaxis=f"x{n}", yaxis=f"y{n}")
    fig.update_xaxes("xaxis3", title=_title("training time (s)"))
    fig.update_xaxes("xaxis4", title=_title("step"))
    fig.update_yaxes("yaxis", title=_title("loss"))
    fig.update_yaxes("yaxis3", title=_title("test accuracy"), tickformat=".0%")
    fig.update_yaxes("yaxis4", tickformat=".0%")
    return _layout(fig, 640)


def bench(b: Bench) -> str:
    """A bench folder's results as one HTML page."""
    secs = [("runs", "Runs", note("Times in ms per step; scaling = samples/s ÷ (workers × "
                                  "samples/s of 1 worker); predicted: the model from the "
                                  "framework's 1-worker run; mem: resident peak of the largest "
                                  "worker before profiling.") + table(b.table, BENCH_COLUMNS))]
    per_model = plotdata.bench_phases(b)
    if per_model:
        inner = ""
        for model, df in per_model.items():
            fig = _stacked_phases(df, list(df.index), 380, ytitle="ms per step")
            fig.update_layout(title={"text": model, "x": 0.5, "y": 0.98})
            inner += chart(fig)
        secs.append(("phases", "Phases per framework and mode",
                     inner + note("Wall-time phases of the profiled steps (mean over ranks); "
                                  "they sum to the step.")))
    r = plotdata.bench_ratios(b)
    if len(r):
        fig = Fig(_bar(
            y=[f"{lab}<br>{pair}" for lab, pair in zip(r["label"], r["pair"], strict=True)],
            x=r["ratio"], orientation="h", marker={"color": palette.SERIES[0]},
            text=[f"{x:.2f}x" for x in r["ratio"]], textposition="outside",
            customdata=np.stack([r["slower"], r["faster"], r["slower_ms"], r["faster_ms"]],
                                axis=1),
            hovertemplate="%{customdata[0]} %{customdata[2]:.3f} ms / %{customdata[1]} "
                          "%{customdata[3]:.3f} ms = %{x:.2f}x<extra></extra>"))
        _layout(fig, 140 + 40 * len(r), "slower / faster framework (host ms per step)")
        fig.update_yaxes(type="category", autorange="reversed")
        fig.update_xaxes(range=[0, float(r["ratio"].max()) * 1.15])
        fig.update_layout(margin={"l": 230, "r": 30, "t": 40, "b": 50})
        secs.append(("ops", "Cross-framework operator ratios",
                     chart(fig) + table(b.ratios, RATIO_COLUMNS)))
    sp = plotdata.bench_speedup(b)
    if len(sp):
        fig = Fig()
        nmax = int(sp["workers"].max())
        fig.add_trace(_scatter(x=[1, nmax], y=[1, nmax], mode="lines", name="ideal",
                               line={"color": "#999999", "dash": "dot"}))
        for i, ((fw, model, mode), g) in enumerate(sp.groupby(["fw", "model", "mode"],
                                                              sort=False)):
            c = palette.framework_color(str(fw), i)
            nm = f"{fw} {mode} · {model}"
            fig.add_trace(_scatter(x=g["workers"], y=g["measured"], mode="lines+markers",
                                   name=f"{nm} measured", line={"color": c},
                                   hovertemplate="%{x} workers: %{y:.2f}x<extra>"
                                                 f"{nm} measured</extra>"))
            if g["predicted"].iloc[1:].notna().any():
                fig.add_trace(_scatter(
                    x=g["workers"], y=g["predicted"], mode="lines+markers",
                    name=f"{nm} predicted", line={"color": c, "dash": "dash"},
                    marker={"symbol": "square-open", "size": 9},
                    hovertemplate="%{x} workers: %{y:.2f}x<extra>" + f"{nm} predicted</extra>"))
        _layout(fig, 420, "workers", "speed-up N · step(1) / step(N)")
        fig.update_layout(legend={"orientation": "v", "x": 1.02, "y": 1, "yanchor": "top"})
        fig.update_xaxes(tickvals=[int(n) for n in sorted(sp["workers"].unique())])
        secs.append(("scaling", "Speed-up vs workers",
                     chart(fig) + note("Measured on the profiled steps, and predicted by "
                                       "`opprof model` from the same framework and model's "
                                       "1-worker run.")))
    curves = plotdata.bench_curves(b)
    if len(curves):
        secs.append(("convergence", "Convergence: loss and test accuracy",
                     chart(convergence_figure(curves)) + note(
                         "Per framework × workers × mode (`bench --converge`); with --repeat "
                         "one line per repetition (their spread). Time is training time: the "
                         "steps' durations, without evaluations and the profiler's start and "
                         "stop.")))
    mem = plotdata.bench_memory(b)
    if len(mem):
        fig = Fig()
        for i, s in enumerate(c for c in mem.columns if c != "label"):
            fig.add_trace(_bar(x=mem["label"], y=mem[s], name=s,
                               marker={"color": palette.MEMORY_COLORS.get(
                                   s, palette.series_color(i))},
                               hovertemplate=f"{s}: %{{y:,.1f}} MiB<extra>%{{x}}</extra>"))
        _memory_axis(fig, mem.drop(columns=["label"]), 400)
        secs.append(("memory", "Memory per run", chart(fig)))
    # The run matrix sets fw, model, workers and mode per run; the rest is common to all.
    common = {k: v for k, v in b.config.items() if k not in ("workers", "mode", "command")}
    secs.append(("config", "Configuration (common to every run)", meta_table(common)))
    fws = sorted({str(x) for x in b.table.get("fw", [])})
    models = sorted({str(x) for x in b.table.get("model", [])})
    return page("opprof bench", f"{', '.join(fws)}  ·  {', '.join(models)}  ·  "
                f"{len(b.table)} run(s)", secs)
