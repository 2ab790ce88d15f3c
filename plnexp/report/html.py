"""``report.html``: the report a person reads, one self-contained file (no script, no link to fetch).

The verdict first (the plain headline: :mod:`plnexp.report.headline`), then one compact table per
group (:mod:`plnexp.report.table`: at most ten columns, one speed convention, fastest first as the
verdict ranks them), then the figures, inline as base64 PNGs, then the notes and the glossary.
MLflow's artifact viewer shows it (an ``.html`` artifact is rendered in a frame), and a browser
opens it from disk. report.md and report.csv stay beside it for tools.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from . import table

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em;
color:#1a1a1a;line-height:1.4}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
.verdict{background:#f3f6fa;border-left:4px solid #2b6cb0;padding:.6em 1em}
.verdict li{margin:.2em 0}.verdict li.first{font-weight:600}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.92em;display:block;overflow-x:auto;max-width:100%}
th,td{border-bottom:1px solid #ddd;padding:.25em .6em;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left;white-space:normal;min-width:9em}th{background:#fafafa}
td.faster{color:#1f7a1f;font-weight:600}td.slower{color:#a33}td.unresolved{color:#a66b00}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.small{font-size:.85em;color:#444}
"""


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _table(report, group) -> str:
    head = table.head(report, group)
    verdict = head.index("verdict") if "verdict" in head else -1
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for r in table.rows(report, group):
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


def page(report, headline: list[str], images: list[str], folder: Path, notes: list[str], glossary: list[str]) -> str:
    """The whole page. ``headline``: the summary's lines (the verdict first); ``images``: the PNGs
    written into ``folder``, inlined; ``notes``, ``glossary``: plain lines (blank ones dropped)."""
    p = report.parent
    items = "\n".join(
        f'<li class="first">{_e(line)}</li>' if i == 0 else f"<li>{_e(line)}</li>" for i, line in enumerate(headline)
    )
    body = [
        f"<h1>Sweep {_e(p.sweep or '?')} ({_e(report.experiment)})</h1>",
        f'<p class="small">Parent run <code>{_e(p.run_id)}</code> ({_e(p.status)}); command '
        f"<code>python -m plnexp {_e(p.command or 'sweep')}</code>; {len(report.entries)} runs.</p>",
        "<h2>Verdict</h2>",
        f'<ul class="verdict">{items}</ul>',
        "<h2>Strategies, fastest first</h2>",
        '<p class="small">Every ratio is time ÷ the reference\'s (below 1: faster). report.csv beside this file '
        "holds every figure of every run.</p>",
    ]
    for group in report.groups:
        body += [f"<h3>{_e(report.group_label(group))}</h3>", _table(report, group)]
    if images:
        body.append("<h2>Figures</h2>")
        body += [_image(folder, name) for name in images]
    if notes:
        body += ["<h2>Notes</h2>", "<ul class='small'>", *[f"<li>{_e(n)}</li>" for n in notes], "</ul>"]
    body += ["<h2>Glossary</h2>", *[f'<p class="small">{_e(g)}</p>' for g in glossary if g]]
    title = f"plnexp: sweep {p.sweep or '?'} ({report.experiment})"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
