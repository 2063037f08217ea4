"""HTML tables for notebooks: what the ``_repr_html_`` of a summary, the findings, the history and a run show.

Every cell, caption and footer line is text and is escaped here, once: a module name or a message holding
``<`` or ``&`` shows as written and never becomes markup. The tables carry no style sheet (the notebook's
own table style applies); only numbers are right-aligned and marked rows coloured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape

SEVERITY_COLORS = {"info": "#0b7285", "warning": "#b35c00", "error": "#c92a2a"}


def html_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    numeric: Iterable[int] = (),
    colors: Mapping[int, str] | None = None,
    caption: str = "",
    footer: Iterable[str] = (),
) -> str:
    """A ``<table>`` of ``rows`` under ``columns``: the columns at the indexes ``numeric`` right-aligned,
    the row at index ``i`` of ``colors`` in that CSS colour, ``caption`` above and each ``footer`` line
    below, every text escaped."""
    right = set(numeric)
    colors = colors or {}
    head = "".join(f"<th{_align(i, right)}>{escape(c)}</th>" for i, c in enumerate(columns))
    body = "".join(_row(cells, right, colors.get(i)) for i, cells in enumerate(rows))
    title = f'<caption style="text-align:left">{escape(caption)}</caption>' if caption else ""
    lines = "".join(f"<div>{escape(line)}</div>" for line in footer)
    return f"<div><table>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{lines}</div>"


def _row(cells: Sequence[object], right: set[int], color: str | None) -> str:
    style = f' style="color:{escape(color)}"' if color else ""
    tds = "".join(f"<td{_align(i, right)}>{escape(str(cell))}</td>" for i, cell in enumerate(cells))
    return f"<tr{style}>{tds}</tr>"


def _align(index: int, right: set[int]) -> str:
    return ' style="text-align:right"' if index in right else ' style="text-align:left"'
