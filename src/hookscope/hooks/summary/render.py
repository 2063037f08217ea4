"""How a summary's table is laid out: in a terminal (rich), as plain text and as HTML for a notebook.

What the table says (its title, cells and totals) is the summary's own (:meth:`Summary.table
<hookscope.hooks.summary.result.Summary.table>`); this module only lays a :class:`Table` out, so it needs
nothing from the summary's module.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookscope.html_table import html_table

if TYPE_CHECKING:
    from rich.console import Group

COLUMNS = ("Layer (type)", "Input shape", "Output shape", "Param #", "MACs")
NUMERIC = (3, 4)  # right-aligned columns


@dataclass(frozen=True)
class Table:
    """A summary ready to lay out: one tuple of :data:`COLUMNS` cells per row (``failed``: the indexes of
    rows shown in red) and the total lines under it."""

    title: str
    rows: list[tuple[str, ...]]
    failed: frozenset[int]
    totals: list[str]


def renderable(table: Table) -> Group:
    """The table and the totals under it, for rich to print (what ``Summary.__rich__`` returns)."""
    from rich import box  # rich loads when a summary is printed, not with hookscope
    from rich.console import Group
    from rich.table import Table as RichTable
    from rich.text import Text

    shown = RichTable(title=table.title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, column in enumerate(COLUMNS):
        shown.add_column(column, justify="right" if i in NUMERIC else "left")
    for i, cells in enumerate(table.rows):
        shown.add_row(*cells, style="red" if i in table.failed else None)
    return Group(shown, Text("\n".join(table.totals)))


def plain_text(table: Table) -> str:
    """The printed table without colour or trailing spaces (``str(summary)``), for logs and text files."""
    from rich.console import Console

    buffer = io.StringIO()
    # Wide enough that rows never wrap: the table itself is only as wide as its content. Never Jupyter's
    # display: in a notebook rich would show the table there and leave the text (summary.txt) empty.
    console = Console(file=buffer, width=1000, color_system=None, force_terminal=False, force_jupyter=False)
    console.print(renderable(table))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def html(table: Table) -> str:
    """The table as HTML (``Summary._repr_html_``); the depth indent of each name kept as non-breaking
    spaces, which HTML does not collapse."""
    rows = [(_keep_indent(cells[0]), *cells[1:]) for cells in table.rows]
    colors = dict.fromkeys(table.failed, "#c92a2a")
    return html_table(COLUMNS, rows, numeric=NUMERIC, colors=colors, caption=table.title, footer=table.totals)


def format_shapes(shapes: Sequence[Sequence[int]], limit: int = 3) -> str:
    """``[1, 3, 224, 224], [1, 10]``: the first ``limit`` shapes, so a call of many tensors stays one line."""
    shown = ", ".join(str(list(s)) for s in shapes[:limit])
    return shown + (f", … (+{len(shapes) - limit})" if len(shapes) > limit else "")


def human(n: int, unit: str = "") -> str:
    """``3.66 G``, ``87.19 MB``, ``96``: decimal prefixes, as torchinfo prints them."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n} {unit}".rstrip()


def _keep_indent(text: str) -> str:
    stripped = text.lstrip(" ")
    return "\u00a0" * (len(text) - len(stripped)) + stripped
