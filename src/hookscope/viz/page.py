"""What every page hookscope writes as one self-contained HTML file shares (``report.html``,
``compare.html``, the feature-map ``index.html``): the page around a body and its style sheet, sections,
tables, figures embedded as ``data:`` URIs, severity badges, and how a value reads. Text goes through
``html.escape`` before it reaches a cell; the charts' script and style come from
:func:`hookscope.viz.charts.page_head`.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# the style sheet of every page (the charts add theirs through page_head)
STYLE = """
:root { --ink: #1f2933; --muted: #616e7c; --line: #d9dee4; --panel: #f5f7fa; --accent: #2f6fde; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1120px; margin: 0 auto; padding: 28px 28px 60px; }
header h1 { margin: 0 0 4px; font-size: 26px; }
header p { margin: 0; color: var(--muted); }
h2 { margin: 36px 0 6px; font-size: 20px; border-bottom: 2px solid var(--line); padding-bottom: 4px; }
.lead { color: var(--muted); margin: 0 0 12px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(165px, 1fr)); gap: 10px;
         margin-top: 18px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .k { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.card .v { font-size: 19px; font-weight: 600; overflow-wrap: anywhere; }
.figs { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 14px; }
figure.wide { grid-column: 1 / -1; }
figure { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px; }
figure img { width: 100%; height: auto; display: block; }
.stopped { margin: 8px 0 0; padding: 8px 12px; border-left: 4px solid #c0392b; background: #fdf1f0; }
figcaption { font-size: 13px; color: var(--muted); margin-top: 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; }
th, td { text-align: left; padding: 5px 9px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--panel); position: sticky; top: 0; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
.scroll { max-height: 560px; overflow: auto; border: 1px solid var(--line); border-radius: 8px; }
.sev { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
       color: #fff; }
.sev-error, .sev-critical { background: #c62828; } .sev-warning { background: #e08a00; }
.sev-info { background: #2f6fde; } .sev-ok { background: #2e7d32; }
.note { color: var(--muted); font-style: italic; }
code { background: var(--panel); padding: 0 4px; border-radius: 4px; }
details summary { cursor: pointer; color: var(--accent); margin: 8px 0; }
pre { background: var(--panel); padding: 10px; border-radius: 8px; overflow: auto; font-size: 12.5px; }
"""


def page_html(title: str, body: str, head: str = "") -> str:
    """The page around ``body``; ``head``: more of the head (the charts' style and script)."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n{head}</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def figure_html(png: bytes, caption: str, wide: bool = False) -> str:
    """A figure with its caption, the PNG inline as a ``data:`` URI (the page needs no other file);
    ``wide``: it takes the whole row of a ``figs`` grid."""
    data = base64.b64encode(png).decode("ascii")
    wide_class = ' class="wide"' if wide else ""
    return (
        f'<figure{wide_class}><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """A matplotlib figure rendered as PNG, in memory, for :func:`figure_html`."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def section_html(title: str, lead: str, body: str) -> str:
    """A section of the page: ``title`` as its heading, ``lead`` (plain text, optional) under it, then
    ``body`` (HTML)."""
    lead_html = f'<p class="lead">{html.escape(lead)}</p>' if lead else ""
    return f"<section><h2>{html.escape(title)}</h2>{lead_html}{body}</section>"


def table_html(columns: list[str], rows: list[list[str]], numeric: set[int], table_id: str) -> str:
    """A scrolling table: ``columns`` (plain text; ``_`` read as spaces), ``rows`` of HTML cells (escape
    text first), the columns at the indices in ``numeric`` right-aligned."""
    head = "".join(
        f'<th class="num">{html.escape(c.replace("_", " "))}</th>'
        if i in numeric
        else f"<th>{html.escape(c.replace('_', ' '))}</th>"
        for i, c in enumerate(columns)
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return (
        f'<div class="scroll"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def format_value(value: Any) -> str:
    """A value as a page shows it (plain text, to escape): ``—`` for None, thousands separators, 4
    significant digits, a shape as ``3×32×32``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "×".join(str(v) for v in value) if all(isinstance(v, int) for v in value) else str(value)
    return str(value)


def severity_badge(finding: dict[str, Any]) -> str:
    """The finding's severity as a coloured badge."""
    severity = str(finding.get("severity", "info"))
    return f'<span class="sev sev-{html.escape(severity.lower())}">{html.escape(severity)}</span>'


def finding_layer(finding: dict[str, Any]) -> str:
    """The layer a finding (a row of findings.json or preflight.json) names, or ``""``."""
    return finding.get("layer") or finding.get("module") or finding.get("name") or ""
