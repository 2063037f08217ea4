"""How a :class:`~hookscope.hooks.summary.result.Summary` prints: a table of module calls, then the totals."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Group
    from rich.table import Table

    from hookscope.hooks.summary.result import Shape, Summary, SummaryRow


def renderable(summary: Summary) -> Group:
    """The table and the totals under it, for rich to print (what ``Summary.__rich__`` returns)."""
    from rich.console import Group  # rich loads when a summary is printed, not with hookscope
    from rich.text import Text

    return Group(_table(summary), Text("\n".join(_totals(summary))))


def plain_text(summary: Summary) -> str:
    """The printed table without colour or trailing spaces (``str(summary)``), for logs and text files."""
    from rich.console import Console

    buffer = io.StringIO()
    # Wide enough that rows never wrap: the table itself is only as wide as its content.
    console = Console(file=buffer, width=1000, color_system=None, force_terminal=False)
    console.print(renderable(summary))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def format_shapes(shapes: list[Shape], limit: int = 3) -> str:
    """``[1, 3, 224, 224], [1, 10]``: the first ``limit`` shapes, so a call of many tensors stays one line."""
    shown = ", ".join(str(list(s)) for s in shapes[:limit])
    return shown + (f", … (+{len(shapes) - limit})" if len(shapes) > limit else "")


def human(n: int, unit: str = "") -> str:
    """``3.66 G``, ``87.19 MB``, ``96``: decimal prefixes, as torchinfo prints them."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n} {unit}".rstrip()


def _table(summary: Summary) -> Table:
    from rich import box
    from rich.table import Table

    partial = " (partial: the forward failed)" if summary.failed_module is not None else ""
    title = f"{summary.model_type} summary{partial}"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("Layer (type)")
    table.add_column("Input shape")
    table.add_column("Output shape")
    table.add_column("Param #", justify="right")
    table.add_column("MACs", justify="right")
    for row in summary.rows:
        table.add_row(*_cells(row), style="red" if row.failed else None)
    return table


def _totals(summary: Summary) -> list[str]:
    lines = [
        f"Total params: {summary.total_params:,}",
        f"Trainable params: {summary.trainable_params:,}",
        f"Non-trainable params: {summary.non_trainable_params:,}",
        f"Total MACs: {human(summary.total_macs)}",
        f"Params size: {human(summary.param_bytes, 'B')}",
        f"Buffers: {summary.buffer_elements:,} elements, {human(summary.buffer_bytes, 'B')}",
        f"Input size: {human(summary.input_bytes, 'B')}",
        f"Forward activations (estimate): {human(summary.activation_bytes, 'B')}",
    ]
    if summary.failed_module is not None:
        where = repr(summary.failed_module) if summary.failed_module else "the model's own forward"
        lines.append(f"Forward failed in: {where}")
    lines.extend(f"Note: {note}" for note in summary.notes)
    return lines


def _cells(row: SummaryRow) -> tuple[str, str, str, str, str]:
    label = row.name or "(model)"
    layer = f"{'  ' * row.depth}{label} ({row.type})"
    if row.call:
        layer += f" · call {row.call + 1}"
    output = "✗ failed" if row.failed else format_shapes(row.output_shapes) or "--"
    params = "(reused)" if row.call else f"{row.params:,}" if row.params else "--"
    macs = human(row.macs) if row.macs else "--"
    return layer, format_shapes(row.input_shapes) or "--", output, params, macs
