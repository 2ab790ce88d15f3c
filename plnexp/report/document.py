"""report.md and report.html, rendered from one document: a list of blocks (headings, paragraphs,
lists, the compact tables, the figures) that :func:`plnexp.report.summary.document` builds.

``report.html`` is the report a person reads, one self-contained file (no script, no link to fetch):
the verdict first (the plain headline: :mod:`plnexp.report.headline`), then one compact table per
group (:mod:`plnexp.report.table`: at most ten columns, one speed convention, fastest first as the
verdict ranks them), then the notes, then the figures, inline as base64 PNGs, then the glossary.
MLflow's artifact viewer shows it (an ``.html`` artifact is rendered in a frame), and a browser
opens it from disk. ``report.md`` holds the same and the sections for tools (the compiled programs,
the precisions, convergence, rank selection); report.csv stays beside them.

A block is a tuple whose first item names its kind:

- ``("h", level, text[, page_text])``: a heading (``page_text``: the page's wording where it differs);
- ``("p", text)``: a paragraph (```code``` in backticks);
- ``("ul", items, cls)``: a list; ``cls`` its class on the page (``verdict``: its first item stands out);
- ``("table", label, head, rows)``: a group's compact table (:mod:`plnexp.report.table`) under its label;
- ``("md", lines)``: Markdown lines the page leaves to report.md;
- ``("figures", names)``: the PNGs, linked in Markdown, inline on the page (under "Figures");
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from .entries import md_table

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em;
color:#1a1a1a;line-height:1.4}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
.verdict{background:#f3f6fa;border-left:4px solid #2b6cb0;padding:.6em 1em}
.verdict li{margin:.2em 0}.verdict li:first-child{font-weight:600}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.92em;display:block;overflow-x:auto;max-width:100%}
th,td{border-bottom:1px solid #ddd;padding:.25em .6em;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left;white-space:normal;min-width:9em}th{background:#fafafa}
td.faster{color:#1f7a1f;font-weight:600}td.slower{color:#a33}td.unresolved{color:#a66b00}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.small{font-size:.85em;color:#444}
"""


def markdown(doc: list[tuple]) -> str:
    """The document as Markdown."""
    out: list[str] = []
    for kind, *a in doc:
        if kind == "h":
            out += ["#" * a[0] + " " + a[1], ""]
        elif kind == "p":
            out += [a[0], ""]
        elif kind == "ul":
            out += [*(f"- {item}" for item in a[0]), ""]
        elif kind == "table":
            out += [f"{a[0]}:", "", *md_table(a[1], a[2]), ""]
        elif kind == "figures":
            out += [*(f"![{name}]({name})" for name in a[0]), ""]
        else:  # "md"
            out += a[0]
    return "\n".join(out) + "\n"


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _table(head: list[str], rows: list[list[str]]) -> str:
    verdict = head.index("verdict") if "verdict" in head else -1
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            cls = f' class="{_e(c)}"' if i == verdict and c in ("faster", "slower", "unresolved") else ""
            cells.append(f"<td{cls}>{_e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _image(folder: Path, name: str) -> str:
    data = base64.b64encode((folder / name).read_bytes()).decode("ascii")
    return f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{data}"><figcaption class="small">{_e(name)}</figcaption></figure>'


def page(doc: list[tuple], folder: Path) -> str:
    """The document as one HTML page; the figures' PNGs are read from ``folder`` and inlined."""
    body = []
    for kind, *a in doc:
        if kind == "h":
            body.append(f"<h{a[0]}>{_e(a[-1])}</h{a[0]}>")
        elif kind == "p":
            text = re.sub(r"`([^`]*)`", r"<code>\1</code>", _e(a[0]))
            body.append(f'<p class="small">{text}</p>')
        elif kind == "ul":
            body.append(f'<ul class="{a[1]}">' + "\n".join(f"<li>{_e(item)}</li>" for item in a[0]) + "</ul>")
        elif kind == "table":
            body += [f"<h3>{_e(a[0])}</h3>", _table(a[1], a[2])]
        elif kind == "figures" and a[0]:
            body += ["<h2>Figures</h2>", *(_image(folder, name) for name in a[0])]
    title = f"plnexp: {doc[0][2]}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
