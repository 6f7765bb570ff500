"""One self-contained HTML page: inline CSS, inline SVG charts, a small inline script
that makes tables sortable. Nothing is fetched: the file opens offline.

A page is a list of :class:`Section` (title + HTML); each job's ``report.py`` builds its
sections from these blocks (``table``, ``cards``, ``figure``, ...), and the report
package puts them on a page (``report/job_sections.py``). The blocks know no job:
``.advice`` cards are styled here, drawn by ``report``.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import polars as pl

_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass
class Section:
    """A titled block of HTML; ``id`` defaults to a slug of the title."""

    title: str
    html: str
    id: str | None = None

    @property
    def anchor(self) -> str:
        return self.id or _SLUG.sub("-", self.title.lower()).strip("-") or "section"


CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#e2e6ee; --bg:#ffffff; --soft:#f5f7fb;
        --high:#c0392b; --medium:#d68910; --low:#2e86c1; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color:var(--fg); background:var(--bg); }
header { padding:18px 28px 10px; border-bottom:1px solid var(--line); background:var(--soft); }
header h1 { margin:0 0 4px; font-size:20px; }
header .sub { color:var(--muted); }
nav { padding:6px 28px; border-bottom:1px solid var(--line); font-size:13px; }
nav a { margin-right:14px; color:var(--low); text-decoration:none; }
main { padding:8px 28px 40px; max-width:1250px; }
section { margin-top:22px; }
h2 { font-size:17px; border-bottom:1px solid var(--line); padding-bottom:4px; }
h3 { font-size:14px; margin:16px 0 6px; }
.cards { display:flex; flex-wrap:wrap; gap:10px; margin:12px 0; }
.card { background:var(--soft); border:1px solid var(--line); border-radius:6px; padding:8px 12px; min-width:150px; }
.card .k { color:var(--muted); font-size:12px; } .card .v { font-size:17px; font-weight:600; }
.note { background:#fff8e1; border:1px solid #f3d98b; border-radius:6px; padding:8px 12px; margin:8px 0; }
figure { margin:10px 0 16px; } figure svg { max-width:100%; height:auto; }
figcaption { color:var(--muted); font-size:12px; }
.tbl { overflow-x:auto; max-width:100%; }
table { border-collapse:collapse; margin:6px 0 14px; font-size:12.5px; }
th, td { border-bottom:1px solid var(--line); padding:3px 9px; text-align:left; vertical-align:top; }
td.num, th.num { text-align:right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor:pointer; user-select:none; background:var(--soft); }
table.sortable th[aria-sort=ascending]::after { content:" \\25B2"; font-size:10px; }
table.sortable th[aria-sort=descending]::after { content:" \\25BC"; font-size:10px; }
.more { color:var(--muted); font-size:12px; }
.advice { border:1px solid var(--line); border-left:5px solid var(--low); border-radius:6px;
          padding:8px 12px; margin:10px 0; }
.advice.high { border-left-color:var(--high); } .advice.medium { border-left-color:var(--medium); }
.advice .head { font-weight:600; } .advice .gain { float:right; color:var(--muted); }
.advice .ev { color:var(--muted); margin:4px 0; } .advice code { font-size:12px; }
.sev { text-transform:uppercase; font-size:11px; padding:1px 6px; border-radius:3px; color:#fff;
       background:var(--low); margin-right:6px; }
.sev.high { background:var(--high); } .sev.medium { background:var(--medium); }
footer { color:var(--muted); font-size:12px; padding:16px 28px; border-top:1px solid var(--line); }
code { background:var(--soft); padding:0 3px; border-radius:3px; }
"""

SCRIPT = """
(function () {
  var body = document.body;
  window.addEventListener('error', function () { body.setAttribute('data-js-error', '1'); });
  var consoleError = console.error;
  console.error = function () {
    body.setAttribute('data-console-error', '1');
    return consoleError.apply(console, arguments);
  };
  function value(cell) {
    var v = cell.getAttribute('data-v');
    if (v !== null && v !== '') { var n = parseFloat(v); if (!isNaN(n)) return n; }
    return cell.textContent.trim().toLowerCase();
  }
  function sortTable(table, index, th) {
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    var descending = th.getAttribute('aria-sort') !== 'descending';
    rows.sort(function (a, b) {
      var x = value(a.cells[index]), y = value(b.cells[index]);
      if (typeof x === 'number' && typeof y !== 'number') return -1;
      if (typeof y === 'number' && typeof x !== 'number') return 1;
      var c = x < y ? -1 : x > y ? 1 : 0;
      return descending ? -c : c;
    });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', descending ? 'descending' : 'ascending');
    rows.forEach(function (r) { tbody.appendChild(r); });
  }
  var tables = document.querySelectorAll('table.sortable');
  Array.prototype.forEach.call(tables, function (table) {
    var head = table.tHead ? table.tHead.rows[0] : null;
    if (!head) return;
    Array.prototype.forEach.call(head.cells, function (th, i) {
      th.setAttribute('title', 'sort');
      th.addEventListener('click', function () { sortTable(table, i, th); });
    });
  });
  body.setAttribute('data-sortable-tables', String(tables.length));
  body.setAttribute('data-charts', String(document.querySelectorAll('svg.chart').length));
  body.setAttribute('data-ready', '1');
})();
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any) -> tuple[str, str | None, bool]:
    """Display text, sort value and whether the cell is numeric."""
    if value is None:
        return "", None, False
    if isinstance(value, bool):
        return ("yes" if value else "no"), None, False
    if isinstance(value, int):
        return f"{value:,}", str(value), True
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value), None, True
        a = abs(value)
        text = f"{value:,.0f}" if a >= 1000 else f"{value:.2f}" if a >= 10 else f"{value:.3f}" if a >= 0.01 else f"{value:.2g}"
        return text, repr(value), True
    return str(value), None, False


def table(
    df: pl.DataFrame,
    columns: Sequence[str] | None = None,
    max_rows: int = 100,
    headers: dict[str, str] | None = None,
) -> str:
    """A sortable HTML table of the first ``max_rows`` rows."""
    cols = [c for c in (columns or df.columns) if c in df.columns]
    if df.height == 0 or not cols:
        return '<p class="more">(nothing to show)</p>'
    headers = headers or {}
    rows = df.select(cols).head(max_rows).rows()
    numeric = [df.schema[c].is_numeric() for c in cols]
    out = ['<div class="tbl"><table class="sortable"><thead><tr>']
    out += [f'<th{" class=num" if n else ""}>{esc(headers.get(c, c))}</th>' for c, n in zip(cols, numeric)]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for v in row:
            text, sort, is_num = _fmt(v)
            attrs = (' class="num"' if is_num else "") + (f' data-v="{esc(sort)}"' if sort is not None else "")
            out.append(f"<td{attrs}>{esc(text)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    if df.height > max_rows:
        out.append(f'<p class="more">showing {max_rows} of {df.height:,} rows</p>')
    return "".join(out)


def titled_table(title: str, df: pl.DataFrame, columns: Sequence[str] | None = None, **options: Any) -> str:
    """An ``<h3>`` heading, then :func:`table` of ``df`` (``options``: its ``max_rows``, ``headers``)."""
    return f"<h3>{esc(title)}</h3>" + table(df, columns, **options)


def key_values(items: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of labels and values (lists and dicts flattened to text)."""
    out = ["<table><tbody>"]
    for k, v in items:
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "(none)"
        elif isinstance(v, (list, tuple)):
            v = ", ".join(str(x) for x in v) or "(none)"
        out.append(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def cards(items: Iterable[tuple[str, str]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>' for k, v in items
    ) + "</div>"


def figure(svg: str | None, caption: str = "") -> str:
    if not svg:
        return ""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure>{svg}{cap}</figure>"


def page(title: str, subtitle: str, sections: Sequence[Section], footer: str = "") -> str:
    """The complete HTML document."""
    from .. import __version__

    nav = "".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in sections)
    body = "".join(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>{s.html}</section>' for s in sections)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><div class=\"sub\">{esc(subtitle)}</div></header>"
        f"<nav>{nav}</nav><main>{body}</main>"
        f"<footer>Generated by ProfileDNN {esc(__version__)} on {stamp}. {esc(footer)}</footer>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
